"""Batch index files (kbs-format.md §7): encoding, every structural check, selection, and
batches decoded through an index with the entry checks."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_kbs.arrow.convert import columns_to_batch
from fsspec_kbs.errors import (
    BatchIndexDamagedError,
    BatchIndexError,
    ChecksumError,
    SegmentFormatError,
)
from fsspec_kbs.format import (
    Codec,
    RecordColumns,
    SegmentReader,
    ViewColumns,
    compress_batch,
    encode_batches,
)
from fsspec_kbs.format.batch_index import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    BatchIndex,
    IndexEntry,
    assemble_indexed_segment,
    coalesce,
    decode_batch,
    decode_batches,
    encode_index,
    entries_array,
    index_entries,
    index_from_segment,
    parse_index,
    verify_index,
)
from fsspec_kbs.format.segment import FOOTER_SIZE, HEADER_SIZE, assemble_segment

SEG, IDX = "t/0/segment-00000000.kbs", "t/0/segment-00000000.index"
CODECS = [Codec.NONE, Codec.LZ4, Codec.ZSTD]


def random_columns(seed: int, n: int = 3000) -> RecordColumns:
    """Records with offset gaps and timestamps that go back and forth (not monotonic)."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.integers(1, 4, n)) + int(rng.integers(0, 1000))
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(-50, 100, n))
    recs = [{"offset": int(offsets[i]), "timestamp": int(ts[i]),
             "key": rng.bytes(int(rng.integers(0, 20))) if rng.random() < 0.8 else None,
             "value": rng.bytes(int(rng.integers(0, 200))),
             "headers": [("h", rng.bytes(3))] if rng.random() < 0.3 else []} for i in range(n)]
    return RecordColumns.from_records(recs)


def build(codec: Codec = Codec.ZSTD, seed: int = 1, n: int = 3000, batch_bytes: int = 2000
          ) -> tuple[bytes, bytes, RecordColumns]:
    cols = random_columns(seed, n)
    seg, _, idx = assemble_indexed_segment([compress_batch(b, codec) for b in encode_batches(cols, batch_bytes)], codec)
    return seg, idx, cols


def rows(cols: RecordColumns | ViewColumns) -> list[dict]:
    """Rows of either kind of columns, comparable."""
    return columns_to_batch(cols, "t", 0, views=True).to_pylist()


@pytest.fixture(scope="module")
def built() -> tuple[bytes, bytes, RecordColumns]:
    return build()


def relabel(idx: bytes, **changes: object) -> bytes:
    """The index with entry fields changed (``field=(i, value)``) and its CRC recomputed: a
    "lying" index that no CRC can catch."""
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE).copy()
    for name, (i, value) in changes.items():  # type: ignore[misc]
        e[name][i] = value
    return encode_index(e)


# -- encoding ------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_matches_the_segment(codec: Codec) -> None:
    seg, idx, _ = build(codec)
    index = parse_index(idx, IDX, SEG, len(seg))
    reader = SegmentReader(seg, SEG)
    assert len(index) == len(reader.batches()) > 50
    assert (index_from_segment(reader) == index.entries).all()  # write time == decoded
    assert [int(p) for p in index.position] == [b.position for b in reader.batches()]
    assert int(index.end[-1]) == len(seg) - FOOTER_SIZE
    assert len(idx) == INDEX_HEADER_SIZE + ENTRY_SIZE * len(index)
    verify_index(index, reader)
    # Dataclass entries encode to the same bytes.
    assert encode_index([index.entry(i) for i in range(len(index))]) == idx


def test_header_layout(built: tuple[bytes, bytes, RecordColumns]) -> None:
    _, idx, _ = built
    magic, version, flags, reserved, count, crc = struct.unpack_from("<4sBBHII", idx)
    assert (magic, version, flags, reserved) == (b"KBSI", 1, 0, 0)
    assert count == (len(idx) - 16) // 40 and crc == zlib.crc32(idx[16:])
    base, last, pos, lo, hi = struct.unpack_from("<QQQqq", idx, 16)
    assert pos == HEADER_SIZE and base <= last and lo <= hi


def test_index_entries_are_free_at_write_time() -> None:
    """The writer's compressed batches give the entries without decoding anything."""
    cbs = [compress_batch(b, Codec.LZ4) for b in encode_batches(random_columns(2, 500), 1000)]
    seg, stats = assemble_segment(cbs, Codec.LZ4)
    e = index_entries(cbs)
    assert (e == index_from_segment(SegmentReader(seg))).all()
    assert int(e["min_timestamp"].min()) == stats.min_timestamp and int(e["last_offset"][-1]) == stats.last_offset


