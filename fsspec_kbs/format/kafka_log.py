"""Apache Kafka's own on-disk log format: record batches v2 and the segment index files.

Pure bytes -> records, no I/O. Everything here follows Kafka's ``DefaultRecordBatch`` /
``DefaultRecord`` (KIP-98 message format v2), all integers big-endian:

Batch header (61 bytes)::

    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 (=2) | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordsCount i32

``batchLength`` counts the bytes after itself (so a batch occupies ``batchLength + 12`` bytes).
The CRC is CRC-32C over ``attributes`` to the end of the batch. Attribute bits 0-2 are the codec
(0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 the timestamp type (1 = LogAppendTime),
bit 4 transactional, bit 5 control. The records (compressed as one block when a codec is set)
follow the header; each is::

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headerCount varint |
    [headerKeyLength varint | headerKey | headerValueLength varint | headerValue]*

with zig-zag varints. A record's timestamp is ``baseTimestamp + timestampDelta`` (CreateTime)
or, for LogAppendTime batches, the batch's ``maxTimestamp`` (what Kafka's consumer reports).

Index files (entries big-endian, offsets relative to the segment's base offset):
``.index`` 8 bytes (relative offset i32, file position i32); ``.timeindex`` 12 bytes
(timestamp i64, relative offset i32); ``.txnindex`` 34 bytes (version i16, producerId i64,
firstOffset i64, lastOffset i64, lastStableOffset i64; Kafka's ``AbortedTxn.TOTAL_SIZE``). Kafka pre-allocates the index files of the
active segment and fills them with zeros; the parsers stop at the first entry that breaks the
ordering Kafka guarantees, which is where the zero padding starts.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import cramjam
import lz4.frame
import numpy as np
import zstandard
from fastcrc import crc32 as _fastcrc32

from fsspec_kbs.errors import (
    BadMagicError,
    ChecksumError,
    DecompressionError,
    RecordFormatError,
    SegmentFormatError,
    TruncatedSegmentError,
    UnsupportedCodecError,
)
from fsspec_kbs.format.columns import RecordColumns
from fsspec_kbs.format.kernels import copy_bytes, kernel, put_field, read_varint, write_varint

#: Bytes of a v2 batch header; ``LOG_OVERHEAD`` is the offset + length prefix every format shares.
KAFKA_BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12
#: Default bound on one batch's decompressed records (Kafka stores no uncompressed size, so a
#: reader must pick one; 256 MiB is far above any broker's ``message.max.bytes`` ratio in practice).
DEFAULT_MAX_UNCOMPRESSED = 256 * 1024 * 1024

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
KAFKA_CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
KAFKA_CODEC_BY_NAME = {v: k for k, v in KAFKA_CODEC_NAMES.items()}

#: Timestamp types as Spark's Kafka source reports them in ``timestampType``.
CREATE_TIME = 0
LOG_APPEND_TIME = 1
TIMESTAMP_TYPE_NAMES = {CREATE_TIME: "CreateTime", LOG_APPEND_TIME: "LogAppendTime"}

#: Control record types (key: version i16, type i16).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

BATCH_HEADER_STRUCT = _HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">hqqqq")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def crc32c(data: bytes | memoryview) -> int:
    """CRC-32C (Castagnoli), the checksum of Kafka record batches v2."""
    return _fastcrc32.iscsi(data)


@dataclass(frozen=True)
class KafkaBatchHeader:
    """The 61-byte header of one record batch, plus where it sits in its file."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the batch occupies in the log file."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def codec(self) -> int:
        return self.attributes & 0x07

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & 0x08 else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def parse_batch_header(data: bytes | memoryview, pos: int = 0, path: str | None = None,
                       file_position: int | None = None) -> KafkaBatchHeader:
    """Parse and sanity-check the batch header at ``data[pos:]``.

    ``file_position`` is where ``data[pos]`` sits in the file (for errors and
    :attr:`KafkaBatchHeader.position`); it defaults to ``pos``.

    Raises
    ------
    TruncatedSegmentError
        Fewer than 61 bytes remain, or the batch claims more bytes than remain.
    BadMagicError
        Not a v2 batch. A legacy v0/v1 message set whose CRC checks out says so explicitly.
    SegmentFormatError
        Impossible lengths or counts.
    """
    at = pos if file_position is None else file_position
    avail = len(data) - pos
    if avail < LOG_OVERHEAD:
        raise TruncatedSegmentError(
            f"{avail} bytes left, too few for a batch's offset and length", path, at)
    base, length = struct.unpack_from(">qi", data, pos)
    if length < KAFKA_BATCH_HEADER_SIZE - LOG_OVERHEAD:
        if avail >= 17 and data[pos + 16] in (0, 1) and length >= 14:
            _legacy(data, pos, length, path, at)
        raise SegmentFormatError(
            f"batch length {length} is smaller than a v2 batch header ({KAFKA_BATCH_HEADER_SIZE - LOG_OVERHEAD})",
            path, at + 8)
    if avail < KAFKA_BATCH_HEADER_SIZE:
        raise TruncatedSegmentError(
            f"{avail} bytes left, too few for a {KAFKA_BATCH_HEADER_SIZE}-byte batch header", path, at)
    h = KafkaBatchHeader(at, *_HEADER.unpack_from(data, pos))
    if h.magic != 2:
        if h.magic in (0, 1):
            _legacy(data, pos, length, path, at)
        raise BadMagicError(f"batch magic is {h.magic}, expected 2 (record batch v2)", path, at + 16)
    if h.records_count < 0:
        raise SegmentFormatError(f"negative record count {h.records_count}", path, at + 57)
    if h.last_offset_delta < 0 or h.records_count > h.last_offset_delta + 1:
        raise SegmentFormatError(
            f"{h.records_count} records do not fit lastOffsetDelta {h.last_offset_delta}", path, at + 23)
    if h.size > avail:
        raise TruncatedSegmentError(
            f"batch claims {h.size} bytes but only {avail} remain in the file", path, at + 8)
    return h


