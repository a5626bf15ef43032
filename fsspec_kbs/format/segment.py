"""KBS segment files: 32-byte header, record batches, 16-byte footer (kbs-format.md §2)."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from fsspec_kbs.errors import (
    BadMagicError,
    ChecksumError,
    DecompressionError,
    RecordFormatError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.format.checksums import crc32, crc64_join, crc64_xz
from fsspec_kbs.format.codecs import Codec, codec_from_code, compress, decompress
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.records import (
    MIN_RECORD_BYTES,
    ColumnsBuilder,
    EncodedBatch,
    Payload,
    RecordDecodeError,
    ViewsBuilder,
    as_uint8,
)
from fsspec_kbs.threads import run_in_order

Decoded = tuple["RecordColumns | ViewColumns", int]
#: A chunk's batches and the call that decodes them: (columns, share of the CRC-64).
DecodeTask = tuple[list["BatchInfo"], Callable[[], Decoded]]


class ChunkSource(Protocol):
    """A segment as decode tasks plus the checks their results need, in order."""

    def decode_tasks(self, max_chunk_bytes: int, views: bool) -> Iterator[DecodeTask]: ...

    def check_first(self, group: Sequence[BatchInfo]) -> None: ...

    def check_order(self, group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns,
                    prev_last: int) -> int: ...

    def join_crc64(self, shares: list[int], groups: list[Sequence[BatchInfo]]) -> int: ...

    def check_end(self, crc: int, last: int) -> None: ...


class ChunkChecks:
    """The checks across a segment's decoded chunks, fed in order: offsets keep increasing
    from chunk to chunk; then :meth:`finish` joins the CRC-64 shares and runs the end checks
    (CRC-64, counts, footer)."""

    def __init__(self, source: ChunkSource) -> None:
        self.source = source
        self.prev_last = -1
        self.shares: list[int] = []
        self.groups: list[Sequence[BatchInfo]] = []
        self.started = False

    def accept(self, group: Sequence[BatchInfo], result: Decoded) -> RecordColumns | ViewColumns:
        cols, share = result
        if not self.started:
            self.started = True
            self.source.check_first(group)
        self.prev_last = self.source.check_order(group, cols, self.prev_last)
        self.shares.append(share)
        self.groups.append(group)
        return cols

    def finish(self) -> None:
        crc = self.source.join_crc64(self.shares, self.groups)
        self.source.check_end(crc, self.prev_last if self.started else 0)


def iter_checked(source: ChunkSource, max_chunk_bytes: int, threads: int | None, views: bool,
                 checks: ChunkChecks | None = None) -> Iterator[RecordColumns | ViewColumns]:
    """Decode ``source`` chunk by chunk (threads as :func:`run_in_order`), checked in order
    by ``checks`` (default: a new :class:`ChunkChecks` of ``source``)."""
    checks = ChunkChecks(source) if checks is None else checks
    for group, result in run_in_order(source.decode_tasks(max_chunk_bytes, views), threads):
        yield checks.accept(group, result)
    checks.finish()


MAGIC = b"KBS1"
FOOTER_MAGIC = b"KBSF"
VERSION = 1
HEADER_SIZE = 32
BATCH_HEADER_SIZE = 24
FOOTER_SIZE = 16
#: Writers keep batches at most this large (uncompressed), as the spec asks.
MAX_BATCH_UNCOMPRESSED = 16 * 1024 * 1024
#: Readers refuse batches claiming more than this: a bound on any single allocation. A batch
#: above the spec's writer limit breaks the format, and a small segment of batches each
#: claiming hundreds of MiB must not make a scan allocate GBs (docs/format-decisions.md).
READ_BATCH_LIMIT = MAX_BATCH_UNCOMPRESSED
INT64_MAX = 2**63 - 1

_HEADER = struct.Struct("<4sBBHQQQ")
_BATCH = struct.Struct("<QIIII")
_FOOTER = struct.Struct("<QI4s")


@dataclass(frozen=True)
class SegmentHeader:
    codec: Codec
    flags: int
    first_offset: int
    record_count: int
    checksum: int
    version: int = VERSION

    def pack(self) -> bytes:
        return _HEADER.pack(MAGIC, self.version, int(self.codec), self.flags,
                            self.first_offset, self.record_count, self.checksum)

    @classmethod
    def parse(cls, data: bytes | memoryview, path: str | None = None) -> SegmentHeader:
        """Parse and check the 32-byte header (magic, version, codec)."""
        if len(data) < HEADER_SIZE:
            raise TruncatedSegmentError(
                f"file is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header", path, len(data)
            )
        magic, version, code, flags, first, count, checksum = _HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            raise BadMagicError(f"segment magic is {bytes(magic)!r}, expected {MAGIC!r}", path, 0)
        if version != VERSION:
            raise SegmentFormatError(
                f"segment format version {version} is not supported (this reader knows version {VERSION})",
                path, 4,
            )
        try:
            codec = codec_from_code(code)
        except SegmentFormatError as e:
            raise e.located(path or "<segment>", 5) from None
        return cls(codec, flags, first, count, checksum, version)


@dataclass(frozen=True)
class SegmentFooter:
    last_offset: int
    batch_count: int

    def pack(self) -> bytes:
        return _FOOTER.pack(self.last_offset, self.batch_count, FOOTER_MAGIC)

    @classmethod
    def parse(cls, data: bytes | memoryview, path: str | None = None) -> SegmentFooter:
        """Parse the footer from the last 16 bytes of a whole segment file."""
        return cls.parse_tail(data[-FOOTER_SIZE:], len(data), path)

    @classmethod
    def parse_tail(cls, tail: bytes | memoryview, size: int, path: str | None = None) -> SegmentFooter:
        """Parse the footer from the last 16 bytes (``tail``) of a segment file of ``size`` bytes."""
        if size < HEADER_SIZE + FOOTER_SIZE:
            raise TruncatedSegmentError(
                f"file is {size} bytes, too short for header and footer", path, size
            )
        last, batches, magic = _FOOTER.unpack(tail)
        if magic != FOOTER_MAGIC:
            raise TruncatedSegmentError(
                f"no {FOOTER_MAGIC.decode()} footer at the end of the file ({size} bytes): "
                "the segment is truncated or damaged",
                path, size - FOOTER_SIZE,
            )
        return cls(last, batches)


class BatchInfo(NamedTuple):
    """Where a batch sits in its segment and what its header says.

    A named tuple: one is made per batch per read, and a frozen dataclass took ~1 µs more each.
    """

    index: int
    position: int  # file offset of the 24-byte batch header
    base_offset: int
    record_count: int
    compressed_size: int
    uncompressed_size: int
    crc: int

    @property
    def data_position(self) -> int:
        return self.position + BATCH_HEADER_SIZE

    @property
    def end(self) -> int:
        return self.data_position + self.compressed_size


def read_batch_header(data: bytes | memoryview, pos: int, index: int, prev_base: int, end: int,
                      codec: Codec, path: str | None, data_start: int = 0) -> BatchInfo:
    """Parse and check the batch header at file offset ``pos`` (kbs-format.md §2.2, §2.5).

    ``data`` holds the file from offset ``data_start`` on (a whole file, or just the 24 header
    bytes when streaming); ``end`` is where the footer starts; ``prev_base`` the previous
    batch's base offset (-1 for the first).
    """
    if end - pos < BATCH_HEADER_SIZE:
        raise TruncatedSegmentError(
            f"{end - pos} stray bytes before the footer, too few for a batch header", path, pos)
    base, count, csize, usize, crc = _BATCH.unpack_from(data, pos - data_start)
    info = BatchInfo(index, pos, base, count, csize, usize, crc)
    if count < 1:
        raise SegmentFormatError("batch record count is 0", path, pos + 8)
    if base > INT64_MAX:
        raise SegmentFormatError(f"batch base offset {base} exceeds 2^63-1", path, pos)
    if base <= prev_base:
        raise SegmentMismatchError(
            f"batch base offset {base} does not increase (previous batch starts at {prev_base})", path, pos)
    if csize > end - info.data_position:
        raise TruncatedSegmentError(
            f"batch claims {csize} compressed bytes but only {end - info.data_position} remain before the footer",
            path, pos + 12)
    if usize > READ_BATCH_LIMIT:
        raise SegmentFormatError(
            f"batch claims {usize} uncompressed bytes, above the reader's limit of {READ_BATCH_LIMIT}",
            path, pos + 16)
    if codec == Codec.NONE and csize != usize:
        raise SegmentMismatchError(f"uncompressed segment but batch sizes differ ({csize} vs {usize})", path, pos + 12)
    return info


class SegmentChecks:
    """What a segment's header and footer claim, checked against its batches (§2.5).

    One object for both the whole-segment reader and the streamed one: the batch walk feeds
    :meth:`counts`, the decoded chunks :meth:`first` and :meth:`order`, and :meth:`end`
    closes with the CRC-64 (when it is checked last) and the footer's last offset.
    """

    def __init__(self, header: SegmentHeader, footer: SegmentFooter, size: int, path: str | None,
                 crc64_last: bool) -> None:
        self.header, self.footer, self.size, self.path = header, footer, size, path
        self.crc64_last = crc64_last

    def counts(self, records: int, batches: int, first_base: int | None) -> None:
        """The header's record count and first offset, the footer's batch count."""
        h = self.header
        if records != h.record_count:
            raise SegmentMismatchError(
                f"header says {h.record_count} records but the batches hold {records}", self.path, 16)
        if batches != self.footer.batch_count:
            raise SegmentMismatchError(
                f"footer says {self.footer.batch_count} batches but the file holds {batches}",
                self.path, self.size - FOOTER_SIZE + 8)
        expected_first = 0 if first_base is None else first_base
        if h.first_offset != expected_first:
            raise SegmentMismatchError(
                f"header first offset {h.first_offset} but the first batch starts at {expected_first}",
                self.path, 8)

    def first(self, group: Sequence[BatchInfo]) -> None:
        if group and self.header.first_offset != group[0].base_offset:
            raise SegmentMismatchError(
                f"header first offset {self.header.first_offset} but the first batch starts at "
                f"{group[0].base_offset}", self.path, 8)

    def order(self, group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns, prev_last: int) -> int:
        """Each batch starts above the previous batch's last offset; returns the group's last."""
        row = 0
        for info in group:
            if info.base_offset <= prev_last:
                raise SegmentMismatchError(
                    f"batch {info.index} starts at offset {info.base_offset}, not above the previous "
                    f"batch's last offset {prev_last}",
                    self.path, info.position,
                )
            row += info.record_count
            prev_last = int(cols.offsets[row - 1])
        return prev_last

    def join(self, shares: list[int], groups: list[Sequence[BatchInfo]]) -> int:
        """The CRC-64 of the chunks from their shares (when checked last; else 0)."""
        if not self.crc64_last:
            return 0
        return crc64_join(shares, [g[-1].end - g[0].position for g in groups])

    def crc64(self, actual: int) -> None:
        if actual != self.header.checksum:
            raise ChecksumError(
                f"segment CRC-64 is {actual:#018x} but the header says {self.header.checksum:#018x}", self.path, 24)

    def end(self, crc: int, last: int, counts: tuple[int, int, int | None] | None = None) -> None:
        """After the last chunk: the joined CRC-64, then ``counts`` (records, batches, first
        base offset) if the walk could not check them up front, then the footer's last offset."""
        if self.crc64_last:
            self.crc64(crc)
        if counts is not None:
            self.counts(*counts)
        if last != self.footer.last_offset:
            raise SegmentMismatchError(
                f"footer last offset {self.footer.last_offset} but the last record is at {last}",
                self.path, self.size - FOOTER_SIZE,
            )


