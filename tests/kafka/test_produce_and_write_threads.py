"""The restore's C-level produce loop and the backup's writing thread, without a broker."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from fsspec_kbs.errors import KbsError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.kafka.backup import HANDOFF_CHUNKS, _WritingThread
from fsspec_kbs.kafka.consume import columns_of_fields
from fsspec_kbs.kafka.produce import _produce_run, chunk_of_columns


class _FullQueueProducer:
    """Refuses the given calls with BufferError (a full queue), as librdkafka does."""

    def __init__(self, refuse: set[int]) -> None:
        self.calls = 0
        self.refuse = refuse
        self.produced: list[tuple] = []
        self.polls = 0

    def produce(self, *args: object) -> None:
        self.calls += 1
        if self.calls in self.refuse:
            raise BufferError("queue full")
        self.produced.append(args)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


@pytest.mark.parametrize("refuse", [set(), {1}, {5, 6, 7}, {39, 40}])
def test_produce_run_sends_every_record_once_in_order_through_a_full_queue(refuse):
    n = 50
    values = [b"v%d" % i for i in range(n)]
    keys = [None if i % 3 else b"k%d" % i for i in range(n)]
    ts = list(range(1000, 1000 + n))
    hdrs = [None if i % 2 else [("h", b"%d" % i)] for i in range(n)]
    p = _FullQueueProducer(refuse)
    _produce_run(p.produce, p.poll, "dst", 2, values, keys, ts, hdrs, 3, 42)
    # positional: topic, value, key, partition, on_delivery, callback, timestamp, headers
    assert p.produced == [("dst", values[i], keys[i], 2, None, None, ts[i], hdrs[i]) for i in range(3, 42)]
    assert p.polls == len(refuse)


def test_chunk_of_columns_gives_exact_python_values():
    recs = [{"offset": i, "timestamp": 10 * i, "key": None if i % 4 == 0 else b"k" * i,
             "value": None if i == 5 else b"\x00\xff" * i,
             "headers": [("h\u00e9" if i == 7 else "h", b"x"), ("n", None)] if i % 3 == 0 else []}
            for i in range(20)]
    cols = RecordColumns.from_records(recs)
    mask = np.array([i % 2 == 0 for i in range(20)])
    for m in (None, mask):
        c = chunk_of_columns(("t", 0), cols, m)
        want = [r for i, r in enumerate(recs) if m is None or m[i]]
        assert c.offsets == [r["offset"] for r in want]
        assert c.timestamps == [r["timestamp"] for r in want]
        assert c.keys == [r["key"] for r in want]
        assert c.values == [r["value"] for r in want]
        assert c.headers == [r["headers"] or None for r in want]
        assert all(type(v) is bytes for v in c.values if v is not None)


class _FailingWriter:
    def __init__(self) -> None:
        self.flushes = 0

    def write_columns(self, topic: str, partition: int, cols: object) -> None:
        raise KbsError("disk full")

    def flush(self) -> None:
        self.flushes += 1


def test_writing_thread_error_reaches_the_consuming_thread():
    w = _WritingThread(_FailingWriter(), lambda cols: None)  # type: ignore[arg-type]
    w.flush()
    with pytest.raises(KbsError, match="disk full"):
        for _ in range(10 * HANDOFF_CHUNKS):  # the hand-over raises once the thread failed
            w.chunk(("t", 0), [], np.zeros(0, dtype=np.int64))
            w.thread.join(0.01)
    w.close(False)
    assert not w.thread.is_alive()
    assert threading.active_count() >= 1


def test_columns_of_fields_hold_the_consumed_fields_exactly():
    recs = [{"offset": 10 + i, "timestamp": 1000 + i, "key": None if i % 5 == 0 else b"k%d" % i,
             "value": None if i % 7 == 0 else b"v" * i,
             "headers": [("h\u00e9", None), ("a", b"x")] if i % 3 == 0 else []} for i in range(50)]
    hdrs = [r["headers"] if i % 2 else (r["headers"] or None) for i, r in enumerate(recs)]  # [] and None alike
    got = columns_of_fields(np.array([r["offset"] for r in recs], dtype=np.int64), [r["key"] for r in recs],
                            [r["value"] for r in recs], np.array([r["timestamp"] for r in recs], dtype=np.int64),
                            hdrs)
    want = RecordColumns.from_records(recs)
    for f in dataclasses.fields(want):
        assert np.array_equal(getattr(got, f.name), getattr(want, f.name)), f.name
