"""Batch indexes on a filesystem (kbs-format.md §7): find, read and use a segment's
``segment-NNNNNNNN.index`` to fetch only the batches a query needs.

The format side (parsing, checks, selection, decoding) is :mod:`fsspec_kbs.format.batch_index`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import fsspec

from fsspec_kbs.errors import (
    BatchIndexDamagedError,
    BatchIndexError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.format.batch_index import (
    DEFAULT_GAP,
    INDEX_SUFFIX,
    BatchIndex,
    coalesce,
    decode_batches,
    parse_index,
)
from fsspec_kbs.format.codecs import CODEC_BY_NAME, Codec
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import (
    BATCH_HEADER_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    Decoded,
    DecodeTask,
    SegmentFooter,
    SegmentHeader,
    iter_checked,
)
from fsspec_kbs.store.opened import OpenedSegment, iter_opened
from fsspec_kbs.store.segment_ref import SegmentRef

if TYPE_CHECKING:
    from fsspec_kbs.store.layout import Backup

SEGMENT_SUFFIX = ".kbs"


def index_path(segment_path: str) -> str:
    """The index file of a segment: same directory and stem, ``.index`` for ``.kbs``."""
    if not segment_path.endswith(SEGMENT_SUFFIX):
        raise ValueError(f"{segment_path} is not a segment file (*{SEGMENT_SUFFIX})")
    return segment_path[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX


class IndexLookup(NamedTuple):
    """What :func:`read_index` found: the index, or None and why it cannot be used."""

    index: BatchIndex | None
    reason: str | None = None


def read_index(fs: fsspec.AbstractFileSystem, segment_path: str, segment_size: int,
               expected_crc32: int | None = None) -> IndexLookup:
    """Read and check the index of the segment at ``segment_path`` (``segment_size`` bytes).

    ``expected_crc32`` is the manifest's ``index_crc32`` for the segment, if any. Returns
    ``(None, reason)`` when there is no index file or it cannot be used (damaged: a CRC-32
    does not match; unknown version): read the segment whole then, and let ``validate``
    report ``reason``. Raises :class:`~fsspec_kbs.errors.BatchIndexError` for an index whose
    CRCs match but whose entries break §7 (written wrong: corruption).
    """
    path = index_path(segment_path)
    try:
        data: bytes | Exception = fs.cat_file(path)
    except FileNotFoundError as e:
        data = e
    return index_lookup(data, path, segment_path, segment_size, expected_crc32)


def index_lookup(data: bytes | Exception, path: str, segment_path: str, segment_size: int,
                 expected_crc32: int | None = None) -> IndexLookup:
    """:func:`read_index` of bytes already read (or the error reading them raised)."""
    if isinstance(data, FileNotFoundError):
        return IndexLookup(None, f"{path}: no batch index")
    if isinstance(data, IsADirectoryError):
        return IndexLookup(None, f"{path}: is a directory, not a batch index")
    if isinstance(data, Exception):
        raise data
    try:
        return IndexLookup(parse_index(data, path, segment_path, segment_size, expected_crc32))
    except BatchIndexDamagedError as e:
        return IndexLookup(None, str(e))


class IndexedSource:
    """The batch runs ``runs`` (from :meth:`BatchIndex.select`) of one segment, read through
    its index, as a :class:`~fsspec_kbs.format.segment.ChunkSource`: whole batches, decoded
    and checked (§7) in order, not filtered to a query.

    The first :meth:`decode_tasks` call fetches all byte ranges, coalesced (``gap``), and the
    32-byte segment header and 16-byte footer with one ``fs.cat_ranges`` call, so everything selected is in
    memory at once: for a selection near the whole segment, read the segment instead. The
    header gives the codec (which must equal ``codec`` when given) and its CRC-64 must equal
    ``crc64`` (the manifest's) when given: a segment replaced after its index was written is
    caught; the footer must end the file where the index says and agree with its batch count
    and last entry. The segment CRC-64 itself cannot be checked without reading the whole
    segment; each batch's CRC-32 is. ``read_header=False`` (needs ``codec``) skips header and
    footer: fewer requests when the selection is far from both, without those checks.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, segment_path: str, index: BatchIndex,
                 runs: Sequence[tuple[int, int]], *, codec: Codec | None = None, crc64: int | None = None,
                 gap: int = DEFAULT_GAP, read_header: bool = True) -> None:
        if not read_header and codec is None:
            raise ValueError("read_header=False needs the codec")
        self.fs, self.path, self.index, self.runs = fs, segment_path, index, list(runs)
        self.codec, self.crc64, self.gap, self.read_header = codec, crc64, gap, read_header

    @property
    def stored_bytes(self) -> int:
        return self.index.stored_bytes(self.runs)

    def decode_tasks(self, max_chunk_bytes: int, views: bool) -> Iterator[DecodeTask]:
        index, path = self.index, self.path
        chunks = _split(index, self.runs, max_chunk_bytes)
        if not chunks:
            return
        size = index.segment_size
        # The segment's header and footer too (48 bytes, in the same call): a footer that does
        # not end the file where the index says, or disagrees with it, is caught here.
        ends = [(0, HEADER_SIZE), (size - FOOTER_SIZE, size)] if self.read_header else []
        # The header of the batch after each run (it adjoins the run: no extra request) must
        # start where its entry says: a base offset raised in a CRC-valid index cannot hide
        # that batch from an offset query ending below its real first record.
        nexts = [int(index.position[stop]) for _, stop in self.runs if stop < len(index)]
        wanted = coalesce([*ends, *((p, p + BATCH_HEADER_SIZE) for p in nexts), *index.byte_ranges(chunks)],
                          self.gap)
        blobs = self.fs.cat_ranges([path] * len(wanted), [s for s, _ in wanted], [e for _, e in wanted],
                                   on_error="raise")
        for (s, e), blob in zip(wanted, blobs, strict=True):
            if len(blob) != e - s:
                raise TruncatedSegmentError(f"file ends at byte {s + len(blob)}, the batch index {index.index_path} "
                                            f"expects {index.segment_size} bytes", path, s + len(blob))
        codec = self.codec
        if self.read_header:
            codec = _check_header(blobs[0][:HEADER_SIZE], path, index, codec, self.crc64).codec
            _check_footer(_slice(wanted, blobs, size - FOOTER_SIZE, size), path, index)
        for p in nexts:
            _check_next(_slice(wanted, blobs, p, p + BATCH_HEADER_SIZE), p, path, index)
        assert codec is not None
        k = 0
        for first, stop in chunks:
            pos = int(index.position[first])
            while wanted[k][1] <= pos:  # chunks and fetched ranges are both in file order
                k += 1
            decode = partial(decode_batches, memoryview(blobs[k]), wanted[k][0], index, first, stop, codec, views)
            yield list(range(first, stop)), partial(_no_crc64_share, decode)  # type: ignore[misc]

    # The checks across chunks (ChunkSource): each batch's own checks ran as it was decoded;
    # what is left is that offsets keep increasing. No CRC-64 or footer: the read is partial.
    def check_first(self, group: Sequence[int]) -> None:
        pass

    def check_order(self, group: Sequence[int], cols: RecordColumns | ViewColumns, prev_last: int) -> int:
        if not len(cols):
            return prev_last
        if int(cols.offsets[0]) <= prev_last:
            raise BatchIndexError(f"batch {group[0]} starts at offset {int(cols.offsets[0])}, not above the "
                                  f"previous batch's last offset {prev_last}", self.path,
                                  int(self.index.position[group[0]]), self.path, self.index.index_path)
        return int(cols.offsets[-1])

    def join_crc64(self, shares: list[int], groups: list[Sequence[int]]) -> int:
        return 0

    def check_end(self, crc: int, last: int) -> None:
        pass