def test_empty_segment() -> None:
    seg, stats, idx = assemble_indexed_segment([], Codec.ZSTD)
    index = parse_index(idx, IDX, SEG, len(seg))
    assert len(index) == 0 and index.select() == [] and index.select(0, 10) == []
    with pytest.raises(BatchIndexError, match="no entries"):
        parse_index(idx, IDX, SEG, len(seg) + 100)


# -- damage: the index cannot be used, the segment can be read without it -----------------------

def test_flipped_entry_byte_is_damage(built: tuple[bytes, bytes, RecordColumns]) -> None:
    seg, idx, _ = built
    for at in (16, 16 + 40 * 7 + 17, len(idx) - 1):
        bad = bytearray(idx)
        bad[at] ^= 0x04
        with pytest.raises(BatchIndexDamagedError, match="CRC-32") as e:
            parse_index(bytes(bad), IDX, SEG, len(seg))
        assert SEG in str(e.value) and IDX in str(e.value)


def test_manifest_crc_mismatch_is_damage(built: tuple[bytes, bytes, RecordColumns]) -> None:
    seg, idx, _ = built
    parse_index(idx, IDX, SEG, len(seg), file_crc32=zlib.crc32(idx))
    with pytest.raises(BatchIndexDamagedError, match="manifest"):
        parse_index(idx, IDX, SEG, len(seg), file_crc32=zlib.crc32(idx) ^ 1)


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b"KBSX" + b[4:], "magic"),
    (lambda b: b[:8] + struct.pack("<I", struct.unpack_from("<I", b, 8)[0] + 1) + b[12:], "entries"),
    (lambda b: b[:8] + struct.pack("<I", struct.unpack_from("<I", b, 8)[0] - 1) + b[12:], "entries"),
    (lambda b: b[:-40], "entries"),
    (lambda b: b[:10], "shorter"),
])
def test_bad_header(built: tuple[bytes, bytes, RecordColumns], mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    """Without the manifest's CRC the header is unprotected: a bad one is damage (fall back).
    With a matching manifest CRC the writer wrote it: corruption."""
    seg, idx, _ = built
    bad = mutate(idx)
    with pytest.raises(BatchIndexDamagedError, match=match):
        parse_index(bad, IDX, SEG, len(seg))
    with pytest.raises(BatchIndexError, match=match) as e:
        parse_index(bad, IDX, SEG, len(seg), file_crc32=zlib.crc32(bad))
    assert not isinstance(e.value, BatchIndexDamagedError)


@pytest.mark.parametrize("at, value, match", [(4, 2, "version 2"), (5, 1, "flags"), (6, 1, "reserved")])
def test_unknown_version_or_flags_are_not_used(built: tuple[bytes, bytes, RecordColumns], at: int, value: int,
                                               match: str) -> None:
    seg, idx, _ = built
    bad = bytearray(idx)
    bad[at] = value
    with pytest.raises(BatchIndexDamagedError, match=match):
        parse_index(bytes(bad), IDX, SEG, len(seg), file_crc32=zlib.crc32(bad))


# -- structure: a lying index whose CRCs match is corruption -----------------------------------

def _positions(idx: bytes) -> np.ndarray:
    return np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE)["position"]


@pytest.mark.parametrize("case", [
    "first_position", "positions_equal", "positions_decrease", "short_batch", "last_past_end",
    "base_above_last", "base_not_above_previous_last", "min_above_max", "offset_above_int64",
])
def test_structural_checks(built: tuple[bytes, bytes, RecordColumns], case: str) -> None:
    seg, idx, _ = built
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE)
    size = len(seg)
    pos = _positions(idx)
    bad = {
        "first_position": lambda: relabel(idx, position=(0, 40)),
        "positions_equal": lambda: relabel(idx, position=(5, pos[4])),
        "positions_decrease": lambda: relabel(idx, position=(5, pos[4] - 10)),
        "short_batch": lambda: relabel(idx, position=(5, pos[4] + 20)),
        "last_past_end": lambda: relabel(idx, position=(len(e) - 1, size - FOOTER_SIZE - 10)),
        "base_above_last": lambda: relabel(idx, base_offset=(3, e["last_offset"][3] + 1)),
        "base_not_above_previous_last": lambda: relabel(idx, last_offset=(3, e["base_offset"][4])),
        "min_above_max": lambda: relabel(idx, min_timestamp=(3, e["max_timestamp"][3] + 1)),
        "offset_above_int64": lambda: relabel(idx, last_offset=(len(e) - 1, 2**63)),
    }[case]()
    with pytest.raises(BatchIndexError) as err:
        parse_index(bad, IDX, SEG, size, file_crc32=zlib.crc32(bad))
    assert not isinstance(err.value, BatchIndexDamagedError)
    assert SEG in str(err.value) and IDX in str(err.value)
    assert err.value.path == IDX and err.value.offset is not None and err.value.offset >= INDEX_HEADER_SIZE


