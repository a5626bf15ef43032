"""Pure format code: varints, checksums, segments, record batches (no I/O)."""

from __future__ import annotations

import ast
import struct
from pathlib import Path

import numpy as np
import pytest

from fsspec_kbs.errors import (
    BadMagicError,
    ChecksumError,
    DecompressionError,
    RecordFormatError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
    UnsupportedCodecError,
)
from fsspec_kbs.format import Codec, RecordColumns, SegmentReader, encode_batches, encode_segment
from fsspec_kbs.format import kernels as k
from fsspec_kbs.format.checksums import crc64_combine, crc64_join, crc64_xz
from fsspec_kbs.format.codecs import decompress

RECORDS = [
    {"offset": 5, "timestamp": 1_700_000_000_000, "key": b"k1", "value": b"v1", "headers": []},
    {"offset": 6, "timestamp": 1_699_999_999_000, "key": None, "value": b"", "headers": [("h", None)]},
    {"offset": 9, "timestamp": 1_700_000_000_500, "key": b"", "value": None,
     "headers": [("a", b"1"), ("b", b"")]},
]


def test_crc64_xz_check_value() -> None:
    assert crc64_xz(b"123456789") == 0x995DC9BBDF1939FA
    assert crc64_xz(b"6789", crc64_xz(b"12345")) == 0x995DC9BBDF1939FA


def test_crc64_combine_joins_the_crcs_of_parts() -> None:
    data = np.random.default_rng(7).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    for cut in (0, 1, 7, 4096, 65_537, 99_999, 100_000):
        assert crc64_combine(crc64_xz(data[:cut]), crc64_xz(data[cut:]), len(data) - cut) == crc64_xz(data), cut
    assert crc64_combine(crc64_xz(b"12345"), crc64_xz(b"6789"), 4) == 0x995DC9BBDF1939FA


def test_crc64_join_joins_many_parts_at_once() -> None:
    data = bytes(range(256)) * 40
    cuts = [0, 1, 1, 700, 4096, 9000, len(data)]  # an empty part too
    parts = [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    assert crc64_join([crc64_xz(p) for p in parts], [len(p) for p in parts]) == crc64_xz(data)
    assert crc64_join([], []) == crc64_xz(b"") == 0


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 300, -301, 2**31, -(2**31), 2**63 - 1, -(2**63)])
def test_varint_round_trip_matches_kafka_zigzag(value: int) -> None:
    out = np.zeros(10, dtype=np.uint8)
    end = k.write_varint(out, 0, value)
    assert end == k.varint_size(value)
    zz = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    expected = bytearray()
    while zz >= 0x80:
        expected.append((zz & 0x7F) | 0x80)
        zz >>= 7
    expected.append(zz)
    assert bytes(out[:end]) == bytes(expected)
    got, pos = k.read_varint(out, 0, end)
    assert (got, pos) == (value, end)


def test_varint_rejects_overlong_and_cut_off() -> None:
    eleven = np.array([0xFF] * 11, dtype=np.uint8)
    assert k.read_varint(eleven, 0, 11)[1] == -1
    assert k.read_varint(np.array([0x80], dtype=np.uint8), 0, 1)[1] == -1
    tenth_too_big = np.array([0xFF] * 9 + [0x02], dtype=np.uint8)
    assert k.read_varint(tenth_too_big, 0, 10)[1] == -1


@pytest.mark.parametrize("codec", list(Codec))
def test_segment_round_trip(codec: Codec) -> None:
    cols = RecordColumns.from_records(RECORDS)
    data, stats = encode_segment(encode_batches(cols, max_bytes=20), codec)
    assert (stats.first_offset, stats.last_offset, stats.records) == (5, 9, 3)
    assert (stats.min_timestamp, stats.max_timestamp) == (1_699_999_999_000, 1_700_000_000_500)
    assert stats.batches >= 2  # 20-byte batches force a split
    reader = SegmentReader(data, "mem.kbs")
    assert reader.codec == codec
    assert reader.read_all().records() == [
        {**r, "headers": [(hk, hv) for hk, hv in r["headers"]]} for r in RECORDS
    ]


def test_empty_segment() -> None:
    data, stats = encode_segment([], Codec.ZSTD)
    assert len(data) == 48 and stats.records == 0
    assert SegmentReader(data).read_all() is None


