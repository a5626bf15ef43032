"""Times as people type them (CLI options, API filters), to Unix milliseconds (UTC).

Accepted (case-insensitive, surrounding spaces ignored):

* Unix milliseconds: ``1762000000000`` (digits; a leading ``-`` is a relative time, below).
* ISO 8601: ``2026-11-01``, ``2026-11-01T12:00``, ``2026-11-01 12:00:00.250``,
  ``2026-11-01T12:00:00Z``, ``2026-11-01T12:00:00+02:00``. Without an offset it is UTC.
* Relative to now: ``-2h``, ``-1d12h``, ``-90m``, ``-30s``, ``-1w`` (``ms s m min h d w``);
  ``2h ago``, ``3 days ago``; ``now``, ``now-2h``, ``now+15m``.
* Calendar words (midnight UTC): ``today``, ``yesterday``, ``tomorrow``.

Anything else is an error saying what is accepted. No guessing of ``01/02/2026``-style dates:
a time bound that is silently wrong selects the wrong records.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

ACCEPTED = "Unix ms, ISO 8601 (2026-11-01T12:00Z; UTC if no offset), -2h, '3 days ago', now-30m, today, yesterday"

_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000, "minute": 60_000,
             "h": 3_600_000, "hour": 3_600_000, "d": 86_400_000, "day": 86_400_000,
             "w": 604_800_000, "week": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|seconds?|secs?|s|minutes?|mins?|m|hours?|h|days?|d|weeks?|w)")


def _duration_ms(text: str) -> int | None:
    """``1d12h`` / ``90 m`` / ``2 hours`` as ms, or None if ``text`` is not only such parts."""
    text = text.strip()
    parts = list(_PART.finditer(text))
    if not parts or re.sub(r"\s+", "", "".join(p.group(0) for p in parts)) != re.sub(r"\s+", "", text):
        return None
    total = 0.0
    for p in parts:
        unit = p.group(2)
        unit = unit if unit in _UNITS_MS else unit.rstrip("s")
        total += float(p.group(1)) * _UNITS_MS[unit]
    return int(total)


def _midnight(now_ms: int, days: int) -> int:
    day = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc).date() + timedelta(days=days)
    return int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp() * 1000)


def parse_time(value: str | int, now_ms: int | None = None) -> int:
    """Unix ms (UTC) from the forms in the module docstring; ValueError naming them otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if re.fullmatch(r"\d+", text):
        return int(text)
    words = {"now": now, "today": _midnight(now, 0), "yesterday": _midnight(now, -1),
             "tomorrow": _midnight(now, 1)}
    if text in words:
        return words[text]
    m = re.fullmatch(r"now\s*([+-])\s*(.+)", text)
    if m and (d := _duration_ms(m.group(2))) is not None:
        return now + d if m.group(1) == "+" else now - d
    m = re.fullmatch(r"-\s*(.+)", text)
    if m and (d := _duration_ms(m.group(1))) is not None:
        return now - d
    m = re.fullmatch(r"(.+?)\s+ago", text)
    if m and (d := _duration_ms(m.group(1))) is not None:
        return now - d
    iso = str(value).strip()
    if re.match(r"\d{4}-\d{2}-\d{2}", iso):
        try:
            dt = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", iso))
        except ValueError:
            dt = None
        if dt is not None:
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return int(dt.timestamp() * 1000)
    raise ValueError(f"cannot read {value!r} as a time; use {ACCEPTED}")
