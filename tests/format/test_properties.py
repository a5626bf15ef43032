"""Property-based round trips of random records through encode/decode and a whole backup."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsspec_kbs
from fsspec_kbs.format import Codec, RecordColumns, SegmentReader, encode_batches, encode_segment
from fsspec_kbs.store import BackupWriter

blob = st.one_of(st.none(), st.binary(max_size=64))
header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16)))


@st.composite
def records(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(0, 40))
    start = draw(st.integers(0, 2**63 - 2**40))
    gaps = draw(st.lists(st.integers(1, 2**20), min_size=n, max_size=n))
    offsets, o = [], start
    for g in gaps:
        offsets.append(o)
        o += g
    ts = draw(st.lists(st.integers(-(2**40), 2**42), min_size=n, max_size=n))  # any order: negative deltas
    return [
        {"offset": offsets[i], "timestamp": ts[i], "key": draw(blob), "value": draw(blob),
         "headers": draw(st.lists(header, max_size=3))}
        for i in range(n)
    ]


@settings(max_examples=150, deadline=None)
@given(recs=records(), codec=st.sampled_from(list(Codec)), batch=st.integers(1, 400))
def test_segment_round_trip(recs: list[dict], codec: Codec, batch: int) -> None:
    data, stats = encode_segment(encode_batches(RecordColumns.from_records(recs), batch), codec)
    cols = SegmentReader(data, "prop.kbs").read_all()
    got = [] if cols is None else cols.records()
    assert got == [{**r, "headers": list(r["headers"])} for r in recs]
    assert stats.records == len(recs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=records(), max_records=st.integers(1, 15))
def test_backup_round_trip_memory(recs: list[dict], max_records: int) -> None:
    url = f"memory://prop-{uuid.uuid4().hex}/backup-1"
    w = BackupWriter(url, segment_max_records=max_records, batch_max_bytes=300)
    if recs:
        w.write_columns("topic.a", 7, RecordColumns.from_records(recs))
    m = w.commit()
    table = fsspec_kbs.read_table(url)
    assert table.column("offset").to_pylist() == [r["offset"] for r in recs]
    assert table.column("key").to_pylist() == [r["key"] for r in recs]
    assert table.column("value").to_pylist() == [r["value"] for r in recs]
    # No headers: a null list, as in Spark's Kafka source.
    assert [None if hs is None else [(h["key"], h["value"]) for h in hs]
            for hs in table.column("headers").to_pylist()] == [list(r["headers"]) or None for r in recs]
    assert m.statistics["records"] == len(recs)
