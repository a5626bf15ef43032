"""Segments in the layout the OSO kafka-backup tool writes ("oso-native"): bytes <-> records.

Pure: no I/O, no fsspec, no pyarrow. See ``docs/formats.md`` for the layout::

    header (32)  b"KBAK", u8 version=1, u8 codec (0 none, 1 zstd, 2 lz4), 2 reserved,
                 u64 record count, i64 start offset, i64 end offset   (all little-endian)
    body         every record of the segment, compressed as ONE unit
                 (zstd: one zstd frame; lz4: u32 LE uncompressed size + one raw LZ4 block)
    footer (8)   u32 CRC-32 (zlib) of header + body, b"BKAE"

Records in the decompressed body, back to back: ``u32 length of the rest``, ``i64 timestamp``,
``i64 offset``, ``i32 key length (-1 null)`` + key, ``i32 value length`` + value, ``u16 header
count``, per header ``u16 key length`` + key, ``i32 value length (-1 null)`` + value.

Old releases wrote "legacy" segments: a JSON array of records, compressed according to the
file extension. :func:`decode_segment` reads both.
"""

from __future__ import annotations

import base64
import enum
import functools
import json
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import lz4.block
import lz4.frame
import numpy as np
import zstandard

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
from fsspec_kbs.format.codecs import zstd_frame_length
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.kernels import copy_bytes, kernel, put_field
from fsspec_kbs.format.segment import BatchInfo, Decoded, DecodeTask

MAGIC = b"KBAK"
END_MAGIC = b"BKAE"
VERSION = 1
HEADER_SIZE = 32
FOOTER_SIZE = 8
MIN_RECORD_SIZE = 30  # u32 len + i64 ts + i64 offset + i32 key len + i32 value len + u16 headers
#: Refuse to decompress more than this when the manifest gives no ``uncompressed_size``. The tool
#: rotates segments at 128 MiB of records; 1 GiB leaves ample room and still bounds memory.
DEFAULT_MAX_UNCOMPRESSED = 1 << 30
#: Largest record length a u32 can declare; also bounds single fields.
_U32_MAX = 0xFFFFFFFF
_HEADER = struct.Struct("<4sBBHQqq")
_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class OsoCodec(enum.IntEnum):
    """Compression codes of the oso-native segment header (not the same as KBS's)."""

    NONE = 0
    ZSTD = 1
    LZ4 = 2


OSO_CODEC_NAMES = {OsoCodec.NONE: "none", OsoCodec.ZSTD: "zstd", OsoCodec.LZ4: "lz4"}
OSO_CODEC_BY_NAME = {v: k for k, v in OSO_CODEC_NAMES.items()}
#: Segment file suffix per codec, as the tool names them.
EXTENSIONS = {OsoCodec.NONE: ".bin", OsoCodec.ZSTD: ".bin.zst", OsoCodec.LZ4: ".bin.lz4"}


def oso_codec_from_name(name: str) -> OsoCodec:
    try:
        return OSO_CODEC_BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unknown compression {name!r}; use one of {sorted(OSO_CODEC_BY_NAME)}") from None


def segment_file_name(start_offset: int, codec: OsoCodec) -> str:
    """``segment-<start offset, 20 digits>.bin[.zst|.lz4]``, the tool's current naming."""
    return f"segment-{start_offset:020d}{EXTENSIONS[codec]}"


def codec_from_extension(name: str) -> OsoCodec:
    if name.endswith(".zst"):
        return OsoCodec.ZSTD
    if name.endswith(".lz4"):
        return OsoCodec.LZ4
    return OsoCodec.NONE


