"""Kafka record batch v2 / index parsers, on batches built here."""

from __future__ import annotations

import struct
import zlib

import cramjam
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_kbs.errors import (
    BadMagicError,
    DecompressionError,
    RecordFormatError,
    TruncatedSegmentError,
)
from fsspec_kbs.format import kafka_log as kl


def records(n: int, start: int = 0, step: int = 1, ts: int = 1_700_000_000_000) -> list[dict]:
    return [{
        "offset": start + i * step,
        "timestamp": ts + (i * 37) % 11 - 5,  # out of order, as CreateTime may be
        "key": None if i % 4 == 0 else f"key-{i % 5}".encode(),
        "value": None if i % 7 == 3 else (f"value {i} " * (i % 9)).encode(),
        "headers": [("h", b"x" * i), ("null", None)] if i % 3 == 1 else [],
    } for i in range(n)]


def decode(data: bytes) -> kl.KafkaColumns:
    headers, tail = kl.walk_batches(data)
    assert tail is None
    return kl.decode_batches(data, headers)


@pytest.mark.parametrize("codec", sorted(kl.KAFKA_CODEC_NAMES), ids=kl.KAFKA_CODEC_NAMES.get)
@pytest.mark.parametrize("xerial", [True, False], ids=["xerial", "raw"])
def test_each_codec_round_trips(codec: int, xerial: bool) -> None:
    recs = records(60, start=100, step=3)
    data = kl.encode_kafka_batch(recs, codec=codec, xerial=xerial)
    h = kl.parse_batch_header(data)
    assert (h.codec, h.base_offset, h.last_offset, h.records_count) == (codec, 100, 277, 60)
    assert h.size == len(data)
    kc = decode(data)
    assert kc.columns.records() == [dict(r) for r in recs]
    assert set(kc.timestamp_types.tolist()) == {kl.CREATE_TIME}


def test_snappy_xerial_framing_with_several_blocks() -> None:
    raw = b"".join(kl._encode_record(r, 0, 0) for r in records(30))
    blocks = [raw[:100], raw[100:]]
    framed = kl._XERIAL_MAGIC + struct.pack(">ii", 1, 1) + b"".join(
        struct.pack(">i", len(c)) + c for c in (bytes(cramjam.snappy.compress_raw(b)) for b in blocks))
    assert kl.decompress_records(kl.CODEC_SNAPPY, framed) == raw


def test_gzip_concatenated_members() -> None:
    parts = [b"a" * 1000, b"b" * 10]
    data = b"".join(kl.compress_records(kl.CODEC_GZIP, p) for p in parts)
    assert kl.decompress_records(kl.CODEC_GZIP, data) == b"".join(parts)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_decompression_is_bounded(codec: int) -> None:
    bomb = kl.compress_records(codec, b"\0" * 1_000_000)
    assert kl.decompress_records(codec, bomb, max_size=1_000_000) == b"\0" * 1_000_000
    with pytest.raises(DecompressionError, match="more than 999999"):
        kl.decompress_records(codec, bomb, max_size=999_999)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_invalid_compressed_data_names_file_and_batch(codec: int) -> None:
    data = bytearray(kl.encode_kafka_batch(records(20), codec=codec))
    for i in range(kl.KAFKA_BATCH_HEADER_SIZE + 4, len(data) - 4):
        data[i] ^= 0x5A
    h = kl.parse_batch_header(bytes(data))
    with pytest.raises((DecompressionError, RecordFormatError)) as e:
        kl.decode_batches(bytes(data), [h], path="seg.log")
    assert e.value.path == "seg.log"


def test_unknown_codec() -> None:
    with pytest.raises(kl.UnsupportedCodecError):
        kl.decompress_records(6, b"xx")


def test_log_append_time_uses_max_timestamp() -> None:
    data = kl.encode_kafka_batch(records(10), codec=kl.CODEC_LZ4, log_append_time=1_800_000_000_000)
    kc = decode(data)
    assert kc.columns.timestamps.tolist() == [1_800_000_000_000] * 10
    assert kc.timestamp_types.tolist() == [kl.LOG_APPEND_TIME] * 10


