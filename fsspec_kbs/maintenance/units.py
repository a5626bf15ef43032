"""Durations and sizes as users type them (``7d``, ``12h``, ``500ms``; ``10GiB``, ``500MB``)."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000,
                   "w": 604_800_000}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_duration(value: str | int | float | timedelta) -> int:
    """Milliseconds from ``timedelta``, a number (ms) or text like ``7d``, ``1h30m``, ``250ms``, ``2w``."""
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool):
        raise TypeError("a duration cannot be a bool")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"negative duration {value}")
        return int(value)
    text = value.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+", text):
        return int(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d|w)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"cannot read {value!r} as a duration: use e.g. 7d, 12h, 30m, 10s, 500ms or plain ms")
    return int(sum(float(n) * _DURATION_UNITS[u] for n, u in parts))


def parse_size(value: str | int) -> int:
    """Bytes from a number or text like ``10GiB``, ``500MB``, ``64k`` (k/M/G = 1000s, KiB/MiB/GiB = 1024s)."""
    if isinstance(value, bool):
        raise TypeError("a size cannot be a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"negative size {value}")
        return value
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value.strip().lower())
    if not m or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f"cannot read {value!r} as a size: use e.g. 1073741824, 500MB, 10GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
