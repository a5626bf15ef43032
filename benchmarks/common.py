"""Shared helpers of the benchmarks: realistic records, timing, machine facts, JSON results."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fsspec_kbs.format import RecordColumns

RESULTS = Path(__file__).resolve().parent / "results"
MB = 1e6

_WORDS = (b"user order id amount status created updated true false EUR USD shipped pending "
          b"customer item sku price quantity address city country email session page click view "
          b"event source version name type value region warehouse").split()


def _text_pool(rng: np.random.Generator, size: int) -> bytes:
    """JSON-like text (field names, words, numbers): compresses about like real event payloads."""
    parts: list[bytes] = [b"{"]
    total = 1
    while total < size:
        w1 = _WORDS[int(rng.integers(len(_WORDS)))]
        w2 = _WORDS[int(rng.integers(len(_WORDS)))]
        piece = b'"%s":"%s-%d",' % (w1, w2, int(rng.integers(1_000_000_000)))
        parts.append(piece)
        total += len(piece)
    return b"".join(parts)[:size]


def make_columns(n: int, value_min: int = 50, value_max: int = 2048, seed: int = 1,
                 header_share: float = 0.2, first_offset: int = 0) -> RecordColumns:
    """``n`` records: keys 8–40 B, values ``value_min``–``value_max`` B, ``header_share`` with headers."""
    rng = np.random.default_rng(seed)
    pool = _text_pool(rng, 8 * 1024 * 1024)
    klen = rng.integers(8, 41, n)
    vlen = rng.integers(value_min, value_max + 1, n)
    vstart = rng.integers(0, len(pool) - value_max - 1, n)
    keys = b"".join((b"key-%036d" % int(i))[: int(kl)] for i, kl in zip(rng.integers(0, 10**9, n), klen, strict=True))
    values = b"".join(pool[s : s + ln] for s, ln in zip(vstart.tolist(), vlen.tolist(), strict=True))
    has_h = rng.random(n) < header_share
    hcount = np.where(has_h, rng.integers(1, 4, n), 0)
    nh = int(hcount.sum())
    hkeys_pool = [b"trace-id", b"content-type", b"source", b"schema-version"]
    hk = [hkeys_pool[int(i)] for i in rng.integers(0, len(hkeys_pool), nh)]
    hv = [b"%032x" % int(x) for x in rng.integers(0, 2**62, nh)]

    def offs(lens: np.ndarray) -> np.ndarray:
        out = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=out[1:])
        return out

    return RecordColumns(
        offsets=np.arange(first_offset, first_offset + n, dtype=np.int64),
        timestamps=1_700_000_000_000 + np.cumsum(rng.integers(0, 5, n)).astype(np.int64),
        key_offsets=offs(klen),
        key_data=np.frombuffer(keys, dtype=np.uint8).copy(),
        key_valid=np.ones(n, dtype=np.bool_),
        value_offsets=offs(vlen),
        value_data=np.frombuffer(values, dtype=np.uint8).copy(),
        value_valid=np.ones(n, dtype=np.bool_),
        header_offsets=offs(hcount),
        header_key_offsets=offs(np.array([len(x) for x in hk], dtype=np.int64)),
        header_key_data=np.frombuffer(b"".join(hk), dtype=np.uint8).copy(),
        header_value_offsets=offs(np.array([len(x) for x in hv], dtype=np.int64)),
        header_value_data=np.frombuffer(b"".join(hv), dtype=np.uint8).copy(),
        header_value_valid=np.ones(nh, dtype=np.bool_),
    )


def records_from_columns(cols: RecordColumns) -> list[tuple[bytes, bytes, list | None, int]]:
    """``(key, value, headers, timestamp)`` per record of :func:`make_columns` output, as a
    producer takes them (every key and value present, headers as ``[(str, bytes)]`` or None)."""
    kd, vd = cols.key_data.tobytes(), cols.value_data.tobytes()
    ko, vo = cols.key_offsets.tolist(), cols.value_offsets.tolist()
    hko, hvo, ho = cols.header_key_offsets.tolist(), cols.header_value_offsets.tolist(), cols.header_offsets.tolist()
    hkd, hvd = cols.header_key_data.tobytes(), cols.header_value_data.tobytes()
    hk = [hkd[a:b].decode() for a, b in zip(hko[:-1], hko[1:], strict=True)]
    hv = [hvd[a:b] for a, b in zip(hvo[:-1], hvo[1:], strict=True)]
    out = []
    for i, ts in enumerate(cols.timestamps.tolist()):
        a, b = ho[i], ho[i + 1]
        out.append((kd[ko[i]:ko[i + 1]], vd[vo[i]:vo[i + 1]],
                    list(zip(hk[a:b], hv[a:b], strict=True)) if b > a else None, ts))
    return out


def columns_for_bytes(target_bytes: int, value_min: int = 50, value_max: int = 2048,
                      seed: int = 1) -> RecordColumns:
    """About ``target_bytes`` of record data (keys + values + headers)."""
    mean = (value_min + value_max) / 2 + 24 + 0.2 * 2 * 45 + 8
    return make_columns(max(1, int(target_bytes / mean)), value_min, value_max, seed)


def best_time(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, cpu: bool = True) -> float:
    """Fastest of ``repeat`` runs, in seconds (after ``warmup`` runs: numba compile, caches).

    ``cpu=True`` measures the process's CPU time (user + system) instead of wall time: on a
    shared machine other processes then inflate single-threaded figures much less. Use
    ``cpu=False`` (wall time) for anything multi-threaded.
    """
    clock = time.process_time if cpu else time.perf_counter
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    import lz4
    import numba
    import pyarrow
    import zstandard

    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "numba": numba.__version__,
        "pyarrow": pyarrow.__version__,
        "zstandard": zstandard.__version__,
        "lz4": lz4.__version__,
        "cramjam": version("cramjam"),  # lz4 decompression
        "fastcrc": version("fastcrc"),
        "load_avg_at_start": os.getloadavg()[0],
    }


def report(name: str, value: float, unit: str = "MB/s", ref: float | None = None,
           target: float | None = None) -> dict[str, Any]:
    """Print one figure (and its ratio to ``ref``) and return it as a JSON-able dict."""
    row: dict[str, Any] = {"name": name, "value": round(value, 3), "unit": unit}
    text = f"{name:<58} {value:10.1f} {unit}"
    if ref:
        ratio = value / ref
        row["ratio"] = round(ratio, 3)
        text += f"   ratio {ratio:6.2f}"
        if target is not None:
            row["target"] = target
            row["meets_target"] = bool(ratio >= target)
            text += f" (target >= {target:.2f}: {'ok' if ratio >= target else 'MISSED'})"
    print(text, flush=True)
    return row


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": machine(), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"-> {path}")
    return path
