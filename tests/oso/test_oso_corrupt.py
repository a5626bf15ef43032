"""Defective oso-native segments: every defect a clear library error naming file and byte offset."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import lz4.block
import pytest
import zstandard
from click.testing import CliRunner

import fsspec_kbs
from fsspec_kbs.cli.main import cli
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
from fsspec_kbs.format.columns import RecordColumns
from fsspec_kbs.format.oso import (
    HEADER_SIZE,
    OsoCodec,
    assemble,
    decode_segment,
    encode_records,
    encode_segment,
)
from fsspec_kbs.maintenance.validate import validate_backup
from tests.oso.helpers import CODECS, copy_vector, manifest, refresh_crc, segment_files

pytestmark = pytest.mark.conformance


def _damage(backup: Path, fn) -> Path:  # type: ignore[no-untyped-def]
    seg = segment_files(backup)[1]
    seg.write_bytes(bytes(fn(bytearray(seg.read_bytes()))))
    return seg


def _read_error(backup: Path) -> SegmentFormatError:
    with pytest.raises(SegmentFormatError) as info:
        fsspec_kbs.read_table(str(backup))
    return info.value


def _flip(at: int):  # type: ignore[no-untyped-def]
    def fn(d: bytearray) -> bytearray:
        d[at] ^= 0x40
        return d
    return fn


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_body_byte_is_a_crc_error(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, _flip(HEADER_SIZE + 100))
    err = _read_error(backup)
    assert isinstance(err, ChecksumError)
    assert err.path == str(seg) and err.offset == seg.stat().st_size - 8
    assert str(seg) in str(err) and "at byte" in str(err)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_segment(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, lambda d: d[: len(d) - 100])
    err = _read_error(backup)
    assert isinstance(err, TruncatedSegmentError) and err.path == str(seg)
    assert err.offset == seg.stat().st_size
    # without the manifest's size the footer check still catches it
    m = manifest(backup)
    for t in m["topics"]:
        for p in t["partitions"]:
            for s in p["segments"]:
                del s["compressed_size"]
    (backup / "manifest.json").write_text(json.dumps(m))
    err = _read_error(backup)
    assert isinstance(err, BadMagicError) and err.offset == seg.stat().st_size - 4


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_magic(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, lambda d: bytearray(b"XBAK") + d[4:])
    err = _read_error(backup)
    assert isinstance(err, BadMagicError) and err.path == str(seg) and err.offset == 0
    assert "KBAK" in str(err)


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_end_magic(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, lambda d: d[:-4] + b"BKAF")
    err = _read_error(backup)
    assert isinstance(err, BadMagicError) and err.offset == seg.stat().st_size - 4


@pytest.mark.parametrize("codec", CODECS)
def test_unknown_codec_byte(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)

    def fn(d: bytearray) -> bytearray:
        d[5] = 7
        return refresh_crc(d)

    seg = _damage(backup, fn)
    err = _read_error(backup)
    assert isinstance(err, UnsupportedCodecError) and err.path == str(seg) and err.offset == 5


@pytest.mark.parametrize(("codec", "other"), [("zstd", 2), ("lz4", 1), ("none", 1), ("zstd", 0)])
def test_codec_byte_of_another_codec(conformance: Path, tmp_path: Path, codec: str, other: int) -> None:
    """A valid but wrong codec code: CRC error; with the CRC refreshed, a decode error at the body."""
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, lambda d: d[:5] + bytes([other]) + d[6:])
    assert isinstance(_read_error(backup), ChecksumError)
    _damage(backup, refresh_crc)
    err = _read_error(backup)
    assert isinstance(err, (DecompressionError, RecordFormatError, TruncatedSegmentError, SegmentMismatchError))
    assert err.path == str(seg) and err.offset is not None
    # quick validate compares the header's codec with the manifest's compression
    report = validate_backup(str(backup))
    assert not report.ok and any("codec" in d.message for d in report.defects)


def _cols(n: int = 50, size: int = 100) -> RecordColumns:
    return RecordColumns.from_records([
        {"offset": 10 + i, "timestamp": 1_700_000_000_000 + i, "key": b"k%d" % i, "value": b"v" * size,
         "headers": [("h", None), ("x", b"1")]} for i in range(n)])


@pytest.mark.parametrize("codec", [OsoCodec.ZSTD, OsoCodec.LZ4])
def test_decompression_bomb_refused(conformance: Path, tmp_path: Path, codec: OsoCodec) -> None:
    """A segment that inflates beyond the manifest's uncompressed_size is refused before allocation."""
    backup = copy_vector(conformance, OsoCodec(codec).name.lower(), tmp_path)
    seg = segment_files(backup)[0]
    cols = _cols(2000, 20_000)  # 40 MB of very compressible records
    data, stats = encode_segment(cols, codec)
    assert len(data) < 1_000_000 < stats.uncompressed_size
    seg.write_bytes(data)
    m = manifest(backup)
    s = m["topics"][0]["partitions"][0]["segments"][0]
    s.update(start_offset=10, end_offset=2009, record_count=2000, compressed_size=len(data), uncompressed_size=5000)
    (backup / "manifest.json").write_text(json.dumps(m))
    err = _read_error(backup)
    assert isinstance(err, DecompressionError) and err.path == str(seg) and err.offset == HEADER_SIZE
    assert "5000" in str(err) and "bomb" in str(err)
    # the cap applies without a manifest value too
    with pytest.raises(DecompressionError, match="bomb"):
        decode_segment(data, "x.bin", max_uncompressed=1_000_000)