def test_control_batch() -> None:
    data = kl.encode_control_batch(42, producer_id=7, commit=False)
    h = kl.parse_batch_header(data)
    assert h.is_control and h.is_transactional and h.producer_id == 7
    assert kl.control_type(data, h) == kl.CONTROL_ABORT
    assert kl.control_type(kl.encode_control_batch(43, 7, commit=True), h) == kl.CONTROL_COMMIT


def test_corrupt_crc_is_a_tail() -> None:
    good = kl.encode_kafka_batch(records(5))
    bad = bytearray(kl.encode_kafka_batch(records(5, start=5)))
    bad[-3] ^= 1
    data = good + bytes(bad) + kl.encode_kafka_batch(records(5, start=10))
    headers, tail = kl.walk_batches(data, path="x.log")
    assert [h.base_offset for h in headers] == [0]
    assert tail is not None and tail.position == len(good) and tail.dropped_bytes == len(data) - len(good)
    assert "CRC-32C" in tail.reason
    headers, tail = kl.walk_batches(data, verify_crc=False)
    assert tail is None and len(headers) == 3


@pytest.mark.parametrize("cut", [1, 11, 12, 40, 61, -1])
def test_truncated_tail(cut: int) -> None:
    good = kl.encode_kafka_batch(records(5))
    last = kl.encode_kafka_batch(records(5, start=5))
    data = good + last[:cut]
    headers, tail = kl.walk_batches(data)
    assert len(headers) == 1
    assert tail is not None and tail.position == len(good) and tail.dropped_bytes == len(data) - len(good)


def test_zero_padding_is_a_tail() -> None:
    good = kl.encode_kafka_batch(records(5))
    headers, tail = kl.walk_batches(good + b"\0" * 100)
    assert len(headers) == 1 and tail is not None and tail.dropped_bytes == 100


def test_offsets_must_increase_between_batches() -> None:
    a = kl.encode_kafka_batch(records(5, start=10))
    b = kl.encode_kafka_batch(records(5, start=12))
    headers, tail = kl.walk_batches(a + b)
    assert len(headers) == 1 and tail is not None and "not above" in tail.reason


def test_legacy_message_format_is_refused_clearly() -> None:
    # message format v1: offset, size, crc, magic 1, attributes, timestamp, key -1, value "hi"
    body = struct.pack(">bbqi", 1, 0, 1000, -1) + struct.pack(">i", 2) + b"hi"
    msg = struct.pack(">I", zlib.crc32(body)) + body
    data = struct.pack(">qi", 0, len(msg)) + msg
    with pytest.raises(BadMagicError, match="not supported"):
        kl.walk_batches(data, path="old.log")


def test_bad_record_length_names_the_byte() -> None:
    recs = records(3)
    data = bytearray(kl.encode_kafka_batch(recs))
    data[kl.KAFKA_BATCH_HEADER_SIZE] = 0x7E  # first record's length prefix now too large
    h = kl.parse_batch_header(bytes(data))
    with pytest.raises(RecordFormatError) as e:
        kl.decode_batches(bytes(data), [h], path="s.log")
    assert e.value.offset == kl.KAFKA_BATCH_HEADER_SIZE and e.value.path == "s.log"


def test_compacted_batch_with_gaps_and_empty_batch() -> None:
    recs = [{"offset": 10 + d, "timestamp": 5, "key": b"k", "value": b"v"} for d in (2, 5, 9)]
    data = kl.encode_kafka_batch(recs, base_offset=10, last_offset_delta=12)
    kc = decode(data)
    assert kc.columns.offsets.tolist() == [12, 15, 19]
    empty = kl.encode_kafka_batch([], base_offset=30, last_offset_delta=3)
    headers, tail = kl.walk_batches(data + empty)
    assert tail is None and headers[1].records_count == 0 and headers[1].last_offset == 33


def test_offset_index_stops_at_padding() -> None:
    raw = kl.encode_offset_index([(105, 0), (130, 4100), (190, 8300)], 100) + b"\0" * 80
    entries = kl.parse_offset_index(raw, 100)
    assert [(e.offset, e.position) for e in entries] == [(105, 0), (130, 4100), (190, 8300)]
    assert kl.lookup_offset(entries, 104) == 0
    assert kl.lookup_offset(entries, 130) == 4100
    assert kl.lookup_offset(entries, 189) == 4100
    assert kl.lookup_offset(entries, 10**9) == 8300


