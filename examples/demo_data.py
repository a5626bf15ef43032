"""Synthetic Kafka-like records for the examples: orders with keys, headers, tombstones."""

from __future__ import annotations

import json
import random

import pyarrow as pa

from fsspec_kbs.arrow.schema import HEADER_TYPE


def demo_table(n: int = 100_000, seed: int = 7) -> pa.Table:
    """``n`` records over topics ``orders`` (3 partitions) and ``payments`` (1 partition)."""
    rng = random.Random(seed)
    t0 = 1_763_900_000_000  # 2025-11-23
    topics, parts, keys, values, stamps, headers = [], [], [], [], [], []
    for i in range(n):
        topic = "orders" if i % 4 else "payments"
        topics.append(topic)
        parts.append(i % 3 if topic == "orders" else 0)
        customer = f"customer-{rng.randrange(500)}"
        keys.append(customer.encode() if i % 50 else None)
        if i % 97 == 0:
            values.append(None)  # a tombstone
        else:
            doc = {"order": i, "customer": customer, "amount": round(rng.uniform(1, 500), 2),
                   "items": rng.randrange(1, 9), "note": "x" * rng.randrange(0, 200)}
            values.append(json.dumps(doc).encode())
        stamps.append(t0 + i * 25 + rng.randrange(-400, 400))  # not monotonic, like real producers
        headers.append([{"key": "trace-id", "value": f"{rng.getrandbits(32):08x}".encode()}] if i % 5 == 0 else [])
    return pa.table({
        "topic": topics,
        "partition": pa.array(parts, pa.int32()),
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "timestamp": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
        "headers": pa.array(headers, pa.list_(HEADER_TYPE)),
    })
