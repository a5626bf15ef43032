"""Batch index files (kbs-format.md §7): one ``segment-NNNNNNNN.index`` per segment, mapping each
batch to its offsets, timestamps and byte position, so that a reader fetches only the batches a
query needs. Pure bytes: no I/O (see :mod:`fsspec_kbs.store.batch_index` for that).

Entries are kept as one numpy structured array (the file's own layout, parsed without a copy):
a segment may hold thousands of batches, and every check and :meth:`BatchIndex.select` runs
vectorised over them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

import numpy as np

from fsspec_kbs.errors import BatchIndexDamagedError, BatchIndexError, SegmentFormatError
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import (
    BATCH_HEADER_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    INT64_MAX,
    BatchDecoder,
    BatchInfo,
    CompressedBatch,
    SegmentReader,
    SegmentStats,
    assemble_segment,
    read_batch_header,
)

INDEX_MAGIC = b"KBSI"
INDEX_VERSION = 1
INDEX_HEADER_SIZE = 16
ENTRY_SIZE = 40
INDEX_SUFFIX = ".index"
#: Byte ranges closer than this are fetched as one (the bytes between are read and dropped):
#: on object stores a request costs about what 64 KiB take to transfer.
DEFAULT_GAP = 64 * 1024

_HEADER = struct.Struct("<4sBBHII")
#: One entry, as stored (little-endian, 40 bytes).
ENTRY_DTYPE = np.dtype([
    ("base_offset", "<u8"), ("last_offset", "<u8"), ("position", "<u8"),
    ("min_timestamp", "<i8"), ("max_timestamp", "<i8"),
])
# Byte offset of each field inside an entry, to locate errors.
_FIELD_AT = {name: ENTRY_DTYPE.fields[name][1] for name in ENTRY_DTYPE.names}  # type: ignore[index]


@dataclass(frozen=True)
class IndexEntry:
    """One batch: its offsets, the byte position of its 24-byte header, its timestamps."""

    base_offset: int
    last_offset: int
    position: int
    min_timestamp: int
    max_timestamp: int


def entries_array(entries: Sequence[IndexEntry] | np.ndarray) -> np.ndarray:
    """``entries`` as an :data:`ENTRY_DTYPE` array (returned as is when it already is one)."""
    if isinstance(entries, np.ndarray):
        return entries if entries.dtype == ENTRY_DTYPE else entries.astype(ENTRY_DTYPE)
    return np.array([(e.base_offset, e.last_offset, e.position, e.min_timestamp, e.max_timestamp)
                     for e in entries], dtype=ENTRY_DTYPE)


def encode_index(entries: Sequence[IndexEntry] | np.ndarray) -> bytes:
    """The bytes of an index file holding ``entries`` (in batch order)."""
    body = entries_array(entries).tobytes()
    count = len(body) // ENTRY_SIZE
    return _HEADER.pack(INDEX_MAGIC, INDEX_VERSION, 0, 0, count, crc32(body)) + body


def index_entries(batches: Sequence[CompressedBatch]) -> np.ndarray:
    """The entries of the segment :func:`~fsspec_kbs.format.segment.assemble_segment` lays out
    from ``batches``: everything is known at write time, nothing is decoded again."""
    out = np.empty(len(batches), dtype=ENTRY_DTYPE)
    if not batches:
        return out
    sizes = np.fromiter((b.size for b in batches), dtype=np.uint64, count=len(batches))
    out["position"] = HEADER_SIZE + np.cumsum(sizes) - sizes
    out["base_offset"] = [b.base_offset for b in batches]
    out["last_offset"] = [b.last_offset for b in batches]
    out["min_timestamp"] = [b.min_timestamp for b in batches]
    out["max_timestamp"] = [b.max_timestamp for b in batches]
    return out


def assemble_indexed_segment(batches: Sequence[CompressedBatch], codec: Codec,
                             flags: int = 0) -> tuple[bytes, SegmentStats, bytes]:
    """:func:`~fsspec_kbs.format.segment.assemble_segment` plus the segment's index file bytes
    (store ``crc32(index)`` as the manifest's ``index_crc32``)."""
    data, stats = assemble_segment(batches, codec, flags)
    return data, stats, encode_index(index_entries(batches))


def index_from_segment(reader: SegmentReader, max_chunk_bytes: int = 32 * 1024 * 1024) -> np.ndarray:
    """The exact entries of an existing segment, by decoding it (to add an index to a 1.1
    backup, or for ``validate`` to compare an index with). Runs every check of ``reader``."""
    infos = reader.batches()
    out = np.empty(len(infos), dtype=ENTRY_DTYPE)
    out["position"] = [i.position for i in infos]
    out["base_offset"] = [i.base_offset for i in infos]
    # iter_columns decodes chunk_groups(max_chunk_bytes), in order: zip them to split rows by batch.
    row_batch = 0
    for group, cols in zip(reader.chunk_groups(max_chunk_bytes),
                           reader.iter_columns(max_chunk_bytes, threads=1), strict=True):
        _last, lo, hi = _per_batch(group, cols)
        sl = slice(row_batch, row_batch + len(group))
        out["last_offset"][sl], out["min_timestamp"][sl], out["max_timestamp"][sl] = _last, lo, hi
        row_batch += len(group)
    return out


def _per_batch(group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Last offset, min and max timestamp of each batch of ``group`` from its decoded rows."""
    counts = np.fromiter((i.record_count for i in group), dtype=np.int64, count=len(group))
    ends = np.cumsum(counts)
    starts = ends - counts
    ts = np.asarray(cols.timestamps)
    return (np.asarray(cols.offsets)[ends - 1], np.minimum.reduceat(ts, starts),
            np.maximum.reduceat(ts, starts))


class BatchIndex:
    """A parsed, checked batch index (build with :func:`parse_index`).

    Attributes are int64 arrays, one item per batch: ``base``, ``last``, ``position``, ``end``
    (where the batch's stored bytes end), ``min_ts``, ``max_ts``; ``entries`` is the raw
    :data:`ENTRY_DTYPE` array.
    """

    def __init__(self, entries: np.ndarray, segment_size: int, segment_path: str | None = None,
                 index_path: str | None = None) -> None:
        self.entries = entries
        self.segment_size = segment_size
        self.segment_path = segment_path
        self.index_path = index_path
        self.base = entries["base_offset"].astype(np.int64)
        self.last = entries["last_offset"].astype(np.int64)
        self.position = entries["position"].astype(np.int64)
        self.min_ts = entries["min_timestamp"].astype(np.int64)
        self.max_ts = entries["max_timestamp"].astype(np.int64)
        self.end = np.append(self.position[1:], np.int64(segment_size - FOOTER_SIZE))[: len(entries)]

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, i: int) -> IndexEntry:
        e = self.entries[i]
        return IndexEntry(*(int(e[name]) for name in ENTRY_DTYPE.names))  # type: ignore[union-attr]

    def select(self, start_offset: int | None = None, end_offset: int | None = None,
               start_time: int | None = None, end_time: int | None = None) -> list[tuple[int, int]]:
        """Runs ``(first, stop)`` of consecutive batches that may hold a record in the bounds
        (start inclusive, end exclusive; None is unbounded), in order.

        Offsets select on base offsets only: batch ``i`` is taken to cover
        ``[base[i], base[i + 1])`` (the last batch: from its base on), so a wrong ``last``
        offset can never hide a batch (reading it then reports the lie); at most one batch
        more is read when ``start_offset`` falls in a gap of a compacted topic. Timestamps
        need not increase from batch to batch, so they are compared batch by batch.
        """
        n = len(self)
        lo = 0 if start_offset is None else max(0, int(np.searchsorted(self.base, start_offset, "right")) - 1)
        hi = n if end_offset is None else int(np.searchsorted(self.base, end_offset, "left"))
        if hi <= lo:
            return []
        if start_time is None and end_time is None:
            return [(lo, hi)]
        keep = np.ones(hi - lo, dtype=np.bool_)
        if start_time is not None:
            keep &= self.max_ts[lo:hi] >= start_time
        if end_time is not None:
            keep &= self.min_ts[lo:hi] < end_time
        edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
        return [(lo + int(a), lo + int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]

    def byte_ranges(self, runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """``(start, end)`` of the stored bytes (batch headers and frames) of each run."""
        return [(int(self.position[a]), int(self.end[b - 1])) for a, b in runs]

    def stored_bytes(self, runs: Sequence[tuple[int, int]]) -> int:
        """Stored bytes of the batches in ``runs`` (what reading exactly them costs)."""
        return sum(e - s for s, e in self.byte_ranges(runs))


def coalesce(ranges: Sequence[tuple[int, int]], gap: int = DEFAULT_GAP) -> list[tuple[int, int]]:
    """Merge byte ranges ``(start, end)`` (end exclusive) that overlap or lie at most ``gap``
    bytes apart, in order: fewer requests for a few bytes more."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(ranges):
        if out and s - out[-1][1] <= gap:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def parse_index(data: bytes | memoryview, index_path: str | None, segment_path: str | None,
                segment_size: int, file_crc32: int | None = None) -> BatchIndex:
    """Parse an index file and make every structural check of kbs-format.md §7.

    ``segment_size`` is the size of the segment file (its last batch must end right before
    the footer); ``file_crc32`` the manifest's ``index_crc32``, when it has one.

    Raises :class:`~fsspec_kbs.errors.BatchIndexDamagedError` when the index cannot be used
    but the segment can be read without it: a CRC-32 does not match (damage), its version or
    flags are unknown, or its header is malformed while no ``file_crc32`` covers the header.
    Raises :class:`~fsspec_kbs.errors.BatchIndexError` for any other defect: those are in bytes
    a matching CRC vouches for, so the writer wrote them (a lying index is corruption).
    """
    mv = memoryview(data).cast("B")
    err = partial(_fail, BatchIndexError, index_path, segment_path)
    damaged = partial(_fail, BatchIndexDamagedError, index_path, segment_path)
    if file_crc32 is not None:
        actual = crc32(mv)
        if actual != file_crc32:
            damaged(f"index CRC-32 is {actual:#010x} but the manifest says {file_crc32:#010x}", 0)
    # The header's fields are not covered by its own CRC: without the manifest's, a bad one is damage.
    bad_header = err if file_crc32 is not None else damaged
    if len(mv) < INDEX_HEADER_SIZE:
        bad_header(f"index file is {len(mv)} bytes, shorter than its {INDEX_HEADER_SIZE}-byte header", len(mv))
    magic, version, flags, reserved, count, crc = _HEADER.unpack_from(mv, 0)
    if magic != INDEX_MAGIC:
        bad_header(f"index magic is {bytes(magic)!r}, expected {INDEX_MAGIC!r}", 0)
    if version != INDEX_VERSION:
        # A newer index may mean something else: read the segment without it.
        damaged(f"index version {version} is not supported (this reader knows {INDEX_VERSION})", 4)
    if flags or reserved:
        damaged(f"index flags {flags:#x} / reserved {reserved:#x} are not 0 (unknown features)", 5)
    if len(mv) != INDEX_HEADER_SIZE + ENTRY_SIZE * count:
        bad_header(f"index header says {count} entries ({INDEX_HEADER_SIZE + ENTRY_SIZE * count} bytes) "
                   f"but the file is {len(mv)} bytes", 8)
    body = mv[INDEX_HEADER_SIZE:]
    actual = crc32(body)
    if actual != crc:
        damaged(f"entries' CRC-32 is {actual:#010x} but the index header says {crc:#010x}", 12)
    entries = np.frombuffer(body, dtype=ENTRY_DTYPE, count=count)
    _check_entries(entries, segment_size, err)
    return BatchIndex(entries, segment_size, segment_path, index_path)


def _fail(cls: type[BatchIndexError], index_path: str | None, segment_path: str | None,
          message: str, offset: int) -> NoReturn:
    raise cls(message, index_path, offset, segment_path, index_path)


def _check_entries(e: np.ndarray, segment_size: int, err: partial) -> None:
    """The checks of §7 between entries, and against the segment's size (``err`` raises)."""
    n = len(e)

    def first_bad(bad: np.ndarray, name: str, what: str) -> None:
        if bad.any():
            i = int(np.argmax(bad))
            err(f"entry {i}: {what(i) if callable(what) else what}", INDEX_HEADER_SIZE + ENTRY_SIZE * i + _FIELD_AT[name])

    if segment_size < HEADER_SIZE + FOOTER_SIZE:
        err(f"segment is {segment_size} bytes, too short for a header and footer", 0)
    if n == 0:
        if segment_size != HEADER_SIZE + FOOTER_SIZE:
            err(f"index has no entries but the segment holds {segment_size - HEADER_SIZE - FOOTER_SIZE} "
                "bytes of batches", 8)
        return
    base, last, pos = e["base_offset"], e["last_offset"], e["position"]
    first_bad(base > INT64_MAX, "base_offset", "base offset exceeds 2^63-1")
    first_bad(last > INT64_MAX, "last_offset", "last offset exceeds 2^63-1")
    first_bad(base > last, "base_offset", lambda i: f"base offset {base[i]} is above its last offset {last[i]}")
    first_bad(np.concatenate(([False], base[1:] <= last[:-1])), "base_offset",
              lambda i: f"base offset {base[i]} is not above the previous entry's last offset {last[i - 1]}")
    first_bad(e["min_timestamp"] > e["max_timestamp"], "min_timestamp",
              lambda i: f"min timestamp {e['min_timestamp'][i]} is above its max {e['max_timestamp'][i]}")
    if int(pos[0]) != HEADER_SIZE:
        err(f"entry 0: first batch at byte {pos[0]}, expected {HEADER_SIZE} (right after the segment header)",
            INDEX_HEADER_SIZE + _FIELD_AT["position"])
    end = segment_size - FOOTER_SIZE
    first_bad(pos > end, "position", lambda i: f"position {pos[i]} is past the segment's batches (they end at {end})")
    # Every batch needs its 24-byte header and at least one frame byte; the last one ends
    # exactly where the footer starts (it has no next entry: its length is what is left).
    p = pos.astype(np.int64)
    lengths = np.append(p[1:], end) - p
    first_bad(lengths <= BATCH_HEADER_SIZE, "position",
              lambda i: f"batch at byte {pos[i]} would be {lengths[i]} bytes, too short for a batch "
                        "(positions must increase by more than a batch header, the last one end before the footer)")


# -- reading batches through the index -----------------------------------------------------------

def decode_batches(data: bytes | memoryview, data_start: int, index: BatchIndex, first: int, stop: int,
                   codec: Codec, views: bool = False) -> RecordColumns | ViewColumns:
    """Decode batches ``first:stop`` of ``index`` from ``data``, the segment's bytes from file
    offset ``data_start`` on (covering those batches), with every check of §7.

    Each batch's header must agree with its entry (base offset; record count at most the
    entry's offset span; stored length), its CRC-32 must match, and its records must lie
    within the entry's offsets and timestamps. A disagreement raises
    :class:`~fsspec_kbs.errors.BatchIndexError`; a damaged batch raises the error the segment
    reader raises (e.g. ``ChecksumError``). Every error names the segment and the index.
    """
    sp, ip = index.segment_path, index.index_path
    # Positions stay segment file positions, so every error names the byte in the segment.
    run = BatchDecoder(data, data_start, codec, sp, check_crc32=True)
    group: list[BatchInfo] = []
    try:
        for i in range(first, stop):
            pos, end, base = int(index.position[i]), int(index.end[i]), int(index.base[i])
            if pos < data_start or end - data_start > len(run.data):
                raise ValueError(f"batch {i} (bytes {pos}..{end}) is not within the data given")
            try:
                info = read_batch_header(run.data, pos, i, -1, end, codec, sp, data_start)
            except SegmentFormatError as e:
                raise BatchIndexError(f"batch {i}: {e.reason}", sp, e.offset, sp, ip) from e
            if info.end != end:
                raise BatchIndexError(
                    f"batch {i} is {info.end - pos} bytes but the index gives it {end - pos}", sp, pos + 12, sp, ip)
            if info.base_offset != base:
                raise BatchIndexError(
                    f"batch {i} base offset is {info.base_offset} but the index says {base}", sp, pos, sp, ip)
            if info.record_count > int(index.last[i]) - base + 1:
                raise BatchIndexError(
                    f"batch {i} holds {info.record_count} records, more than the index's offsets "
                    f"{base}..{index.last[i]} allow", sp, pos + 8, sp, ip)
            group.append(info)
        cols, _ = run.decode(group, views)
    except BatchIndexError:
        raise
    except SegmentFormatError as e:
        # Damage in the batch bytes (CRC-32, frame, records): keep its kind, name both files.
        raise _naming_index(e, ip) from e
    if group:
        _check_bounds(index, first, group, cols)
    return cols


def decode_batch(data: bytes | memoryview, entry: IndexEntry, codec: Codec,
                 segment_path: str | None = None, index_path: str | None = None,
                 views: bool = False) -> RecordColumns | ViewColumns:
    """Decode ONE batch: ``data`` is its stored bytes (24-byte header and frame), ``entry`` its
    index entry, checked as :func:`decode_batches` does."""
    # As the only entry of a segment ending right after it: its stored length is len(data).
    one = BatchIndex(entries_array([entry]), entry.position + len(data) + FOOTER_SIZE, segment_path, index_path)
    return decode_batches(data, entry.position, one, 0, 1, codec, views)


def _naming_index(e: SegmentFormatError, index_path: str | None) -> SegmentFormatError:
    out = type(e)(f"{e.reason} (read through batch index {index_path})", e.path, e.offset)
    out.segment_path, out.index_path = e.path, index_path  # type: ignore[attr-defined]
    return out


def _check_bounds(index: BatchIndex, first: int, group: Sequence[BatchInfo],
                  cols: RecordColumns | ViewColumns) -> None:
    """Every decoded batch's records lie within its entry's offsets and timestamps."""
    last, lo, hi = _per_batch(group, cols)
    sl = slice(first, first + len(group))
    for bad, what in (
        (last > index.last[sl], lambda i, j: f"last record at offset {last[j]}, above the index's last offset {index.last[i]}"),
        (lo < index.min_ts[sl], lambda i, j: f"a record at time {lo[j]}, below the index's min timestamp {index.min_ts[i]}"),
        (hi > index.max_ts[sl], lambda i, j: f"a record at time {hi[j]}, above the index's max timestamp {index.max_ts[i]}"),
    ):
        if bad.any():
            j = int(np.argmax(bad))
            i = first + j
            raise BatchIndexError(f"batch {i} holds {what(i, j)}", index.segment_path, int(index.position[i]),
                                  index.segment_path, index.index_path)


def verify_index(index: BatchIndex, reader: SegmentReader) -> None:
    """Compare ``index`` with the segment ``reader`` holds, read whole (for ``validate``): same
    batches at the same positions and base offsets, each within its entry's bounds."""
    actual = index_from_segment(reader)
    sp, ip = index.segment_path, index.index_path
    if len(actual) != len(index):
        raise BatchIndexError(f"index has {len(index)} entries but the segment holds {len(actual)} batches",
                              ip, 8, sp, ip)
    checks = (
        ("position", actual["position"] != index.entries["position"], "batch is at byte {a}, the index says {x}"),
        ("base_offset", actual["base_offset"] != index.entries["base_offset"], "batch starts at offset {a}, the index says {x}"),
        ("last_offset", actual["last_offset"] > index.entries["last_offset"], "batch ends at offset {a}, above the index's {x}"),
        ("min_timestamp", actual["min_timestamp"] < index.entries["min_timestamp"], "batch has a record at {a}, below the index's min {x}"),
        ("max_timestamp", actual["max_timestamp"] > index.entries["max_timestamp"], "batch has a record at {a}, above the index's max {x}"),
    )
    for name, bad, what in checks:
        if bad.any():
            i = int(np.argmax(bad))
            raise BatchIndexError(f"entry {i}: " + what.format(a=actual[name][i], x=index.entries[name][i]),
                                  ip, INDEX_HEADER_SIZE + ENTRY_SIZE * i + _FIELD_AT[name], sp, ip)