@dataclass(frozen=True)
class OsoHeader:
    version: int
    codec: OsoCodec
    record_count: int
    start_offset: int
    end_offset: int

    @classmethod
    def parse(cls, data: bytes | memoryview, path: str | None = None) -> OsoHeader:
        """Parse and check the 32-byte header (magic, version, codec)."""
        if len(data) < 4 or bytes(data[:4]) != MAGIC:
            raise BadMagicError(f"segment does not start with {MAGIC!r} (got {bytes(data[:4])!r})", path, 0)
        if len(data) < HEADER_SIZE:
            raise TruncatedSegmentError(f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header",
                                        path, len(data))
        _, version, codec, _reserved, count, start, end = _HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise SegmentFormatError(f"segment version {version} is not supported (this reader knows {VERSION})",
                                     path, 4)
        try:
            oc = OsoCodec(codec)
        except ValueError:
            raise UnsupportedCodecError(f"unknown compression code {codec} (known: 0 none, 1 zstd, 2 lz4)",
                                        path, 5) from None
        return cls(version, oc, count, start, end)

    def to_bytes(self) -> bytes:
        return _HEADER.pack(MAGIC, self.version, int(self.codec), 0, self.record_count, self.start_offset,
                            self.end_offset)


def check_footer(data: bytes | memoryview, path: str | None = None, verify_checksum: bool = True) -> None:
    """Check the end magic and (optionally) the CRC-32 over header + body."""
    size = len(data)
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise TruncatedSegmentError(
            f"file is {size} bytes, too short for the {HEADER_SIZE}-byte header and {FOOTER_SIZE}-byte footer",
            path, size)
    if bytes(data[size - 4 :]) != END_MAGIC:
        raise BadMagicError(f"segment does not end with {END_MAGIC!r} (got {bytes(data[size - 4:])!r}): "
                            "truncated or not an oso-native segment", path, size - 4)
    if verify_checksum:
        stored = int.from_bytes(data[size - FOOTER_SIZE : size - 4], "little")
        actual = zlib.crc32(memoryview(data)[: size - FOOTER_SIZE])
        if stored != actual:
            raise ChecksumError(f"CRC-32 {actual:#010x} of header and body differs from the footer's "
                                f"{stored:#010x}", path, size - FOOTER_SIZE)


def decompress_body(codec: OsoCodec, body: bytes | memoryview, max_size: int, path: str | None = None,
                    at: int = HEADER_SIZE) -> bytes | memoryview:
    """Decompress a segment body, refusing to produce more than ``max_size`` bytes.

    ``at`` is the body's byte offset in the file, for error locations.
    """
    if codec == OsoCodec.NONE:
        if len(body) > max_size:
            raise DecompressionError(f"body is {len(body)} bytes, above the allowed {max_size}", path, at)
        return body  # no copy: the records are decoded straight from the file's bytes
    if codec == OsoCodec.ZSTD:
        return _zstd(body, max_size, path, at)
    if len(body) < 4:
        raise TruncatedSegmentError("lz4 body shorter than its 4-byte size prefix", path, at)
    declared = int.from_bytes(body[:4], "little")
    if declared > max_size:
        raise DecompressionError(f"lz4 body declares {declared} uncompressed bytes, above the allowed "
                                 f"{max_size} (decompression bomb?)", path, at)
    try:
        out = lz4.block.decompress(memoryview(body)[4:], uncompressed_size=declared) if declared else b""
    except lz4.block.LZ4BlockError as e:
        raise DecompressionError(f"invalid LZ4 block (declared {declared} bytes): {e}", path, at + 4) from e
    if len(out) != declared:
        raise DecompressionError(f"LZ4 block decompressed to {len(out)} bytes but its prefix says {declared}",
                                 path, at)
    return out