def test_lz4_size_prefix_lies() -> None:
    raw = encode_records(_cols())
    body = (len(raw) + 10).to_bytes(4, "little") + lz4.block.compress(raw, store_size=False)
    data = bytearray(assemble(OsoCodec.NONE, body, 50, 10, 59))
    data[5] = int(OsoCodec.LZ4)
    with pytest.raises(DecompressionError) as info:
        decode_segment(bytes(refresh_crc(data)), "s.bin.lz4")
    assert info.value.offset == HEADER_SIZE


def test_zstd_without_content_size_is_bounded() -> None:
    raw = encode_records(_cols(200, 5000))
    body = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    data = assemble(OsoCodec.NONE, body, 200, 10, 209)
    data = bytearray(data)
    data[5] = int(OsoCodec.ZSTD)
    data = bytes(refresh_crc(data))
    assert len(list(decode_segment(data, "s.bin.zst").iter_columns())) >= 1
    with pytest.raises(DecompressionError, match="more than the allowed"):
        decode_segment(data, "s.bin.zst", max_uncompressed=len(raw) - 1)


@pytest.mark.parametrize(("field", "at", "value"), [("count", 8, 49), ("start", 16, 11), ("end", 24, 60)])
def test_header_fields_checked_against_records(field: str, at: int, value: int) -> None:
    data, _ = encode_segment(_cols(), OsoCodec.NONE)
    data = bytearray(data)
    data[at : at + 8] = struct.pack("<q", value)
    with pytest.raises(SegmentMismatchError) as info:
        decode_segment(bytes(refresh_crc(data)), "s.bin")
    assert info.value.offset == at