def test_time_index_stops_at_padding_and_looks_up_strictly_before() -> None:
    raw = kl.encode_time_index([(1000, 110), (2000, 150), (3000, 170)], 100) + b"\0" * 120
    entries = kl.parse_time_index(raw, 100)
    assert [(e.timestamp, e.offset) for e in entries] == [(1000, 110), (2000, 150), (3000, 170)]
    assert kl.lookup_time(entries, 1000) is None
    assert kl.lookup_time(entries, 2000) == 110
    assert kl.lookup_time(entries, 2001) == 150


def test_txn_index() -> None:
    txns = [kl.AbortedTxn(10, 7, 20), kl.AbortedTxn(30, 8, 31)]
    raw = kl.encode_txn_index(txns)
    assert len(raw) == 68  # 34 bytes per entry, Kafka's AbortedTxn.TOTAL_SIZE
    assert kl.parse_txn_index(raw) == txns
    with pytest.raises(TruncatedSegmentError):
        kl.parse_txn_index(raw[:-1], "x.txnindex")


# -- read_committed: compare the consumer algorithm with a naive reference ----------------------

@st.composite
def txn_logs(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """A log as a list of (kind, producer, offset); kind is data, txn, commit or abort."""
    events = []
    open_pids: set[int] = set()
    offset = 0
    for _ in range(draw(st.integers(0, 40))):
        pid = draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["data", "txn", "txn", "end"]))
        if kind == "end":
            if pid not in open_pids:
                continue
            kind = draw(st.sampled_from(["commit", "abort"]))
            open_pids.discard(pid)
        elif kind == "txn":
            open_pids.add(pid)
        events.append((kind, pid, offset))
        offset += draw(st.integers(1, 3))
    for pid in sorted(open_pids):
        events.append(("commit", pid, offset))
        offset += 1
    return events


def _header(kind: str, pid: int, offset: int) -> kl.KafkaBatchHeader:
    attrs = {"data": 0, "txn": 0x10, "commit": 0x30, "abort": 0x30}[kind]
    return kl.KafkaBatchHeader(0, offset, 49, 0, 2, 0, attrs, 0, 0, 0, pid if kind != "data" else -1, 0, 0, 1)


@settings(max_examples=200, deadline=None)
@given(txn_logs(), st.booleans())
def test_read_committed_matches_naive(events: list[tuple[str, int, int]], use_txnindex: bool) -> None:
    # naive: a transactional batch is visible iff its transaction ends with a commit
    fate: dict[int, str] = {}
    expected = []
    for kind, pid, offset in reversed(events):
        if kind in ("commit", "abort"):
            fate[pid] = kind
        elif kind == "txn" and fate.get(pid) == "commit" or kind == "data":
            expected.append(offset)
    expected.sort()
    tracker = kl.TxnTracker()
    for kind, pid, offset in events:
        ctype = {"commit": kl.CONTROL_COMMIT, "abort": kl.CONTROL_ABORT}.get(kind)
        tracker.add(_header(kind, pid, offset), ctype)
    filt = kl.ReadCommittedFilter(tracker.aborted if use_txnindex else [])
    if not use_txnindex:
        filt.add(tracker.aborted)
    got = [offset for kind, pid, offset in events
           if filt.keep(_header(kind, pid, offset),
                        {"commit": kl.CONTROL_COMMIT, "abort": kl.CONTROL_ABORT}.get(kind))]
    assert got == expected


def test_jit_and_python_decoders_agree() -> None:
    recs = records(200)
    data = kl.encode_kafka_batch(recs, codec=kl.CODEC_ZSTD)
    h = kl.parse_batch_header(data)
    payload = kl.batch_payload(data, h)
    py = kl.scan_kafka_records.py_func if hasattr(kl.scan_kafka_records, "py_func") else kl.scan_kafka_records
    assert py(payload.data, 0, len(payload.data), 200, h.last_offset_delta) == \
        kl.scan_kafka_records(payload.data, 0, len(payload.data), 200, h.last_offset_delta)
    assert np.array_equal(decode(data).columns.offsets, np.arange(200))