def test_segment_size_must_match_last_batch(built: tuple[bytes, bytes, RecordColumns]) -> None:
    seg, idx, _ = built
    # A segment grown or shrunk relative to its index: the last batch no longer ends at the footer.
    parse_index(idx, IDX, SEG, len(seg) + 1000)  # lengths are what's left: caught on read (stored length)
    with pytest.raises(BatchIndexError, match="too short"):
        parse_index(idx, IDX, SEG, int(_positions(idx)[-1]) + 30)


# -- selection -------------------------------------------------------------------------------------

@st.composite
def indexes(draw: st.DrawFn) -> BatchIndex:
    n = draw(st.integers(0, 40))
    gaps = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    spans = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(25, 200), min_size=n, max_size=n))
    lows = draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n))
    widths = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    e = np.empty(n, ENTRY_DTYPE)
    base = 0
    pos = HEADER_SIZE
    for i in range(n):
        base += gaps[i]
        e[i] = (base, base + spans[i], pos, lows[i], lows[i] + widths[i])
        base += spans[i] + 1
        pos += sizes[i]
    return parse_index(encode_index(e), IDX, SEG, pos + FOOTER_SIZE)


bound = st.none() | st.integers(-60, 200)


@settings(max_examples=400, deadline=None)
@given(indexes(), bound, bound, bound, bound)
def test_select_against_brute_force(index: BatchIndex, so: int | None, eo: int | None, st_: int | None,
                                    et: int | None) -> None:
    n = len(index)
    expected = [
        i for i in range(n)
        if (eo is None or index.base[i] < eo)
        and (so is None or i == n - 1 or index.base[i + 1] > so)  # batch i covers [base_i, base_i+1)
        and (st_ is None or index.max_ts[i] >= st_)
        and (et is None or index.min_ts[i] < et)
    ]
    runs = index.select(so, eo, st_, et)
    got = [i for a, b in runs for i in range(a, b)]
    assert got == expected
    assert all(a < b for a, b in runs) and all(r1[1] < r2[0] for r1, r2 in zip(runs, runs[1:], strict=False))
    # Never misses a batch whose entry's own bounds overlap the query.
    for i in range(n):
        if ((so is None or index.last[i] >= so) and (eo is None or index.base[i] < eo)
                and (st_ is None or index.max_ts[i] >= st_) and (et is None or index.min_ts[i] < et)):
            assert i in got


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 500), st.integers(-2000, 8000), st.integers(1, 3000))
def test_select_finds_every_matching_record(seed: int, width: int, t0: int, twidth: int) -> None:
    seg, idx, cols = _small[seed % len(_small)]
    index = parse_index(idx, IDX, SEG, len(seg))
    so = int(cols.offsets[0]) + seed % 3000
    ts0 = int(cols.timestamps.min()) + t0
    runs = index.select(so, so + width, ts0, ts0 + twidth)
    rows = [(a, b) for a, b in runs]
    reader = SegmentReader(seg, SEG)
    batches = reader.batches()
    starts = np.cumsum([0] + [b.record_count for b in batches])
    selected = np.zeros(len(cols), bool)
    for a, b in rows:
        selected[starts[a]:starts[b]] = True
    match = ((cols.offsets >= so) & (cols.offsets < so + width) & (cols.timestamps >= ts0)
             & (cols.timestamps < ts0 + twidth))
    assert not (match & ~selected).any()


_small = [build(Codec.NONE, seed, n=1500, batch_bytes=1500) for seed in range(3)]


def test_coalesce() -> None:
    assert coalesce([]) == []
    assert coalesce([(0, 10), (10, 20)], gap=0) == [(0, 20)]
    assert coalesce([(0, 10), (11, 20)], gap=0) == [(0, 10), (11, 20)]
    assert coalesce([(0, 10), (15, 20), (40, 50)], gap=5) == [(0, 20), (40, 50)]
    assert coalesce([(30, 40), (0, 10), (5, 8)], gap=0) == [(0, 10), (30, 40)]


# -- reading through the index ---------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("views", [False, True])
def test_decode_through_index_equals_full_read(codec: Codec, views: bool) -> None:
    seg, idx, cols = build(codec, seed=5)
    index = parse_index(idx, IDX, SEG, len(seg))
    a, b = 17, 29
    s, e = index.byte_ranges([(a, b)])[0]
    got = decode_batches(memoryview(seg)[s - 100 : e + 7], s - 100, index, a, b, codec, views)
    first = int(np.searchsorted(cols.offsets, index.base[a]))
    stop = int(np.searchsorted(cols.offsets, index.base[b]))
    assert isinstance(got, ViewColumns if views else RecordColumns)
    assert rows(got) == rows(cols.slice(first, stop))
    one = decode_batch(seg[int(index.position[a]):int(index.end[a])], index.entry(a), codec, SEG, IDX)
    assert rows(one) == rows(got)[: len(one)]