def test_record_defects_located_in_uncompressed_segment() -> None:
    data, _ = encode_segment(_cols(3, 10), OsoCodec.NONE)
    rec_len = int.from_bytes(data[HEADER_SIZE : HEADER_SIZE + 4], "little")
    second = HEADER_SIZE + 4 + rec_len
    bad = bytearray(data)
    bad[second + 4 + 16 : second + 4 + 20] = struct.pack("<i", -5)  # key length -5
    with pytest.raises(RecordFormatError) as info:
        decode_segment(bytes(refresh_crc(bad)), "s.bin")
    assert info.value.offset == second + 20 and "record 1" in str(info.value)
    bad = bytearray(data)
    bad[second : second + 4] = struct.pack("<I", rec_len + 1)  # record length too long
    with pytest.raises(RecordFormatError) as info:
        decode_segment(bytes(refresh_crc(bad)), "s.bin")
    assert info.value.offset == second
    # offsets going backwards
    cols = _cols(3, 10)
    cols.offsets[:] = [5, 4, 6]
    raw = encode_records(cols)
    with pytest.raises(RecordFormatError, match="strictly increase"):
        decode_segment(assemble(OsoCodec.ZSTD, raw, 3, 5, 6), "s.bin.zst")


def test_header_and_footer_too_short() -> None:
    with pytest.raises(TruncatedSegmentError):
        decode_segment(b"KBAK\x01\x00", "s.bin")
    data, _ = encode_segment(_cols(1, 1), OsoCodec.NONE)
    with pytest.raises(TruncatedSegmentError):
        decode_segment(data[:36], "s.bin")
    with pytest.raises(SegmentFormatError, match="version"):
        decode_segment(data[:4] + b"\x02" + data[5:], "s.bin", verify_checksum=False)


@pytest.mark.parametrize("codec", CODECS)
def test_cli_reports_defect_with_file_and_offset(conformance: Path, tmp_path: Path, codec: str) -> None:
    backup = copy_vector(conformance, codec, tmp_path)
    seg = _damage(backup, _flip(HEADER_SIZE + 10))
    runner = CliRunner()
    res = runner.invoke(cli, ["validate", str(backup), "--deep"])
    assert res.exit_code == 1
    assert "ChecksumError" in res.output and seg.name in res.output and "at byte" in res.output
    res = runner.invoke(cli, ["validate", str(backup)])  # quick does not read bodies
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["cat", str(backup)])
    assert res.exit_code == 2 and seg.name in res.output and "CRC-32" in res.output


def test_quick_validate_catches_header_manifest_disagreement(conformance: Path, tmp_path: Path) -> None:
    backup = copy_vector(conformance, "zstd", tmp_path)
    m = manifest(backup)
    m["topics"][1]["partitions"][0]["segments"][1]["record_count"] = 299
    (backup / "manifest.json").write_text(json.dumps(m))
    report = validate_backup(str(backup))
    assert [d.error for d in report.defects] == ["SegmentMismatchError"]
    assert "at byte 8" in report.defects[0].message


def test_legacy_json_segments(tmp_path: Path) -> None:
    """Old releases wrote a JSON array per segment, compressed by file extension."""
    import base64

    recs = [{"key": base64.b64encode(b"k1").decode(), "value": base64.b64encode(b"v1").decode(),
             "headers": [{"key": "h", "value": base64.b64encode(b"x").decode()}], "timestamp": 5, "offset": 3},
            {"key": None, "value": None, "headers": [], "timestamp": 4, "offset": 4}]
    raw = json.dumps(recs).encode()
    for name, data in (("segment-000001.bin", raw),
                       ("segment-000001.bin.zst", zstandard.ZstdCompressor().compress(raw)),
                       ("segment-000001.bin.lz4", len(raw).to_bytes(4, "little") + lz4.block.compress(raw, store_size=False))):
        seg = decode_segment(data, name)
        assert seg.legacy and [r for c in seg.iter_columns() for r in c.records()] == [
            {"offset": 3, "timestamp": 5, "key": b"k1", "value": b"v1", "headers": [("h", b"x")]},
            {"offset": 4, "timestamp": 4, "key": None, "value": None, "headers": []}]
    with pytest.raises(RecordFormatError, match="legacy record 0"):
        decode_segment(b'[{"offset": "x"}]', "segment-1.bin")
    with pytest.raises(BadMagicError):
        decode_segment(b"garbage that is not json", "segment-1.bin")