def _no_crc64_share(decode: Callable[[], RecordColumns | ViewColumns]) -> Decoded:
    return decode(), 0


def read_batches(fs: fsspec.AbstractFileSystem, segment_path: str, index: BatchIndex,
                 ranges: Sequence[tuple[int, int]], *, codec: Codec | None = None, crc64: int | None = None,
                 gap: int = DEFAULT_GAP, max_chunk_bytes: int = 32 * 1024 * 1024, views: bool = False,
                 threads: int | None = None, read_header: bool = True) -> Iterator[RecordColumns | ViewColumns]:
    """Records of the batch runs ``ranges`` of a segment, read through its index, decoded and
    checked, in order (:class:`IndexedSource`; ``threads`` as
    :func:`~fsspec_kbs.threads.run_in_order`)."""
    source = IndexedSource(fs, segment_path, index, ranges, codec=codec, crc64=crc64, gap=gap,
                           read_header=read_header)
    yield from iter_checked(source, max_chunk_bytes, threads, views)  # type: ignore[arg-type]


def read_runs(backup: Backup[Any], ref: SegmentRef, index: BatchIndex, runs: Sequence[tuple[int, int]],
              verify: bool = True, max_chunk_bytes: int = 32 * 1024 * 1024) -> Iterator[RecordColumns | ViewColumns]:
    """The records of the batch ``runs`` of ``ref`` (its ``index`` from
    :meth:`Backup.batch_index <fsspec_kbs.store.layout.Backup.batch_index>`), read by ranged
    reads: the header checked against the ref's codec and CRC-64, every batch's CRC-32 and
    bounds (:class:`IndexedSource`). A format error is re-diagnosed on the whole segment
    (:meth:`~fsspec_kbs.store.layout.Backup.rediagnose`), as
    :meth:`~fsspec_kbs.store.layout.Backup.iter_columns` does."""
    codec = CODEC_BY_NAME[ref.codec] if ref.codec is not None else None
    source = IndexedSource(backup.fs, ref.path, index, runs, codec=codec, crc64=ref.crc64)
    try:
        yield from iter_opened(OpenedSegment(ref, source, partial=True), max_chunk_bytes)
    except SegmentFormatError as err:
        backup.rediagnose(ref, verify, err)