@pytest.mark.parametrize("field, delta, match", [
    ("min_timestamp", +1, "below the index's min timestamp"),
    ("max_timestamp", -1, "above the index's max timestamp"),
    ("last_offset", -1, "above the index's last offset"),
])
@pytest.mark.parametrize("codec", CODECS)
def test_lying_entry_bounds_raise_naming_both_files(codec: Codec, field: str, delta: int, match: str) -> None:
    seg, idx, _ = build(codec, seed=7)
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE)
    i = 20
    if field == "last_offset":  # keep the entry valid: base <= last
        assert e["last_offset"][i] > e["base_offset"][i]
    lie = relabel(idx, **{field: (i, int(e[field][i]) + delta)})
    index = parse_index(lie, IDX, SEG, len(seg), file_crc32=zlib.crc32(lie))  # structurally fine
    s, end = index.byte_ranges([(i - 2, i + 3)])[0]
    with pytest.raises(BatchIndexError, match=match) as err:
        decode_batches(memoryview(seg)[s:end], s, index, i - 2, i + 3, codec)
    assert SEG in str(err.value) and IDX in str(err.value) and f"batch {i}" in str(err.value)
    assert err.value.offset == int(index.position[i])


@pytest.mark.parametrize("case, match", [
    ("base", "base offset"),
    ("count", "records, more than"),
    ("position", "bytes but the index gives it|batch"),
])
def test_lying_entry_header_fields(built: tuple[bytes, bytes, RecordColumns], case: str, match: str) -> None:
    seg, idx, _ = built
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE)
    i = 10
    if case == "base":
        lie = relabel(idx, base_offset=(i, int(e["base_offset"][i]) + 1))
    elif case == "count":  # an offset span too small for the batch's records
        lie = relabel(idx, last_offset=(i, int(e["base_offset"][i])))
    else:  # batch 11 shifted by a byte: batch 10's stored length disagrees with its header
        lie = relabel(idx, position=(i + 1, int(e["position"][i + 1]) + 1))
    index = parse_index(lie, IDX, SEG, len(seg), file_crc32=zlib.crc32(lie))
    s, end = index.byte_ranges([(i, i + 2)])[0]
    with pytest.raises(SegmentFormatError, match=match) as err:
        decode_batches(memoryview(seg)[s:end], s, index, i, i + 2, Codec.ZSTD)
    assert isinstance(err.value, BatchIndexError)
    assert SEG in str(err.value) and IDX in str(err.value)


def test_damaged_batch_keeps_its_error_and_names_the_index(built: tuple[bytes, bytes, RecordColumns]) -> None:
    seg, idx, _ = built
    index = parse_index(idx, IDX, SEG, len(seg))
    i = 12
    bad = bytearray(seg)
    bad[int(index.position[i]) + 30] ^= 0xFF
    s, e = index.byte_ranges([(i, i + 1)])[0]
    with pytest.raises(ChecksumError) as err:
        decode_batches(memoryview(bytes(bad))[s:e], s, index, i, i + 1, Codec.ZSTD)
    assert SEG in str(err.value) and IDX in str(err.value)


def test_verify_index_finds_a_lie(built: tuple[bytes, bytes, RecordColumns]) -> None:
    seg, idx, _ = built
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE)
    lie = relabel(idx, min_timestamp=(30, int(e["min_timestamp"][30]) + 1))
    with pytest.raises(BatchIndexError, match="entry 30"):
        verify_index(parse_index(lie, IDX, SEG, len(seg)), SegmentReader(seg, SEG))
    # Looser bounds than the records' are allowed by §7 (records lie within them).
    loose = relabel(idx, max_timestamp=(30, int(e["max_timestamp"][30]) + 5))
    verify_index(parse_index(loose, IDX, SEG, len(seg)), SegmentReader(seg, SEG))


def test_entries_array_accepts_dataclasses() -> None:
    e = [IndexEntry(0, 4, 32, -5, 9), IndexEntry(6, 6, 100, 1, 1)]
    arr = entries_array(e)
    assert arr.dtype == ENTRY_DTYPE and int(arr["max_timestamp"][0]) == 9
    index = parse_index(encode_index(e), IDX, SEG, 200)
    assert index.entry(1) == e[1] and [int(x) for x in index.end] == [100, 184]