def _zstd(body: bytes | memoryview, max_size: int, path: str | None, at: int) -> bytes:
    length = zstd_frame_length(body)
    if length != len(body):
        # The body is one zstd frame: bytes after it (or a frame running past it) are damage.
        raise DecompressionError("the body is not exactly one zstd frame" if length < 0 else
                                 f"{len(body) - length} bytes after the body's zstd frame", path,
                                 at if length < 0 else at + length)
    try:
        declared = zstandard.frame_content_size(body)
    except zstandard.ZstdError as e:
        raise DecompressionError(f"invalid zstd frame: {e}", path, at) from e
    if declared > max_size:
        raise DecompressionError(f"zstd frame declares {declared} uncompressed bytes, above the allowed "
                                 f"{max_size} (decompression bomb?)", path, at)
    if declared >= 0:
        # zstd allocates exactly the declared size and fails unless the content matches it.
        try:
            return zstandard.ZstdDecompressor().decompress(body, max_output_size=max(declared, 1))
        except zstandard.ZstdError as e:
            raise DecompressionError(f"zstd frame does not decompress to its declared {declared} bytes: {e}",
                                     path, at) from e
    # No declared size: stream, so that a bomb is stopped after max_size bytes, not allocated.
    reader = zstandard.ZstdDecompressor().stream_reader(bytes(body), read_across_frames=False)
    chunks = []
    total = 0
    try:
        while True:
            chunk = reader.read(1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_size:
                raise DecompressionError(f"zstd frame decompresses to more than the allowed {max_size} bytes "
                                         "(decompression bomb?)", path, at)
            chunks.append(chunk)
    except zstandard.ZstdError as e:
        raise DecompressionError(f"invalid zstd frame: {e}", path, at) from e
    return b"".join(chunks)


# -- record kernels --------------------------------------------------------------------------------

OK = 0
E_TRUNCATED = 1
E_LENGTH = 2
E_RECORD_SIZE = 3
E_TOO_MANY = 4
E_OFFSET_ORDER = 5

_MESSAGES = {
    E_TRUNCATED: "record runs past the end of the records",
    E_LENGTH: "negative length other than -1",
    E_RECORD_SIZE: "fields do not fill the record's declared length exactly",
    E_TOO_MANY: "more records than the segment header's record count",
    E_OFFSET_ORDER: "record offsets must strictly increase",
}


@kernel
def _u16(buf, p):  # type: ignore[no-untyped-def]
    return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)


@kernel
def _u32(buf, p):  # type: ignore[no-untyped-def]
    return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 24)


@kernel
def _i32(buf, p):  # type: ignore[no-untyped-def]
    v = _u32(buf, p)
    return v - 4294967296 if v >= 2147483648 else v


@kernel
def _i64(buf, p):  # type: ignore[no-untyped-def]
    lo = _u32(buf, p)
    hi = _i32(buf, p + 4)
    return hi * 4294967296 + lo


@kernel
def scan_oso_records(buf, start, end, cap, pos, cum):  # type: ignore[no-untyped-def]
    """Validate the records in ``buf[start:end]``; at most ``cap`` of them.

    Fills ``pos[i]`` (start of record i, ``pos[n]`` = end) and ``cum[:, i + 1]`` running totals of
    (key bytes, value bytes, headers, header key bytes, header value bytes). Returns
    (code, error position, record count).
    """
    p = start
    n = 0
    prev = 0
    while p < end:
        rec = p
        if n >= cap:
            return E_TOO_MANY, rec, n
        if end - p < 4:
            return E_TRUNCATED, rec, n
        length = _u32(buf, p)
        p += 4
        if length > end - p:
            return E_TRUNCATED, rec, n
        rend = p + length
        if rend - p < 26:
            return E_RECORD_SIZE, rec, n
        off = _i64(buf, p + 8)
        if n > 0 and off <= prev:
            return E_OFFSET_ORDER, rec, n
        prev = off
        p += 16
        kb = 0
        vb = 0
        for field in range(2):
            if rend - p < 4:
                return E_RECORD_SIZE, p, n
            ln = _i32(buf, p)
            if ln < -1:
                return E_LENGTH, p, n
            p += 4
            if ln > 0:
                if ln > rend - p:
                    return E_RECORD_SIZE, p - 4, n
                p += ln
                if field == 0:
                    kb = ln
                else:
                    vb = ln
        if rend - p < 2:
            return E_RECORD_SIZE, p, n
        hc = _u16(buf, p)
        p += 2
        hkb = 0
        hvb = 0
        for _h in range(hc):
            if rend - p < 6:
                return E_RECORD_SIZE, p, n
            ln = _u16(buf, p)
            p += 2
            if ln > rend - p:
                return E_RECORD_SIZE, p - 2, n
            p += ln
            hkb += ln
            if rend - p < 4:
                return E_RECORD_SIZE, p, n
            ln = _i32(buf, p)
            if ln < -1:
                return E_LENGTH, p, n
            p += 4
            if ln > 0:
                if ln > rend - p:
                    return E_RECORD_SIZE, p - 4, n
                p += ln
                hvb += ln
        if p != rend:
            return E_RECORD_SIZE, rec, n
        pos[n] = rec
        cum[0, n + 1] = cum[0, n] + kb
        cum[1, n + 1] = cum[1, n] + vb
        cum[2, n + 1] = cum[2, n] + hc
        cum[3, n + 1] = cum[3, n] + hkb
        cum[4, n + 1] = cum[4, n] + hvb
        n += 1
    pos[n] = p
    return OK, 0, n