def _legacy(data: bytes | memoryview, pos: int, length: int, path: str | None, at: int) -> None:
    """Raise a clear error for an intact message-format v0/v1 entry; return if it is not one."""
    end = pos + LOG_OVERHEAD + length
    if end > len(data) or length < 6:
        return
    (crc,) = struct.unpack_from(">I", data, pos + 12)
    if zlib.crc32(memoryview(data)[pos + 16 : end]) == crc:
        raise BadMagicError(
            f"message format v{data[pos + 16]} (Kafka < 0.11) is not supported: only record batch v2; "
            "upgrade the log with a Kafka 2.x/3.x broker first", path, at + 16)


def batch_crc_ok(data: bytes | memoryview, header: KafkaBatchHeader, pos: int | None = None) -> tuple[bool, int]:
    """(matches, computed CRC-32C) for the batch whose header is ``header`` at ``data[pos]``."""
    start = header.position if pos is None else pos
    actual = crc32c(memoryview(data)[start + 21 : start + header.size])
    return actual == header.crc, actual


def check_batch_crc(data: bytes | memoryview, header: KafkaBatchHeader, path: str | None = None,
                    pos: int | None = None) -> None:
    ok, actual = batch_crc_ok(data, header, pos)
    if not ok:
        raise ChecksumError(
            f"batch at offset {header.base_offset}: CRC-32C is {actual:#010x} but the header says "
            f"{header.crc:#010x}", path, header.position + 17)


# -- decompression -------------------------------------------------------------------------------

def decompress_records(codec: int, data: bytes | memoryview, max_size: int = DEFAULT_MAX_UNCOMPRESSED) -> bytes:
    """Decompress a batch's records block, producing at most ``max_size`` bytes.

    Raises :class:`DecompressionError` (without location) for invalid data or output above the
    bound, :class:`UnsupportedCodecError` for codec codes 5-7.
    """
    if codec == CODEC_NONE:
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            return _gunzip(data, max_size)
        if codec == CODEC_SNAPPY:
            return _unsnappy(bytes(data), max_size)
        if codec == CODEC_LZ4:
            return _unlz4(data, max_size)
        if codec == CODEC_ZSTD:
            return _unzstd(data, max_size)
    except DecompressionError:
        raise
    except Exception as e:  # each library has its own error classes; all mean "bad frame"
        raise DecompressionError(f"invalid {KAFKA_CODEC_NAMES[codec]} data: {e}") from e
    raise UnsupportedCodecError(f"unknown compression type {codec} in batch attributes (known 0-4)")


def _too_big(codec: str, max_size: int) -> DecompressionError:
    return DecompressionError(f"{codec} data decompresses to more than {max_size} bytes (the reader's bound)")


