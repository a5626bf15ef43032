"""Shared helpers (no tests) of the ``kbs://`` filesystem tests in tests/fs/."""

from __future__ import annotations

import base64
import json

import pyarrow as pa

from fsspec_kbs.arrow.schema import HEADER_TYPE


def sample_table(n: int = 1500, partitions: int = 3, topic: str = "orders") -> pa.Table:
    """Records of ``topic`` spread over ``partitions`` with explicit, gapped offsets.

    Null keys, null values, null header values and timestamps that go backwards are included,
    as in the conformance vectors.
    """
    parts = [i % partitions for i in range(n)]
    seen: dict[int, int] = {}
    offsets = []
    for p in parts:
        seen[p] = seen.get(p, -1) + 1
        offsets.append(seen[p] * 2 + (p % 2))  # gaps, different per partition
    return pa.table({
        "topic": [topic] * n,
        "partition": pa.array(parts, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "key": [None if i % 7 == 0 else f"user-{i % 50}".encode() for i in range(n)],
        "value": [None if i % 11 == 0 else (f"v{i}-".encode() * (i % 40)) for i in range(n)],
        "timestamp": pa.array([1_700_000_000_000 + (i * 37) % 5000 - 2500 for i in range(n)],
                              pa.timestamp("ms", tz="UTC")),
        "headers": pa.array(
            [[{"key": "trace", "value": str(i).encode()}, {"key": "n\u00e9", "value": None}] if i % 5 == 0 else []
             for i in range(n)], pa.list_(HEADER_TYPE)),
    })


def expected_jsonl(table: pa.Table, topic: str, partition: int) -> str:
    """The ``kbs cat`` / expected.jsonl form of the rows of one partition, via ``json.dumps``."""

    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode("ascii")

    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    rows = []
    for i, r in enumerate(table.to_pylist()):
        if r["topic"] != topic or r["partition"] != partition:
            continue
        rows.append({"topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "timestamp": ts[i],
                     "key": b64(r["key"]), "value": b64(r["value"]),
                     "headers": [[h["key"], b64(h["value"])] for h in r["headers"] or []]})
    rows.sort(key=lambda r: r["offset"])
    return "".join(json.dumps(r) + "\n" for r in rows)