@kernel
def fill_oso_records(  # type: ignore[no-untyped-def]
    buf, pos, i0, i1,
    offsets, timestamps,
    key_offsets, key_data, key_valid,
    value_offsets, value_data, value_valid,
    header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid,
):
    """Decode records ``i0:i1`` (already validated by :func:`scan_oso_records`) into rows 0…"""
    h = 0
    for i in range(i0, i1):
        r = i - i0
        p = pos[i] + 4
        timestamps[r] = _i64(buf, p)
        offsets[r] = _i64(buf, p + 8)
        p += 16
        p = put_field(key_data, key_offsets, key_valid, r, buf, p + 4, _i32(buf, p))
        p = put_field(value_data, value_offsets, value_valid, r, buf, p + 4, _i32(buf, p))
        hc = _u16(buf, p)
        p += 2
        for _h in range(hc):
            ln = _u16(buf, p)
            p += 2
            a = hkey_offsets[h]
            copy_bytes(hkey_data, a, buf, p, ln)
            p += ln
            hkey_offsets[h + 1] = a + ln
            p = put_field(hvalue_data, hvalue_offsets, hvalue_valid, h, buf, p + 4, _i32(buf, p))
            h += 1
        header_offsets[r + 1] = header_offsets[r] + hc


@kernel
def _put(out, p, v, nbytes):  # type: ignore[no-untyped-def]
    for b in range(nbytes):
        out[p + b] = (v >> (8 * b)) & 0xFF
    return p + nbytes


@kernel
def encode_oso_records(  # type: ignore[no-untyped-def]
    out, n, offsets, timestamps,
    key_offsets, key_data, key_valid,
    value_offsets, value_data, value_valid,
    header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid,
):
    """Write ``n`` records into ``out`` (sized by the caller); returns the bytes written."""
    p = 0
    for r in range(n):
        start = p
        p += 4
        p = _put(out, p, timestamps[r], 8)
        p = _put(out, p, offsets[r], 8)
        if key_valid[r]:
            a = key_offsets[r]
            ln = key_offsets[r + 1] - a
            p = _put(out, p, ln, 4)
            copy_bytes(out, p, key_data, a, ln)
            p += ln
        else:
            p = _put(out, p, -1, 4)
        if value_valid[r]:
            a = value_offsets[r]
            ln = value_offsets[r + 1] - a
            p = _put(out, p, ln, 4)
            copy_bytes(out, p, value_data, a, ln)
            p += ln
        else:
            p = _put(out, p, -1, 4)
        h0 = header_offsets[r]
        h1 = header_offsets[r + 1]
        p = _put(out, p, h1 - h0, 2)
        for h in range(h0, h1):
            a = hkey_offsets[h]
            ln = hkey_offsets[h + 1] - a
            p = _put(out, p, ln, 2)
            copy_bytes(out, p, hkey_data, a, ln)
            p += ln
            if hvalue_valid[h]:
                a = hvalue_offsets[h]
                ln = hvalue_offsets[h + 1] - a
                p = _put(out, p, ln, 4)
                copy_bytes(out, p, hvalue_data, a, ln)
                p += ln
            else:
                p = _put(out, p, -1, 4)
        _put(out, start, p - start - 4, 4)
    return p


# -- decoding --------------------------------------------------------------------------------------