class BatchDecoder:
    """Checks (CRC-32) and decodes runs of one segment's batches from bytes that hold them.

    ``data`` is the file from offset ``start`` on: the whole segment, or a run fetched through
    a batch index. :class:`BatchInfo` positions stay file positions, so every error names the
    byte in the file. ``crc64_shares``: each decoded run also returns the CRC-64 of its bytes
    (computed while they are in cache), for a CRC-64 checked after the last run.
    """

    def __init__(self, data: bytes | memoryview, start: int, codec: Codec, path: str | None,
                 check_crc32: bool, crc64_shares: bool = False) -> None:
        self.data = data if isinstance(data, bytes) else memoryview(data).cast("B")
        self.start, self.codec, self.path = start, codec, path
        self.check_crc32, self.crc64_shares = check_crc32, crc64_shares

    def frame(self, info: BatchInfo) -> memoryview:
        return memoryview(self.data)[info.data_position - self.start : info.end - self.start]

    def crc64_share(self, group: Sequence[BatchInfo]) -> int:
        """The CRC-64 of the group's bytes (batch headers and frames; they are contiguous)."""
        return crc64_xz(memoryview(self.data)[group[0].position - self.start : group[-1].end - self.start])

    def payload(self, info: BatchInfo) -> Payload:
        """Check the CRC-32 and decompress one batch."""
        frame = self.frame(info)
        if self.check_crc32:
            actual = crc32(frame)
            if actual != info.crc:
                raise ChecksumError(
                    f"batch {info.index} CRC-32 is {actual:#010x} but its header says {info.crc:#010x}",
                    self.path, info.position + 20,
                )
        try:
            raw = decompress(self.codec, frame, info.uncompressed_size)
        except DecompressionError as e:
            raise e.located(self.path or "<segment>", info.position) from e
        return Payload(as_uint8(raw), info.base_offset, info.record_count)

    def decode(self, group: Sequence[BatchInfo], views: bool = False) -> Decoded:
        """The group's records, and with ``crc64_shares`` its share of the CRC-64 (else 0)."""
        # The group's CRC-64 share is computed right before its batches are decompressed, each
        # batch's CRC-32 right before it is, and its records checked right after (each while in
        # cache); the copy into exact-size arrays follows once the group's sizes are known. A
        # group's decompressed batches stay alive until then: chunks are a few MB (CHUNK_BYTES).
        crc = self.crc64_share(group) if self.crc64_shares else 0
        if views:
            # Sized before anything is checked: bound a corrupt record count by what the batch
            # can hold (the scan then rejects it) instead of allocating for it.
            builder: ColumnsBuilder | ViewsBuilder = ViewsBuilder(
                sum(min(i.record_count, i.uncompressed_size // MIN_RECORD_BYTES) for i in group))
        else:
            builder = ColumnsBuilder()
        try:
            for info in group:
                builder.add(self.payload(info))
            return builder.finish(), crc
        except RecordDecodeError as e:
            info = group[e.batch]
            if self.codec == Codec.NONE:
                where, extra = info.data_position + e.position, ""
            else:
                where = info.position
                extra = f" (byte {e.position} of its decompressed records)"
            raise RecordFormatError(f"batch {info.index}{extra}: {e.reason}", self.path, where) from e


@dataclass(frozen=True)
class SegmentStats:
    """What a written segment holds: the fields of a 1.1 ``segment_index`` entry and more."""

    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int | None
    max_timestamp: int | None
    size_bytes: int
    crc64: int
    uncompressed_bytes: int
    batches: int


class SegmentReader:
    """Checks and decodes one whole segment held in memory.

    Parameters
    ----------
    data : bytes-like
        The complete segment file.
    path : str, optional
        Named in every error.
    verify_checksums : bool, default True
        Check the segment CRC-64 (here, before anything is decoded) and the batch CRC-32s.
    batch_crc : bool, optional
        Also check every batch CRC-32 when the segment CRC-64 matched. By default they are
        checked only when the CRC-64 does not match, to name the damaged batch: a matching
        CRC-64 already proves every batch byte (batch headers included, so the CRC-32 fields
        too) is what the writer wrote, and skipping the second pass halves the cost of the
        checks. Pass True to also catch a writer that stored a wrong CRC-32 (``validate``).
    crc64_last : bool, default False
        Check the CRC-64 in :meth:`iter_columns`, not here: each chunk's decoding thread checks
        its batches' CRC-32s and computes its share of the CRC-64 just before decompressing
        them, while their bytes are in cache, and the shares are joined and compared after the
        last chunk. Every byte is then read from memory once instead of twice, and the check
        runs on the decoding threads, but a CRC-64 mismatch is raised after the chunks before
        it were yielded (each of them having passed its CRC-32s), as for streamed segments.
    """

    def __init__(self, data: bytes | memoryview, path: str | None = None, verify_checksums: bool = True,
                 batch_crc: bool = False, crc64_last: bool = False):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.path = path
        self.verify = verify_checksums
        crc64_last = verify_checksums and crc64_last
        self.header = SegmentHeader.parse(data, path)
        self.footer = SegmentFooter.parse(data, path)
        self.size = len(data)
        self.checks = SegmentChecks(self.header, self.footer, self.size, path, crc64_last)
        # CRC-32s are needed when asked for, when the CRC-64 comes last, or to diagnose a
        # failed CRC-64 (set below).
        self.decoder = BatchDecoder(self.data, 0, self.header.codec, path,
                                    check_crc32=verify_checksums and (batch_crc or crc64_last),
                                    crc64_shares=crc64_last)
        self._batches: list[BatchInfo] | None = None
        if verify_checksums and not crc64_last:
            actual = crc64_xz(memoryview(data)[HEADER_SIZE : self.size - FOOTER_SIZE])
            if actual != self.header.checksum:
                self.decoder.check_crc32 = True
                self._diagnose()
                self.checks.crc64(actual)

    def _diagnose(self) -> None:
        """Raise the most specific error for a segment whose CRC-64 failed, if one is found."""
        for info in self.batches():
            self.decoder.payload(info)

    @property
    def codec(self) -> Codec:
        return self.header.codec

    def batches(self) -> list[BatchInfo]:
        """Walk the batch headers and check the structure against header and footer."""
        if self._batches is not None:
            return self._batches
        out: list[BatchInfo] = []
        pos = HEADER_SIZE
        end = self.size - FOOTER_SIZE
        records = 0
        prev_base = -1
        while pos < end:
            info = read_batch_header(self.data, pos, len(out), prev_base, end, self.codec, self.path)
            out.append(info)
            records += info.record_count
            prev_base = info.base_offset
            pos = info.end
        self.checks.counts(records, len(out), out[0].base_offset if out else None)
        self._batches = out
        return out

    def payload(self, info: BatchInfo) -> Payload:
        """Check the CRC-32 and decompress one batch."""
        return self.decoder.payload(info)

    def chunk_groups(self, max_chunk_bytes: int) -> list[list[BatchInfo]]:
        """The batches in runs of about ``max_chunk_bytes`` uncompressed (whole batches)."""
        groups: list[list[BatchInfo]] = [[]]
        size = 0
        for info in self.batches():
            if size >= max_chunk_bytes:
                groups.append([])
                size = 0
            groups[-1].append(info)
            size += info.uncompressed_size
        return groups if groups[-1] else []

    def decode_tasks(self, max_chunk_bytes: int, views: bool = False) -> Iterator[DecodeTask]:
        for group in self.chunk_groups(max_chunk_bytes):
            yield group, functools.partial(self.decoder.decode, group, views)

    def iter_columns(self, max_chunk_bytes: int = 32 * 1024 * 1024, threads: int | None = None,
                     views: bool = False) -> Iterator[RecordColumns | ViewColumns]:
        """Decode the segment in chunks of whole batches of about ``max_chunk_bytes``.

        With ``threads`` > 1 (default: :data:`~fsspec_kbs.threads.DECODE_THREADS`) chunks are
        decoded ahead (:func:`~fsspec_kbs.threads.run_in_order`) on the compute pool:
        decompression, the CRCs and the record kernels release the GIL, so one large segment
        uses every core while only it (compressed) and a few chunks are in memory. Chunks are
        still yielded, checked and failed in order. With ``views`` the chunks are
        :class:`ViewColumns` (no copy of the record data).
        """
        return iter_checked(self, max_chunk_bytes, threads, views)

    # ChunkSource: batches() checked the counts and the header's first offset up front.
    def check_first(self, group: Sequence[BatchInfo]) -> None:
        pass

    def check_order(self, group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns, prev_last: int) -> int:
        return self.checks.order(group, cols, prev_last)

    def join_crc64(self, shares: list[int], groups: list[Sequence[BatchInfo]]) -> int:
        return self.checks.join(shares, groups)

    def check_end(self, crc: int, last: int) -> None:
        self.checks.end(crc, last)

    def read_all(self) -> RecordColumns | None:
        """Every record of the segment as one :class:`RecordColumns` (None when empty)."""
        chunks = list(self.iter_columns(max_chunk_bytes=2**62))
        return chunks[0] if chunks else None


@dataclass(frozen=True)
class CompressedBatch:
    """A batch compressed and ready to be placed in a segment."""

    base_offset: int
    last_offset: int
    count: int
    min_timestamp: int
    max_timestamp: int
    uncompressed_size: int
    frame: bytes

    @property
    def size(self) -> int:
        return BATCH_HEADER_SIZE + len(self.frame)


def compress_batch(batch: EncodedBatch, codec: Codec, level: int | None = None) -> CompressedBatch:
    return CompressedBatch(
        base_offset=batch.base_offset,
        last_offset=batch.last_offset,
        count=batch.count,
        min_timestamp=batch.min_timestamp,
        max_timestamp=batch.max_timestamp,
        uncompressed_size=len(batch.data),
        frame=compress(codec, batch.data, level),
    )


def segment_parts(
    batches: Sequence[CompressedBatch], codec: Codec, flags: int = 0
) -> tuple[list[bytes], SegmentStats]:
    """Header, batch headers and frames, and footer of a complete segment file, in file order
    (written one after another, a local segment is never copied into one buffer)."""
    parts: list[bytes] = []
    crc = crc64_xz(b"")
    for b in batches:
        head = _BATCH.pack(b.base_offset, b.count, len(b.frame), b.uncompressed_size, crc32(b.frame))
        crc = crc64_xz(b.frame, crc64_xz(head, crc))
        parts.append(head)
        parts.append(b.frame)
    records = sum(b.count for b in batches)
    first = batches[0].base_offset if batches else 0
    last = batches[-1].last_offset if batches else 0
    header = SegmentHeader(codec, flags, first, records, crc).pack()
    footer = SegmentFooter(last, len(batches)).pack()
    parts = [header, *parts, footer]
    stats = SegmentStats(
        first_offset=first,
        last_offset=last,
        records=records,
        min_timestamp=min(b.min_timestamp for b in batches) if batches else None,
        max_timestamp=max(b.max_timestamp for b in batches) if batches else None,
        size_bytes=sum(map(len, parts)),
        crc64=crc,
        uncompressed_bytes=sum(b.uncompressed_size for b in batches),
        batches=len(batches),
    )
    return parts, stats


def assemble_segment(
    batches: Sequence[CompressedBatch], codec: Codec, flags: int = 0
) -> tuple[bytes, SegmentStats]:
    """Lay out header, batches and footer of a complete segment file."""
    parts, stats = segment_parts(batches, codec, flags)
    return b"".join(parts), stats


def encode_segment(
    batches: Sequence[EncodedBatch], codec: Codec, level: int | None = None, flags: int = 0
) -> tuple[bytes, SegmentStats]:
    """Compress ``batches`` and assemble a complete segment file."""
    return assemble_segment([compress_batch(b, codec, level) for b in batches], codec, flags)