def _check_header(data: bytes, segment_path: str, index: BatchIndex, codec: Codec | None,
                  crc64: int | None) -> SegmentHeader:
    """The segment header, checked against the caller's codec, CRC-64 and the index."""
    header = SegmentHeader.parse(data, segment_path)
    if codec is not None and header.codec != codec:
        raise SegmentMismatchError(f"segment codec is {header.codec.name}, expected {codec.name}", segment_path, 5)
    if crc64 is not None and header.checksum != crc64:
        raise SegmentMismatchError(
            f"header CRC-64 {header.checksum} differs from the manifest's {crc64} "
            "(the segment was replaced after the manifest was written)", segment_path, 24)
    if len(index) and header.first_offset != int(index.base[0]):
        raise BatchIndexError(f"header first offset {header.first_offset} but the index's first batch starts "
                              f"at {index.base[0]}", segment_path, 8, segment_path, index.index_path)
    return header


def _slice(wanted: Sequence[tuple[int, int]], blobs: Sequence[bytes], start: int, end: int) -> bytes:
    """Bytes ``start:end`` of the file from the fetched ranges (one of them holds them)."""
    for (s, e), blob in zip(wanted, blobs, strict=True):
        if s <= start and end <= e:
            return blob[start - s:end - s]
    raise AssertionError(f"bytes {start}..{end} were not fetched")


def _check_next(head: bytes, pos: int, segment_path: str, index: BatchIndex) -> None:
    """The batch header at ``pos`` (the batch after a run) has its entry's base offset."""
    i = int(index.position.searchsorted(pos))
    base = int.from_bytes(head[:8], "little")
    if base != int(index.base[i]):
        raise BatchIndexError(f"batch {i} base offset is {base} but the index says {index.base[i]}",
                              segment_path, pos, segment_path, index.index_path)


def _check_footer(tail: bytes, segment_path: str, index: BatchIndex) -> None:
    """The segment footer agrees with the index: same batch count, last offset in the last entry."""
    footer = SegmentFooter.parse_tail(tail, index.segment_size, segment_path)
    if footer.batch_count != len(index):
        raise BatchIndexError(f"footer counts {footer.batch_count} batches but the index has {len(index)} entries",
                              segment_path, index.segment_size - 8, segment_path, index.index_path)
    if len(index) and not int(index.base[-1]) <= footer.last_offset <= int(index.last[-1]):
        raise BatchIndexError(f"footer last offset {footer.last_offset} is outside the index's last batch "
                              f"{index.base[-1]}..{index.last[-1]}", segment_path, index.segment_size - FOOTER_SIZE,
                              segment_path, index.index_path)


def _split(index: BatchIndex, runs: Sequence[tuple[int, int]], max_bytes: int) -> list[tuple[int, int]]:
    """``runs`` in file order, cut into chunks of whole batches of about ``max_bytes`` stored."""
    out: list[tuple[int, int]] = []
    prev = 0
    for first, stop in sorted(runs):
        if not 0 <= first < stop <= len(index) or first < prev:
            raise ValueError(f"batch run {first}:{stop} is empty, out of range or overlaps another")
        prev = stop
        a = first
        while a < stop:
            # First batch whose end reaches max_bytes past this chunk's start (at least one batch).
            b = int(index.end.searchsorted(index.position[a] + max_bytes, "left")) + 1
            b = min(max(b, a + 1), stop)
            out.append((a, b))
            a = b
    return out