def _as_u8(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return data.view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


class OsoRecords:
    """Validated records of one decompressed body, decodable in chunks of rows.

    Parameters
    ----------
    body : bytes
        Decompressed records.
    expected_count : int, optional
        The header's record count (bounds the index; more records is an error).
    path : str, optional
        File name for errors.
    at : int, optional
        Byte offset of the body in the file. For an uncompressed body errors point at the exact
        byte; for a compressed one at the body's start, and the message names the position in
        the decompressed records.
    compressed : bool
        Whether ``body`` was decompressed (changes how error positions are reported).
    """

    def __init__(self, body: bytes | memoryview | np.ndarray, expected_count: int | None = None,
                 path: str | None = None, at: int = HEADER_SIZE, compressed: bool = False) -> None:
        self.buf = _as_u8(body)
        self.path = path
        size = len(self.buf)
        cap = size // MIN_RECORD_SIZE
        if expected_count is not None:
            cap = min(cap, expected_count)
        self.pos = np.zeros(cap + 1, dtype=np.int64)
        self.cum = np.zeros((5, cap + 1), dtype=np.int64)
        code, err, n = scan_oso_records(self.buf, 0, size, cap, self.pos, self.cum)
        if code != OK:
            if code == E_TOO_MANY and (expected_count is None or cap < expected_count):
                code = E_TRUNCATED  # bytes left that cannot form a whole record
            reason = _MESSAGES[code]
            if code == E_TOO_MANY:
                raise SegmentMismatchError(f"{reason} ({expected_count}): record {n} starts at byte {err} "
                                           "of the records", path, 8)
            if compressed:
                raise RecordFormatError(f"record {n}, at byte {err} of the decompressed records: {reason}", path, at)
            raise RecordFormatError(f"record {n}: {reason}", path, at + int(err))
        self.count = int(n)
        self.pos = self.pos[: n + 1]
        self.cum = self.cum[:, : n + 1]

    def __len__(self) -> int:
        return self.count

    @property
    def first_offset(self) -> int | None:
        return None if not self.count else int(_i64(self.buf, int(self.pos[0]) + 12))

    @property
    def last_offset(self) -> int | None:
        return None if not self.count else int(_i64(self.buf, int(self.pos[self.count - 1]) + 12))

    def columns(self, i0: int = 0, i1: int | None = None) -> RecordColumns:
        """Rows ``i0:i1`` as :class:`RecordColumns`."""
        i1 = self.count if i1 is None else i1
        n = i1 - i0
        kb, vb, nh, hkb, hvb = (int(x) for x in self.cum[:, i1] - self.cum[:, i0])
        if max(kb, vb, hkb, hvb) > 2**31 - 1:
            raise RecordFormatError(f"records {i0}…{i1} hold more than 2 GiB in one column", self.path)
        cols = RecordColumns(
            offsets=np.empty(n, np.int64), timestamps=np.empty(n, np.int64),
            key_offsets=np.zeros(n + 1, np.int32), key_data=np.empty(kb, np.uint8),
            key_valid=np.empty(n, np.bool_),
            value_offsets=np.zeros(n + 1, np.int32), value_data=np.empty(vb, np.uint8),
            value_valid=np.empty(n, np.bool_),
            header_offsets=np.zeros(n + 1, np.int32), header_key_offsets=np.zeros(nh + 1, np.int32),
            header_key_data=np.empty(hkb, np.uint8), header_value_offsets=np.zeros(nh + 1, np.int32),
            header_value_data=np.empty(hvb, np.uint8), header_value_valid=np.empty(nh, np.bool_),
        )
        fill_oso_records(
            self.buf, self.pos, i0, i1, cols.offsets, cols.timestamps,
            cols.key_offsets, cols.key_data, cols.key_valid,
            cols.value_offsets, cols.value_data, cols.value_valid,
            cols.header_offsets, cols.header_key_offsets, cols.header_key_data,
            cols.header_value_offsets, cols.header_value_data, cols.header_value_valid,
        )
        return cols

    def chunk_bounds(self, max_chunk_bytes: int) -> Iterator[tuple[int, int]]:
        """Row ranges of about ``max_chunk_bytes`` of record data (at least one row each)."""
        i = 0
        while i < self.count:
            limit = int(self.pos[i]) + max(1, max_chunk_bytes)
            j = int(np.searchsorted(self.pos, limit, side="right")) - 1
            j = min(max(j, i + 1), self.count)
            yield i, j
            i = j

    def iter_columns(self, max_chunk_bytes: int = 32 * 1024 * 1024) -> Iterator[RecordColumns]:
        """Rows in chunks of about ``max_chunk_bytes`` of record data (at least one row each)."""
        for i, j in self.chunk_bounds(max_chunk_bytes):
            yield self.columns(i, j)


@dataclass(frozen=True)
class OsoSegment:
    """A decoded oso-native segment (binary or legacy JSON)."""

    header: OsoHeader | None  # None for a legacy JSON segment
    records: OsoRecords | None
    legacy_columns: RecordColumns | None
    uncompressed_size: int

    @property
    def legacy(self) -> bool:
        return self.header is None

    def __len__(self) -> int:
        return len(self.legacy_columns) if self.records is None else len(self.records)  # type: ignore[arg-type]

    def iter_columns(self, max_chunk_bytes: int = 32 * 1024 * 1024) -> Iterator[RecordColumns]:
        if self.records is not None:
            yield from self.records.iter_columns(max_chunk_bytes)
        elif self.legacy_columns is not None and len(self.legacy_columns):
            yield self.legacy_columns


class OsoChunks:
    """A decoded segment as decode tasks (a ``ChunkSource``): each copies a run of rows into
    columns. Decoding the segment checked everything, so the in-order checks have nothing to do."""

    def __init__(self, seg: OsoSegment) -> None:
        self.seg = seg

    def decode_tasks(self, max_chunk_bytes: int, views: bool = False) -> Iterator[DecodeTask]:
        records, legacy = self.seg.records, self.seg.legacy_columns
        if records is not None:
            for i, j in records.chunk_bounds(max_chunk_bytes):
                yield [], functools.partial(_unchecked, records.columns, i, j)
        elif legacy is not None and len(legacy):
            yield [], functools.partial(_unchecked, lambda: legacy)

    def check_first(self, group: Sequence[BatchInfo]) -> None:
        pass

    def check_order(self, group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns, prev_last: int) -> int:
        return prev_last

    def join_crc64(self, shares: list[int], groups: list[Sequence[BatchInfo]]) -> int:
        return 0

    def check_end(self, crc: int, last: int) -> None:
        pass


def _unchecked(fn: Callable[..., RecordColumns], *args: int) -> Decoded:
    return fn(*args), 0


def decode_segment(data: bytes | memoryview, path: str | None = None, *, verify_checksum: bool = True,
                   max_uncompressed: int | None = None, name: str | None = None) -> OsoSegment:
    """Check and decode a whole oso-native segment file.

    Parameters
    ----------
    data : bytes
        The whole file.
    path : str, optional
        File name for errors.
    verify_checksum : bool, default True
        Check the footer's CRC-32.
    max_uncompressed : int, optional
        Refuse bodies that decompress to more (the manifest's ``uncompressed_size``); default
        :data:`DEFAULT_MAX_UNCOMPRESSED`.
    name : str, optional
        File name whose extension picks the codec of a legacy JSON segment (default: ``path``).

    Raises
    ------
    SegmentFormatError
        Any defect, with the file and byte offset.
    """
    limit = DEFAULT_MAX_UNCOMPRESSED if max_uncompressed is None else max_uncompressed
    if len(data) >= 4 and bytes(data[:4]) != MAGIC:
        return _decode_legacy(data, path, name or path or "", limit)
    header = OsoHeader.parse(data, path)
    check_footer(data, path, verify_checksum)
    body = memoryview(data)[HEADER_SIZE : len(data) - FOOTER_SIZE]
    raw = decompress_body(header.codec, body, limit, path, HEADER_SIZE)
    recs = OsoRecords(raw, header.record_count, path, HEADER_SIZE, compressed=header.codec != OsoCodec.NONE)
    check_header_against(header, recs, path)
    return OsoSegment(header, recs, None, len(raw))


def check_header_against(header: OsoHeader, recs: OsoRecords, path: str | None) -> None:
    """The header's count and start/end offsets must describe the records."""
    if recs.count != header.record_count:
        raise SegmentMismatchError(f"header says {header.record_count} records but the body holds {recs.count}",
                                   path, 8)
    if recs.count:
        if recs.first_offset != header.start_offset:
            raise SegmentMismatchError(f"header start offset {header.start_offset} but the first record's "
                                       f"offset is {recs.first_offset}", path, 16)
        if recs.last_offset != header.end_offset:
            raise SegmentMismatchError(f"header end offset {header.end_offset} but the last record's "
                                       f"offset is {recs.last_offset}", path, 24)


# -- legacy JSON segments ----------------------------------------------------------------------------

def _decode_legacy(data: bytes | memoryview, path: str | None, name: str, limit: int) -> OsoSegment:
    """A file without ``KBAK``: an old release's JSON array, or else a segment with a bad magic."""
    codec = codec_from_extension(name)
    head = bytes(data[:4])
    # Only a recognisable compressed frame makes its decompression errors legacy-segment errors;
    # anything else that fails is simply not a segment (a wrong magic).
    genuine = (codec == OsoCodec.ZSTD and head == _ZSTD_MAGIC) or (codec == OsoCodec.LZ4 and head == _LZ4_FRAME_MAGIC)

    def not_a_segment(why: str) -> BadMagicError:
        return BadMagicError(f"segment does not start with {MAGIC!r} (got {head!r}) and is not a legacy JSON "
                             f"segment either ({why})", path, 0)

    try:
        if codec == OsoCodec.LZ4 and head == _LZ4_FRAME_MAGIC:
            dec = lz4.frame.LZ4FrameDecompressor()
            try:
                raw = dec.decompress(bytes(data), max_length=limit + 1)
            except RuntimeError as e:
                raise DecompressionError(f"invalid lz4 frame: {e}", path, 0) from e
            if len(raw) > limit:
                raise DecompressionError(f"legacy segment decompresses to more than the allowed {limit} bytes "
                                         "(decompression bomb?)", path, 0)
        else:
            raw = bytes(decompress_body(codec, data, limit, path, 0))
    except SegmentFormatError as e:
        if genuine:
            raise
        raise not_a_segment(e.reason) from e
    if not raw.lstrip(b" \t\r\n")[:1] == b"[":
        raise not_a_segment("no JSON array inside")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        pos = getattr(e, "pos", 0) if codec == OsoCodec.NONE else 0
        raise RecordFormatError(f"legacy JSON segment is not valid JSON: {e}", path, pos) from e
    if not isinstance(doc, list):
        raise RecordFormatError("legacy JSON segment is not a JSON array of records", path, 0)
    rows = []
    prev = None
    for i, r in enumerate(doc):
        try:
            offset = int(r["offset"])
            if prev is not None and offset <= prev:
                raise ValueError("record offsets must strictly increase")
            prev = offset
            rows.append({
                "offset": offset, "timestamp": int(r["timestamp"]),
                "key": _b64(r.get("key")), "value": _b64(r.get("value")),
                "headers": [(str(h["key"]), _b64(h.get("value"))) for h in (r.get("headers") or [])],
            })
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RecordFormatError(f"legacy record {i} is malformed: {e!r}", path, 0) from e
    cols = RecordColumns.from_records(rows)
    return OsoSegment(None, None, cols, len(raw))


def _b64(v: object) -> bytes | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise TypeError(f"expected a base64 string or null, got {type(v).__name__}")
    return base64.b64decode(v, validate=True)


# -- encoding --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OsoSegmentStats:
    """What the manifest says of a segment the encoder wrote."""

    record_count: int
    start_offset: int
    end_offset: int
    start_timestamp: int
    end_timestamp: int
    uncompressed_size: int
    compressed_size: int


def _lengths(offsets: np.ndarray, valid: np.ndarray) -> np.ndarray:
    lens = np.diff(offsets.astype(np.int64))
    return np.where(valid, lens, 0)


def encode_records(cols: RecordColumns) -> bytes:
    """The records of ``cols`` in the oso-native record format (the uncompressed body).

    A null header value is written with length -1, which the format allows and the tool's
    reader accepts; the tool itself would have written an empty value instead. Keeping -1
    keeps conversions lossless.
    """
    n = len(cols)
    if n == 0:
        return b""
    h0, h1 = int(cols.header_offsets[0]), int(cols.header_offsets[n])
    hk = np.diff(cols.header_key_offsets[h0 : h1 + 1].astype(np.int64))
    if len(hk) and int(hk.max()) > 0xFFFF:
        raise ValueError("a header key is longer than 65535 bytes, which the oso-native format cannot hold")
    hcount = np.diff(cols.header_offsets.astype(np.int64))
    if n and int(hcount.max()) > 0xFFFF:
        raise ValueError("a record has more than 65535 headers, which the oso-native format cannot hold")
    hv = _lengths(cols.header_value_offsets[h0 : h1 + 1], cols.header_value_valid[h0:h1])
    per_header = 6 + hk + hv
    hsum = np.zeros(n, dtype=np.int64)
    if h1 > h0:
        csum = np.concatenate([[0], np.cumsum(per_header)])
        hsum = csum[cols.header_offsets[1:].astype(np.int64) - h0] - csum[cols.header_offsets[:-1].astype(np.int64) - h0]
    rec = (MIN_RECORD_SIZE - 4 + _lengths(cols.key_offsets, cols.key_valid)
           + _lengths(cols.value_offsets, cols.value_valid) + hsum)
    if int(rec.max()) > _U32_MAX:
        raise ValueError("a record is larger than 4 GiB, which the oso-native format cannot hold")
    total = int(rec.sum()) + 4 * n
    out = np.empty(total, dtype=np.uint8)
    written = encode_oso_records(
        out, n, cols.offsets, cols.timestamps,
        cols.key_offsets, cols.key_data, cols.key_valid,
        cols.value_offsets, cols.value_data, cols.value_valid,
        cols.header_offsets, cols.header_key_offsets, cols.header_key_data,
        cols.header_value_offsets, cols.header_value_data, cols.header_value_valid,
    )
    assert written == total
    return out.tobytes()


def compress_body(codec: OsoCodec, raw: bytes, level: int | None = None) -> bytes:
    """Compress a whole body as the tool does (one zstd frame / size-prefixed LZ4 block)."""
    if codec == OsoCodec.NONE:
        return raw
    if codec == OsoCodec.ZSTD:
        return zstandard.ZstdCompressor(level=3 if level is None else level, write_content_size=True).compress(raw)
    return len(raw).to_bytes(4, "little") + lz4.block.compress(raw, store_size=False)


def assemble(codec: OsoCodec, raw: bytes, count: int, start_offset: int, end_offset: int,
             level: int | None = None) -> bytes:
    """Header + compressed body + CRC-32 footer."""
    if len(raw) > _U32_MAX and codec == OsoCodec.LZ4:
        raise ValueError("an lz4 body cannot hold more than 4 GiB")
    head = OsoHeader(VERSION, codec, count, start_offset, end_offset).to_bytes()
    body = compress_body(codec, raw, level)
    crc = zlib.crc32(body, zlib.crc32(head))
    return b"".join((head, body, crc.to_bytes(4, "little"), END_MAGIC))


def encode_segment(cols: RecordColumns, codec: OsoCodec, level: int | None = None) -> tuple[bytes, OsoSegmentStats]:
    """One oso-native segment file holding every record of ``cols`` (at least one)."""
    n = len(cols)
    if n == 0:
        raise ValueError("an oso-native segment needs at least one record")
    raw = encode_records(cols)
    first, last = int(cols.offsets[0]), int(cols.offsets[-1])
    data = assemble(codec, raw, n, first, last, level)
    stats = OsoSegmentStats(n, first, last, int(cols.timestamps[0]), int(cols.timestamps[-1]), len(raw), len(data))
    return data, stats


__all__ = [
    "DEFAULT_MAX_UNCOMPRESSED",
    "END_MAGIC",
    "EXTENSIONS",
    "FOOTER_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "OSO_CODEC_NAMES",
    "OsoCodec",
    "OsoHeader",
    "OsoRecords",
    "OsoSegment",
    "OsoSegmentStats",
    "SegmentFormatError",
    "assemble",
    "check_footer",
    "check_header_against",
    "codec_from_extension",
    "decode_segment",
    "decompress_body",
    "encode_records",
    "encode_segment",
    "oso_codec_from_name",
    "segment_file_name",
]
