"""Producing known records into the test broker and reading topics back, field by field."""

from __future__ import annotations

import random
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BASE_TS = 1_700_000_000_000


def make_records(n: int, partitions: int, seed: int = 1, base_ts: int = BASE_TS) -> list[dict]:
    """Records with every shape Kafka allows: null/empty keys and values, no/many/duplicate/null headers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else f"key-{i}".encode())
        value = None if i % 10 == 3 else (b"" if i % 13 == 0 else rng.randbytes(rng.randint(1, 300)))
        if i % 4 == 0:
            headers = None
        else:
            headers = [("h1", b"one"), ("dup", b"a"), ("dup", b"b"), ("null-v", None), ("bin", rng.randbytes(5))][: i % 6]
            headers = headers or None
        out.append({"partition": i % partitions, "key": key, "value": value, "headers": headers,
                    "timestamp": base_ts + i * 10})
    return out


def create_topic(conf: dict, topic: str, partitions: int) -> None:
    admin = AdminClient(conf)
    for f in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        f.result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not ready")


def produce(conf: dict, topic: str, records: list[dict]) -> list[dict]:
    """Produce in order; returns the records with their assigned ``offset``."""
    p = Producer({**conf, "enable.idempotence": True, "linger.ms": 5})
    done: dict[int, int] = {}

    def cb(i: int):
        def f(err, msg):
            assert err is None, err
            done[i] = msg.offset()
        return f

    for i, r in enumerate(records):
        p.produce(topic, r["value"], r["key"], r["partition"], timestamp=r["timestamp"], headers=r["headers"],
                  on_delivery=cb(i))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return [{**r, "offset": done[i], "topic": topic} for i, r in enumerate(records)]


def consume_all(conf: dict, topic: str) -> list[dict]:
    """Every record of every partition of ``topic``, sorted by (partition, offset)."""
    admin = AdminClient(conf)
    parts = sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    c = Consumer({**conf, "group.id": "kbs-test-reader", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    out: list[dict] = []
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        todo = {p for p in parts if ends[p] > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is not None:
                    if m.offset() >= ends[m.partition()]:
                        todo.discard(m.partition())
                    continue
                hs = m.headers()
                out.append({"topic": topic, "partition": m.partition(), "offset": m.offset(), "key": m.key(),
                            "value": m.value(), "headers": [tuple(h) for h in hs] if hs else None,
                            "timestamp": m.timestamp()[1], "timestamp_type": m.timestamp()[0]})
                if m.offset() >= ends[m.partition()] - 1:
                    todo.discard(m.partition())
        assert not todo, f"did not reach the end of {topic} partitions {todo}"
    finally:
        c.close()
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def by_partition(records: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(r["partition"], []).append(r)
    return out


def norm_headers(h: list | None) -> list[tuple[str, bytes | None]]:
    return [tuple(x) for x in h] if h else []


def assert_same_records(restored: list[dict], originals: list[dict], extra_headers=None) -> None:
    """Every field equal, partition by partition, in order (offsets may differ)."""
    got, want = by_partition(restored), by_partition(originals)
    assert sorted(got) == sorted(want)
    for p in want:
        assert len(got[p]) == len(want[p]), f"partition {p}: {len(got[p])} records, expected {len(want[p])}"
        for g, w in zip(got[p], want[p], strict=True):
            assert g["key"] == w["key"], (p, w["offset"])
            assert g["value"] == w["value"], (p, w["offset"])
            assert g["timestamp"] == w["timestamp"], (p, w["offset"])
            expected_h = norm_headers(w["headers"]) + (extra_headers(w) if extra_headers else [])
            assert norm_headers(g["headers"]) == expected_h, (p, w["offset"])