def _segment() -> bytes:
    return encode_segment(encode_batches(RecordColumns.from_records(RECORDS), 1 << 20), Codec.NONE)[0]


def _fix_crc64(buf: bytearray) -> bytes:
    struct.pack_into("<Q", buf, 24, crc64_xz(bytes(buf[32:-16])))
    return bytes(buf)


@pytest.mark.parametrize(
    ("mutate", "error", "offset"),
    [
        (lambda b: b.__setitem__(0, ord("X")), BadMagicError, 0),
        (lambda b: b.__setitem__(5, 9), UnsupportedCodecError, 5),
        (lambda b: b.__setitem__(4, 2), SegmentFormatError, 4),
        (lambda b: b.__setitem__(30, b[30] ^ 1), ChecksumError, 24),
        (lambda b: b.__setitem__(len(b) - 1, 0), TruncatedSegmentError, None),
    ],
)
def test_header_and_footer_defects(mutate, error, offset) -> None:  # type: ignore[no-untyped-def]
    buf = bytearray(_segment())
    mutate(buf)
    with pytest.raises(error) as info:
        SegmentReader(bytes(buf), "x.kbs").read_all()
    assert "x.kbs" in str(info.value)
    if offset is not None:
        assert info.value.offset == offset


def test_batch_crc_names_batch_offset() -> None:
    buf = bytearray(_segment())
    buf[32 + 24] ^= 0xFF  # first byte of the first batch's records
    with pytest.raises(ChecksumError) as info:
        SegmentReader(bytes(buf), "x.kbs").read_all()
    assert info.value.offset == 32 + 20


def test_record_error_has_file_offset_for_uncompressed() -> None:
    buf = bytearray(_segment())
    # key length of the first record (after offset delta and 6-byte timestamp varint): make it -5
    first_record = 32 + 24
    pos = first_record + 1 + k.varint_size(RECORDS[0]["timestamp"])
    buf[pos] = 9  # zigzag(-5)
    struct.pack_into("<I", buf, 32 + 20, __import__("zlib").crc32(bytes(buf[56 : 56 + struct.unpack_from("<I", buf, 44)[0]])))
    with pytest.raises(RecordFormatError) as info:
        SegmentReader(_fix_crc64(buf), "x.kbs").read_all()
    assert info.value.offset == pos
    assert "negative length" in str(info.value)


def test_header_counts_are_cross_checked() -> None:
    buf = bytearray(_segment())
    struct.pack_into("<Q", buf, 16, 99)  # record count not covered by CRC-64
    with pytest.raises(SegmentMismatchError, match="99 records"):
        SegmentReader(bytes(buf), "x.kbs").read_all()
    buf = bytearray(_segment())
    struct.pack_into("<Q", buf, len(buf) - 16, 7)  # footer last offset
    with pytest.raises(SegmentMismatchError, match="footer last offset"):
        SegmentReader(bytes(buf), "x.kbs").read_all()


def test_decompress_refuses_size_lies() -> None:
    import zstandard

    frame = zstandard.ZstdCompressor().compress(b"x" * 1000)
    with pytest.raises(DecompressionError):
        decompress(Codec.ZSTD, frame, 10)
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 100_000)
    with pytest.raises(DecompressionError):
        decompress(Codec.ZSTD, bomb, 100)
    import lz4.frame

    with pytest.raises(DecompressionError):
        decompress(Codec.LZ4, lz4.frame.compress(b"y" * 1000, store_size=False), 10)
    with pytest.raises(DecompressionError):
        decompress(Codec.LZ4, lz4.frame.compress(b"y" * 1000)[:-5], 1000)
    frame = lz4.frame.compress(bytes(range(256)) * 40)  # declares its size: Arrow's decoder
    with pytest.raises(DecompressionError, match="declares 10240 uncompressed bytes but the batch header says 100"):
        decompress(Codec.LZ4, frame, 100)
    with pytest.raises(DecompressionError):
        decompress(Codec.LZ4, frame + b"xyz", 10240)
    unsized = lz4.frame.compress(bytes(range(256)) * 40, store_size=False)  # cramjam
    with pytest.raises(DecompressionError, match="more than the declared 100 bytes"):
        decompress(Codec.LZ4, unsized, 100)
    with pytest.raises(DecompressionError, match="decompressed to 10240 bytes but the batch header says 10245"):
        decompress(Codec.LZ4, unsized, 10245)
    # A header that lies about the size (its own checksum is valid): liblz4 fails the frame.
    other = lz4.frame.compress(b"b" * 4000, store_size=False)
    lie = lz4.frame.compress(b"a" * 5000)[:15] + other[7:]
    for size in (5000, 4000):
        with pytest.raises(DecompressionError):
            decompress(Codec.LZ4, lie, size)
    for data in (b"", bytes(range(256)) * 40):  # with and without the content size in the frame
        for store_size in (True, False):
            out = decompress(Codec.LZ4, memoryview(lz4.frame.compress(data, store_size=store_size)), len(data))
            assert bytes(out) == data