def _gunzip(data: bytes | memoryview, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while True:
        # wbits 47 = gzip or zlib header; Java's GZIPInputStream also reads concatenated members.
        d = zlib.decompressobj(47)
        chunk = d.decompress(rest, max_size - len(out) + 1)
        out += chunk
        if len(out) > max_size:
            raise _too_big("gzip", max_size)
        if not d.eof:
            if d.unconsumed_tail:
                raise _too_big("gzip", max_size)
            raise DecompressionError("gzip stream is incomplete")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def _snappy_block(block: bytes, max_size: int) -> bytes:
    n = cramjam.snappy.decompress_raw_len(block)
    if n > max_size:
        raise _too_big("snappy", max_size)
    return bytes(cramjam.snappy.decompress_raw(block))


def _unsnappy(data: bytes, max_size: int) -> bytes:
    """Snappy as Kafka clients write it: xerial framing (Java) or one raw block (librdkafka)."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, max_size)
    pos = 16  # magic (8) + version (4) + compatible version (4)
    if len(data) < pos:
        raise DecompressionError("xerial snappy header is truncated")
    out = bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError(f"xerial snappy block length cut off at byte {pos}")
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise DecompressionError(f"xerial snappy block of {n} bytes at byte {pos - 4} runs past the data")
        out += _snappy_block(data[pos : pos + n], max_size - len(out))
        pos += n
    return bytes(out)


def _unlz4(data: bytes | memoryview, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while rest:
        d = lz4.frame.LZ4FrameDecompressor()
        out += d.decompress(rest, max_length=max_size - len(out) + 1)
        if len(out) > max_size:
            raise _too_big("lz4", max_size)
        if not d.eof:
            raise DecompressionError("lz4 frame is incomplete")
        rest = d.unused_data
    return bytes(out)


def _unzstd(data: bytes | memoryview, max_size: int) -> bytes:
    dctx = zstandard.ZstdDecompressor()
    reader = dctx.stream_reader(bytes(data), read_across_frames=True)
    out = reader.read(max_size + 1)
    if len(out) > max_size:
        raise _too_big("zstd", max_size)
    # read() may return short before the end: drain until EOF within the bound.
    while True:
        more = reader.read(max_size + 1 - len(out))
        if not more:
            return out
        out += more
        if len(out) > max_size:
            raise _too_big("zstd", max_size)


# -- records -------------------------------------------------------------------------------------

E_OK = 0
E_VARINT = 1
E_TRUNCATED = 2
E_LENGTH = 3
E_OFFSET_ORDER = 4
E_HEADER_COUNT = 5
E_HEADER_KEY_NULL = 6
E_TRAILING = 7
E_RECORD_SIZE = 8
E_OFFSET_DELTA = 9

_MESSAGES = {
    E_VARINT: "malformed varint (longer than 10 bytes or cut off)",
    E_TRUNCATED: "record runs past the end of the batch",
    E_LENGTH: "negative length other than -1",
    E_OFFSET_ORDER: "record offset deltas do not strictly increase",
    E_HEADER_COUNT: "negative header count",
    E_HEADER_KEY_NULL: "header key is null",
    E_TRAILING: "bytes left over after the last record",
    E_RECORD_SIZE: "record length prefix does not match the record's fields",
    E_OFFSET_DELTA: "record offset delta is outside 0 … lastOffsetDelta",
}


@kernel
def _skip_bytes(buf, pos, end):  # type: ignore[no-untyped-def]
    """Read a varint length and skip that many bytes; returns (length, next pos, code)."""
    n, pos = read_varint(buf, pos, end)
    if pos < 0:
        return 0, -1, E_VARINT
    if n < -1:
        return 0, -1, E_LENGTH
    if n > 0:
        if n > end - pos:
            return 0, -1, E_TRUNCATED
        pos += n
    return n, pos, E_OK


@kernel
def scan_kafka_records(buf, start, end, count, max_delta):  # type: ignore[no-untyped-def]
    """Validate ``count`` v2 records in ``buf[start:end]``; size their variable-length parts.

    Returns (code, error position, key bytes, value bytes, headers, header key bytes, header value bytes).
    """
    pos = start
    kb = 0
    vb = 0
    nh = 0
    hkb = 0
    hvb = 0
    prev = -1
    for _i in range(count):
        rec = pos
        length, pos = read_varint(buf, pos, end)
        if pos < 0:
            return E_VARINT, rec, 0, 0, 0, 0, 0
        if length < 0 or length > end - pos:
            return E_TRUNCATED, rec, 0, 0, 0, 0, 0
        rend = pos + length
        if rend - pos < 1:
            return E_RECORD_SIZE, rec, 0, 0, 0, 0, 0
        pos += 1  # attributes (unused in v2)
        _ts, pos = read_varint(buf, pos, rend)
        if pos < 0:
            return E_VARINT, rec, 0, 0, 0, 0, 0
        delta, pos = read_varint(buf, pos, rend)
        if pos < 0:
            return E_VARINT, rec, 0, 0, 0, 0, 0
        if delta < 0 or delta > max_delta:
            return E_OFFSET_DELTA, rec, 0, 0, 0, 0, 0
        if delta <= prev:
            return E_OFFSET_ORDER, rec, 0, 0, 0, 0, 0
        prev = delta
        n, pos, code = _skip_bytes(buf, pos, rend)
        if code != E_OK:
            return code, rec, 0, 0, 0, 0, 0
        if n > 0:
            kb += n
        n, pos, code = _skip_bytes(buf, pos, rend)
        if code != E_OK:
            return code, rec, 0, 0, 0, 0, 0
        if n > 0:
            vb += n
        hc, pos = read_varint(buf, pos, rend)
        if pos < 0:
            return E_VARINT, rec, 0, 0, 0, 0, 0
        if hc < 0:
            return E_HEADER_COUNT, rec, 0, 0, 0, 0, 0
        if hc > (rend - pos) // 2:
            return E_TRUNCATED, rec, 0, 0, 0, 0, 0
        for _h in range(hc):
            n, pos, code = _skip_bytes(buf, pos, rend)
            if code != E_OK:
                return code, rec, 0, 0, 0, 0, 0
            if n < 0:
                return E_HEADER_KEY_NULL, rec, 0, 0, 0, 0, 0
            hkb += n
            n, pos, code = _skip_bytes(buf, pos, rend)
            if code != E_OK:
                return code, rec, 0, 0, 0, 0, 0
            if n > 0:
                hvb += n
        nh += hc
        if pos != rend:
            return E_RECORD_SIZE, rec, 0, 0, 0, 0, 0
    if pos != end:
        return E_TRAILING, pos, 0, 0, 0, 0, 0
    return E_OK, 0, kb, vb, nh, hkb, hvb


@kernel
def _copy_field(buf, pos, data, offs, valid, r):  # type: ignore[no-untyped-def]
    n, pos = read_varint(buf, pos, pos + 10)
    return put_field(data, offs, valid, r, buf, pos, n)


@kernel
def fill_kafka_records(  # type: ignore[no-untyped-def]
    buf, start, count, base_offset, base_ts, log_append, max_ts, row, hrow,
    offsets, timestamps,
    key_offsets, key_data, key_valid,
    value_offsets, value_data, value_valid,
    header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid,
):
    """Decode records already validated by :func:`scan_kafka_records` into rows ``row…``."""
    pos = start
    for i in range(count):
        r = row + i
        _length, pos = read_varint(buf, pos, pos + 10)
        pos += 1
        td, pos = read_varint(buf, pos, pos + 10)
        od, pos = read_varint(buf, pos, pos + 10)
        offsets[r] = base_offset + od
        timestamps[r] = max_ts if log_append else base_ts + td
        pos = _copy_field(buf, pos, key_data, key_offsets, key_valid, r)
        pos = _copy_field(buf, pos, value_data, value_offsets, value_valid, r)
        hc, pos = read_varint(buf, pos, pos + 10)
        for _h in range(hc):
            n, pos = read_varint(buf, pos, pos + 10)
            a = hkey_offsets[hrow]
            copy_bytes(hkey_data, a, buf, pos, n)
            pos += n
            hkey_offsets[hrow + 1] = a + n
            pos = _copy_field(buf, pos, hvalue_data, hvalue_offsets, hvalue_valid, hrow)
            hrow += 1
        header_offsets[r + 1] = header_offsets[r] + hc
    return pos


@dataclass(frozen=True)
class KafkaPayload:
    """Uncompressed records of one batch with what decoding them needs from its header."""

    data: np.ndarray  # uint8
    header: KafkaBatchHeader


class KafkaRecordError(ValueError):
    """Malformed records; ``batch`` indexes the payload list, ``position`` the byte in its records."""

    def __init__(self, batch: int, code: int, position: int) -> None:
        self.batch = batch
        self.code = code
        self.position = position
        self.reason = _MESSAGES.get(code, f"record error {code}")
        super().__init__(f"batch {batch}, byte {position} of its records: {self.reason}")


@dataclass
class KafkaColumns:
    """Decoded records of some batches and, per record, the timestamp type."""

    columns: RecordColumns
    timestamp_types: np.ndarray  # int8[n]: 0 CreateTime, 1 LogAppendTime

    def __len__(self) -> int:
        return len(self.columns)


def decode_kafka_payloads(payloads: Sequence[KafkaPayload]) -> KafkaColumns:
    """Decode the records of several batches into one :class:`KafkaColumns`.

    Raises :class:`KafkaRecordError` naming the payload and byte of the first defect.
    """
    totals = np.zeros(5, dtype=np.int64)
    for b, p in enumerate(payloads):
        h = p.header
        code, pos, kb, vb, nh, hkb, hvb = scan_kafka_records(
            p.data, 0, len(p.data), h.records_count, h.last_offset_delta)
        if code != E_OK:
            raise KafkaRecordError(b, code, pos)
        totals += (kb, vb, nh, hkb, hvb)
    n = sum(p.header.records_count for p in payloads)
    kb, vb, nh, hkb, hvb = (int(x) for x in totals)
    if max(kb, vb, hkb, hvb) >= 2**31:
        raise ValueError("more than 2 GiB of variable-length data in one chunk; decode fewer batches at once")
    cols = RecordColumns(
        offsets=np.empty(n, np.int64), timestamps=np.empty(n, np.int64),
        key_offsets=np.empty(n + 1, np.int32), key_data=np.empty(kb, np.uint8), key_valid=np.empty(n, np.bool_),
        value_offsets=np.empty(n + 1, np.int32), value_data=np.empty(vb, np.uint8),
        value_valid=np.empty(n, np.bool_),
        header_offsets=np.empty(n + 1, np.int32), header_key_offsets=np.empty(nh + 1, np.int32),
        header_key_data=np.empty(hkb, np.uint8), header_value_offsets=np.empty(nh + 1, np.int32),
        header_value_data=np.empty(hvb, np.uint8), header_value_valid=np.empty(nh, np.bool_),
    )
    for arr in (cols.key_offsets, cols.value_offsets, cols.header_offsets,
                cols.header_key_offsets, cols.header_value_offsets):
        arr[0] = 0
    types = np.empty(n, np.int8)
    row = 0
    hrow = 0
    for p in payloads:
        h = p.header
        fill_kafka_records(
            p.data, 0, h.records_count, h.base_offset, h.base_timestamp,
            h.timestamp_type == LOG_APPEND_TIME, h.max_timestamp, row, hrow,
            cols.offsets, cols.timestamps,
            cols.key_offsets, cols.key_data, cols.key_valid,
            cols.value_offsets, cols.value_data, cols.value_valid,
            cols.header_offsets, cols.header_key_offsets, cols.header_key_data,
            cols.header_value_offsets, cols.header_value_data, cols.header_value_valid,
        )
        types[row : row + h.records_count] = h.timestamp_type
        row += h.records_count
        hrow = int(cols.header_offsets[row])
    return KafkaColumns(cols, types)


def batch_payload(data: bytes | memoryview, header: KafkaBatchHeader, pos: int | None = None,
                  path: str | None = None, max_size: int = DEFAULT_MAX_UNCOMPRESSED) -> KafkaPayload:
    """Decompress the records of the batch at ``data[pos]`` (CRC not checked here)."""
    start = header.position if pos is None else pos
    block = memoryview(data)[start + KAFKA_BATCH_HEADER_SIZE : start + header.size]
    try:
        raw = decompress_records(header.codec, block, max_size)
    except SegmentFormatError as e:
        raise e.located(path or "<log segment>", header.position) from e
    return KafkaPayload(np.frombuffer(raw, dtype=np.uint8), header)


def decode_batches(data: bytes | memoryview, headers: Sequence[KafkaBatchHeader], base: int = 0,
                   path: str | None = None, max_size: int = DEFAULT_MAX_UNCOMPRESSED) -> KafkaColumns:
    """Decompress and decode batches of ``data`` (``data[0]`` is file position ``base``)."""
    payloads = [batch_payload(data, h, h.position - base, path, max_size) for h in headers]
    try:
        return decode_kafka_payloads(payloads)
    except KafkaRecordError as e:
        h = headers[e.batch]
        if h.codec == CODEC_NONE:
            where, extra = h.position + KAFKA_BATCH_HEADER_SIZE + e.position, ""
        else:
            where, extra = h.position, f" (byte {e.position} of its decompressed records)"
        raise RecordFormatError(f"batch at offset {h.base_offset}{extra}: {e.reason}", path, where) from e


def control_type(data: bytes | memoryview, header: KafkaBatchHeader, pos: int | None = None,
                 path: str | None = None) -> int:
    """Type of the control record in a control batch (0 ABORT, 1 COMMIT, others are other markers)."""
    base = 0 if pos is None else header.position - pos
    cols = decode_batches(data, [header], base, path).columns
    if len(cols) != 1 or not cols.key_valid[0] or cols.key_offsets[1] - cols.key_offsets[0] < 4:
        raise RecordFormatError("control batch does not hold one control record with a 4-byte key",
                                path, header.position)
    k0 = int(cols.key_offsets[0])
    _version, ctype = struct.unpack(">hh", bytes(cols.key_data[k0 : k0 + 4]))
    return ctype


# -- walking a log segment -----------------------------------------------------------------------

@dataclass
class LogTail:
    """Where a segment stops being a valid log (what Kafka's recovery would truncate)."""

    position: int
    dropped_bytes: int
    reason: str
    error: SegmentFormatError | None = None


def walk_batches(data: bytes | memoryview, base: int = 0, path: str | None = None,
                 verify_crc: bool = True, stop: int | None = None) -> tuple[list[KafkaBatchHeader], LogTail | None]:
    """Headers of the valid batches in ``data`` (file position ``base`` onwards), and the damaged tail.

    Like Kafka's log recovery, the walk stops at the first batch that is cut off, has a bad CRC,
    a bad magic byte or impossible fields, or whose offsets do not increase; everything from
    there to the end of ``data`` is reported as a :class:`LogTail`. Legacy v0/v1 messages raise
    :class:`BadMagicError` instead (they are valid data this reader cannot decode).
    ``stop`` ends the walk early (a file position at which to stop, e.g. an end offset's batch).
    """
    out: list[KafkaBatchHeader] = []
    pos = 0
    size = len(data)
    prev_last = -1
    while pos < size:
        try:
            h = parse_batch_header(data, pos, path, base + pos)
            if h.base_offset <= prev_last:
                raise SegmentFormatError(
                    f"batch base offset {h.base_offset} is not above the previous batch's last offset "
                    f"{prev_last}", path, base + pos)
            if verify_crc:
                check_batch_crc(data, h, path, pos)
        except BadMagicError as e:
            if "not supported" in e.reason:
                raise
            return out, LogTail(base + pos, size - pos, e.reason, e)
        except SegmentFormatError as e:
            return out, LogTail(base + pos, size - pos, e.reason, e)
        out.append(h)
        prev_last = h.last_offset
        pos += h.size
        if stop is not None and h.base_offset >= stop:
            break
    return out, None


# -- transactions --------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class AbortedTxn:
    """An aborted transaction: its producer and first offset (last offset when known)."""

    first_offset: int
    producer_id: int
    last_offset: int = -1


@dataclass
class ReadCommittedFilter:
    """Which batches a ``read_committed`` consumer returns, decided exactly as Kafka's consumer does.

    Feed every batch in offset order to :meth:`keep`. A transactional batch is dropped when its
    producer has an aborted transaction starting at or before the batch's last offset that its
    abort marker has not yet closed; control batches are never returned.
    """

    aborted: Iterable[AbortedTxn]
    _queue: list[AbortedTxn] = field(init=False)
    _seen: set[AbortedTxn] = field(init=False)
    _active: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._seen = set(self.aborted)
        self._queue = sorted(self._seen, reverse=True)

    def add(self, aborted: Iterable[AbortedTxn]) -> None:
        """Learn more aborted transactions (before any of their batches is passed to :meth:`keep`).

        Transactions already known (even if already consumed) are ignored.
        """
        new = set(aborted) - self._seen
        if new:
            self._seen |= new
            self._queue = sorted(set(self._queue) | new, reverse=True)

    def start_at(self, offset: int) -> None:
        """Forget aborted transactions whose marker lies before ``offset`` (where reading starts)."""
        self._queue = [t for t in self._queue if t.last_offset < 0 or t.last_offset >= offset]

    def keep(self, header: KafkaBatchHeader, control: int | None = None) -> bool:
        """``control`` is the control record type for control batches (see :func:`control_type`)."""
        if header.has_producer_id:
            while self._queue and self._queue[-1].first_offset <= header.last_offset:
                self._active.add(self._queue.pop().producer_id)
            if header.is_control and control == CONTROL_ABORT:
                self._active.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in self._active:
                return False
        return not header.is_control


class TxnTracker:
    """Aborted transactions derived from the log itself: data batches open a transaction of their
    producer, the next control marker closes it. ``finish`` reports the ones left open."""

    def __init__(self) -> None:
        self.open: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []

    def add(self, header: KafkaBatchHeader, control: int | None = None) -> None:
        if not header.is_transactional:
            return
        pid = header.producer_id
        if header.is_control:
            first = self.open.pop(pid, None)
            if control == CONTROL_ABORT:
                self.aborted.append(AbortedTxn(header.base_offset if first is None else first, pid,
                                               header.base_offset))
        elif pid not in self.open:
            self.open[pid] = header.base_offset

    def unfinished(self) -> list[AbortedTxn]:
        """Transactions without a marker (still open when the log ends)."""
        return [AbortedTxn(first, pid) for pid, first in self.open.items()]


# -- index files ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class OffsetIndexEntry:
    offset: int  # absolute
    position: int


@dataclass(frozen=True)
class TimeIndexEntry:
    timestamp: int
    offset: int  # absolute


def parse_offset_index(data: bytes | memoryview, base_offset: int) -> list[OffsetIndexEntry]:
    """Entries of a ``.index`` file up to the zero padding (or the first out-of-order entry)."""
    out: list[OffsetIndexEntry] = []
    for i in range(len(data) // 8):
        rel, pos = _OFFSET_ENTRY.unpack_from(data, i * 8)
        if rel < 0 or pos < 0 or (out and (base_offset + rel <= out[-1].offset or pos <= out[-1].position)):
            break
        out.append(OffsetIndexEntry(base_offset + rel, pos))
    return out


def parse_time_index(data: bytes | memoryview, base_offset: int) -> list[TimeIndexEntry]:
    """Entries of a ``.timeindex`` file up to the zero padding (or the first out-of-order entry)."""
    out: list[TimeIndexEntry] = []
    for i in range(len(data) // 12):
        ts, rel = _TIME_ENTRY.unpack_from(data, i * 12)
        if rel < 0 or (out and (ts <= out[-1].timestamp or base_offset + rel < out[-1].offset)) \
                or (i > 0 and ts == 0 and rel == 0):
            break
        out.append(TimeIndexEntry(ts, base_offset + rel))
    return out


def parse_txn_index(data: bytes | memoryview, path: str | None = None) -> list[AbortedTxn]:
    """Aborted transactions listed in a ``.txnindex`` file."""
    size = _TXN_ENTRY.size
    if len(data) % size:
        raise TruncatedSegmentError(
            f"transaction index is {len(data)} bytes, not a multiple of {size}", path, len(data) - len(data) % size)
    out = []
    for i in range(len(data) // size):
        version, pid, first, last, _lso = _TXN_ENTRY.unpack_from(data, i * size)
        if version != 0:
            raise SegmentFormatError(f"transaction index entry version {version}, expected 0", path, i * size)
        out.append(AbortedTxn(first, pid, last))
    return out


def lookup_offset(entries: Sequence[OffsetIndexEntry], target: int) -> int:
    """File position to start scanning for ``target``: the last entry at or before it (0 if none).

    Kafka indexes a batch by its last offset at its start position, so every batch before the
    returned position ends below ``target``.
    """
    lo, hi = 0, len(entries)
    while lo < hi:
        mid = (lo + hi) // 2
        if entries[mid].offset <= target:
            lo = mid + 1
        else:
            hi = mid
    return entries[lo - 1].position if lo else 0


def lookup_time(entries: Sequence[TimeIndexEntry], target: int) -> int | None:
    """Offset to start at for records with timestamp >= ``target``, or None (start of segment).

    Uses the last entry whose timestamp is strictly below ``target``: every record up to that
    entry's offset has a timestamp at most that entry's, so none of them can match, even when
    CreateTime timestamps are out of order.
    """
    best = None
    for e in entries:
        if e.timestamp < target:
            best = e.offset
        else:
            break
    return best


# -- encoding (tests, fixtures) ------------------------------------------------------------------

def _zigzag(out: bytearray, v: int) -> None:
    buf = np.zeros(10, np.uint8)
    n = write_varint(buf, 0, v)
    out += bytes(buf[:n])


def _encode_record(rec: dict, base_offset: int, base_ts: int) -> bytes:
    body = bytearray(b"\x00")
    _zigzag(body, int(rec.get("timestamp", base_ts)) - base_ts)
    _zigzag(body, int(rec["offset"]) - base_offset)
    for v in (rec.get("key"), rec.get("value")):
        if v is None:
            _zigzag(body, -1)
        else:
            _zigzag(body, len(v))
            body += v
    headers = rec.get("headers") or []
    _zigzag(body, len(headers))
    for hk, hv in headers:
        hk = hk.encode("utf-8") if isinstance(hk, str) else hk
        _zigzag(body, len(hk))
        body += hk
        if hv is None:
            _zigzag(body, -1)
        else:
            _zigzag(body, len(hv))
            body += hv
    out = bytearray()
    _zigzag(out, len(body))
    return bytes(out + body)


def compress_records(codec: int, raw: bytes, xerial: bool = True) -> bytes:
    """Compress a records block the way Kafka clients do (tests and fixtures)."""
    if codec == CODEC_NONE:
        return raw
    if codec == CODEC_GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(raw) + c.flush()
    if codec == CODEC_SNAPPY:
        block = bytes(cramjam.snappy.compress_raw(raw))
        if not xerial:
            return block
        return _XERIAL_MAGIC + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    if codec == CODEC_LZ4:
        return lz4.frame.compress(raw)
    if codec == CODEC_ZSTD:
        return zstandard.ZstdCompressor().compress(raw)
    raise ValueError(f"unknown codec {codec}")


def encode_kafka_batch(records: Sequence[dict], base_offset: int | None = None, *, codec: int = CODEC_NONE,
                       log_append_time: int | None = None, producer_id: int = -1, producer_epoch: int = -1,
                       base_sequence: int = -1, transactional: bool = False, control: bool = False,
                       last_offset_delta: int | None = None, leader_epoch: int = 0,
                       xerial: bool = True) -> bytes:
    """One v2 record batch holding ``records`` (dicts: offset, timestamp, key, value, headers).

    For tests and fixtures: builds what a Kafka broker writes, including LogAppendTime batches
    (``log_append_time`` = the broker's time) and control batches.
    """
    if base_offset is None:
        base_offset = int(records[0]["offset"])
    stamps = [int(r.get("timestamp", 0)) for r in records]
    base_ts = stamps[0] if stamps else -1
    max_ts = max(stamps) if stamps else -1
    attrs = codec | (0x10 if transactional else 0) | (0x20 if control else 0)
    if log_append_time is not None:
        attrs |= 0x08
        max_ts = log_append_time
    if last_offset_delta is None:
        last_offset_delta = int(records[-1]["offset"]) - base_offset if records else 0
    raw = b"".join(_encode_record(r, base_offset, base_ts) for r in records)
    block = compress_records(codec, raw, xerial)
    after_crc = struct.pack(">hiqqqhii", attrs, last_offset_delta, base_ts, max_ts, producer_id,
                            producer_epoch, base_sequence, len(records)) + block
    crc = crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc) + after_crc


def encode_control_batch(offset: int, producer_id: int, commit: bool, timestamp: int = 0,
                         producer_epoch: int = 0) -> bytes:
    """A transaction marker batch (COMMIT or ABORT) as the broker writes it."""
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = struct.pack(">hi", 0, 0)
    return encode_kafka_batch([{"offset": offset, "timestamp": timestamp, "key": key, "value": value}],
                              producer_id=producer_id, producer_epoch=producer_epoch, transactional=True,
                              control=True)


def encode_offset_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    return b"".join(_OFFSET_ENTRY.pack(off - base_offset, pos) for off, pos in entries)


def encode_time_index(entries: Iterable[tuple[int, int]], base_offset: int) -> bytes:
    return b"".join(_TIME_ENTRY.pack(ts, off - base_offset) for ts, off in entries)


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(_TXN_ENTRY.pack(0, e.producer_id, e.first_offset, e.last_offset, e.last_offset)
                    for e in entries)


__all__ = [
    "BATCH_HEADER_STRUCT", "DEFAULT_MAX_UNCOMPRESSED", "KAFKA_BATCH_HEADER_SIZE", "KAFKA_CODEC_BY_NAME", "KAFKA_CODEC_NAMES",
    "AbortedTxn", "KafkaBatchHeader", "KafkaColumns", "KafkaPayload", "LogTail", "OffsetIndexEntry",
    "ReadCommittedFilter", "TimeIndexEntry", "TxnTracker", "batch_payload", "check_batch_crc",
    "control_type", "decode_batches", "decode_kafka_payloads", "decompress_records", "encode_control_batch",
    "encode_kafka_batch", "encode_offset_index", "encode_time_index", "encode_txn_index", "lookup_offset",
    "lookup_time", "parse_batch_header", "parse_offset_index", "parse_time_index", "parse_txn_index",
    "walk_batches",
]