@pytest.mark.parametrize("arrow_zstd", [True, False], ids=["arrow-zstd", "python-zstandard"])
def test_zstd_batch_must_be_exactly_one_frame(monkeypatch: pytest.MonkeyPatch, arrow_zstd: bool) -> None:
    import zstandard

    from fsspec_kbs.format import codecs

    if not arrow_zstd:
        without_zstd = codecs.arrow()._replace(zstd=None)
        monkeypatch.setattr(codecs, "arrow", lambda: without_zstd)
    elif codecs.arrow().zstd is None:
        pytest.skip("this pyarrow has no zstd")
    data = bytes(range(256)) * 40
    frame = zstandard.ZstdCompressor().compress(data)
    out = decompress(Codec.ZSTD, memoryview(frame), len(data))
    assert bytes(out) == data
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"abcd"
    empty = zstandard.ZstdCompressor().compress(b"")
    for b in (frame + b"trailing", frame + frame, frame[:-3], zstandard.ZstdCompressor().compress(data[:-1]),
              frame + skippable, frame + empty):
        with pytest.raises(DecompressionError):
            decompress(Codec.ZSTD, b, len(data))
    assert bytes(decompress(Codec.ZSTD, frame, len(data))) == data  # still usable after errors


def test_zstd_frame_length_walks_every_kind_of_frame() -> None:
    import zstandard

    from fsspec_kbs.format.codecs import zstd_frame_length

    rng = np.random.default_rng(4)
    for i in range(64):
        size = int(rng.integers(0, 300_000))
        data = (rng.bytes(size), b"a" * size, bytes(rng.integers(97, 100, size, dtype=np.uint8)))[i % 3]
        frame = zstandard.ZstdCompressor(level=int(rng.integers(1, 10)), write_checksum=bool(i & 4),
                                         write_content_size=bool(i & 8)).compress(data)
        if i & 16:  # streamed: no content size, not single-segment
            c = zstandard.ZstdCompressor(level=3).compressobj()
            frame = c.compress(data) + c.flush()
        assert zstd_frame_length(frame) == len(frame), i
        assert zstd_frame_length(frame + b"more") == len(frame), i
        assert zstd_frame_length(frame[:-1]) == -1, i
    assert zstd_frame_length(b"not a zstd frame") == -1


def test_fallback_kernels_agree_with_jit() -> None:
    if not k.JIT_ENABLED:
        pytest.skip("numba JIT disabled: only the fallback path exists")
    cols = RecordColumns.from_records(RECORDS)
    (batch,) = encode_batches(cols, 1 << 20)
    jit = k.scan_records(batch.data, 0, len(batch.data), batch.count, batch.base_offset)
    py = k.scan_records.py_func(batch.data, 0, len(batch.data), batch.count, batch.base_offset)
    assert tuple(int(x) for x in jit) == tuple(int(x) for x in py)


def test_format_layer_does_no_io_imports() -> None:
    root = Path(__file__).resolve().parents[2] / "fsspec_kbs" / "format"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in ("fsspec", "s3fs", "gcsfs", "pyspark"), f"{path.name} imports {name}"
                # pyarrow only for its memory pool (decoded buffers), never its file systems.
                assert name == "pyarrow" or top != "pyarrow", f"{path.name} imports {name}"
                assert not name.startswith(("fsspec_kbs.store", "fsspec_kbs.arrow", "fsspec_kbs.dataset")), \
                    f"{path.name} imports upward: {name}"
