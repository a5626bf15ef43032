"""Batch reader of the ``kbs`` data source: plan on the driver, decode on executors.

The driver reads ``manifest.json`` once (:meth:`KbsReader.partitions`); each input partition
(:class:`~fsspec_kbs.spark.partition.KbsSegmentPartition`) then carries everything its task
needs as small frozen values: a :class:`~fsspec_kbs.spark.partition.SegmentPiece` per segment
(its :class:`SegmentRef` with path, size, CRC-64, offsets, timestamps, index CRC and codec; the
offset bounds; the OSO size limit; for a batch range of a large or bounded indexed segment its
:class:`~fsspec_kbs.spark.partition.BatchRun`), the layout and the CRC-32 of the manifest it
was planned from. Executors build the backup object from the URL and those refs and never read
the manifest; a segment that no longer matches its ref fails as :class:`BackupChangedError`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import sys
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from fsspec_kbs.arrow import COLUMNS, columns_to_batch
from fsspec_kbs.arrow.convert import bool_mask, numpy_array
from fsspec_kbs.arrow.schema import HEADER_TYPE, project
from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import (
    BackupNotFoundError,
    KbsError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.filters import ScanFilter
from fsspec_kbs.format.batch_index import BatchIndex
from fsspec_kbs.format.codecs import CODEC_BY_NAME
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.spark.filters import translate
from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.spark.partition import BatchRun, KbsSegmentPartition, SegmentPiece, group_pieces
from fsspec_kbs.store import KbsBackup, SegmentRef
from fsspec_kbs.store.backup import read_manifest_bytes, resolve
from fsspec_kbs.store.batch_index import IndexedSource
from fsspec_kbs.store.open import _layout
from fsspec_kbs.store.opened import OpenedSegment, iter_opened
from fsspec_kbs.store.oso_backup import OsoBackup

log = logging.getLogger("fsspec_kbs.spark")

#: Corrupt segments skipped by ``onCorrupt=skip`` in this process, as ``{path: error}``.
#: Executors are separate processes: there the count goes to the executor log.
SKIPPED_SEGMENTS: dict[str, str] = {}


class KbsCorruptSegmentWarning(UserWarning):
    """A corrupt segment was skipped because the read used ``onCorrupt=skip``."""


class BackupChangedError(SegmentMismatchError):
    """A segment no longer matches the manifest the read was planned from: the backup was
    rewritten (or deleted) while the job ran. Never skipped by ``onCorrupt=skip``."""


#: What a segment replaced or removed after planning raises (size, CRC-64, counts, missing).
_MAYBE_CHANGED = (SegmentMismatchError, TruncatedSegmentError, BackupNotFoundError)


# -- planning (driver) ---------------------------------------------------------------------------

def open_for_planning(o: KbsOptions) -> tuple[KbsBackup, int | None]:
    """The backup and the CRC-32 of the ``manifest.json`` bytes it was parsed from (None: none)."""
    fs, path = resolve(o.path, o.storage_options)
    raw = read_manifest_bytes(fs, path)
    crc = None if raw is None else zlib.crc32(raw)
    if raw is not None:
        # Parsed once as KBS (the layout check would parse a big manifest a second time);
        # only a manifest KBS refuses is looked at for the OSO layout.
        try:
            return KbsBackup.from_storage(fs, path, raw, o.path, o.storage_options, o.allow_incomplete), crc
        except KbsError:
            if _layout(fs, path, raw) != "oso":
                raise
    cls = OsoBackup if _layout(fs, path, raw) == "oso" else KbsBackup
    return cls.from_storage(fs, path, raw, o.path, o.storage_options, o.allow_incomplete), crc


def first_offset_at(backup: KbsBackup, refs: list[SegmentRef], ts: int, verify: bool = True) -> int | None:
    """The first offset (in offset order) of a record with ``timestamp >= ts`` among one
    partition's ``refs``, or None: what Kafka's ``offsetsForTimes`` answers.

    Segments whose batch index confirms a max timestamp below ``ts`` are not opened; in the
    others only the batches that may match are read where the index allows.
    """
    for ref in backup.check_time_bounds(refs):
        if ref.time_checked and ref.max_timestamp is not None and ref.max_timestamp < ts:
            continue
        index = backup.batch_index(ref) if verify else None
        if index is not None:
            # One batch at a time, in offset order, among those whose max timestamp reaches ts:
            # with increasing timestamps the first one read holds the answer.
            chunks = (cols for i in np.flatnonzero(index.max_ts >= ts)
                      for cols in read_runs(backup, ref, index, [(int(i), int(i) + 1)], verify))
        else:
            chunks = backup.iter_columns(ref, verify_checksums=verify, bounds=(None, None, ts, None))
        for cols in chunks:
            hit = np.flatnonzero(cols.timestamps >= ts)
            if len(hit):
                return int(cols.offsets[hit[0]])
    return None


def starting_offset_at(backup: KbsBackup, refs: list[SegmentRef], key: tuple[str, int], ts: int,
                       o: KbsOptions, latest: int | None) -> int | None:
    """Where a read of partition ``key`` (its ``refs``) starts for the starting timestamp
    ``ts``: the first offset at or after it; when there is none, ``latest`` with
    ``startingOffsetsByTimestampStrategy=latest``, else an error (as the Kafka source)."""
    found = first_offset_at(backup, refs, ts, o.verify_checksums)
    if found is not None:
        return found
    if o.by_timestamp_strategy == "error":
        raise ValueError(
            f"no record of {key[0]}/{key[1]} has a timestamp at or after {ts} (the starting timestamp), so "
            "there is no offset to start from; set startingOffsetsByTimestampStrategy=latest to start at "
            "its latest offset instead (a batch read then reads nothing of it)")
    return latest


def _cut(p: SegmentPiece, start_time: int | None, end_time: int | None) -> bool:
    """The piece's bounds leave part of its segment out (or may: unknown extents)."""
    r = p.ref
    return ((p.start is not None and (r.first_offset is None or p.start > r.first_offset))
            or (p.end is not None and (r.last_offset is None or p.end <= r.last_offset))
            or (start_time is not None and (r.min_timestamp is None or start_time > r.min_timestamp))
            or (end_time is not None and (r.max_timestamp is None or end_time <= r.max_timestamp)))


def _batch_runs(p: SegmentPiece, index: BatchIndex, max_bytes: int, start_time: int | None,
                end_time: int | None) -> Iterator[SegmentPiece]:
    """``p`` as runs of whole batches of ``index`` of at most ``max_bytes`` stored bytes (one
    batch at least), among the batches that may hold a record in its bounds."""
    for first, stop in index.select(p.start, p.end, start_time, end_time):
        a = first
        while a < stop:
            # The first batch whose end passes max_bytes past this run's start ends it.
            b = int(index.end.searchsorted(index.position[a] + max_bytes, "right"))
            b = min(max(b, a + 1), stop)
            end_off = int(index.base[b]) if b < len(index) else None
            run = BatchRun((a, b), (int(index.position[a]), int(index.end[b - 1])), (int(index.base[a]), end_off))
            yield replace(p, run=run)
            a = b


def split_by_batches(backup: KbsBackup, pieces: list[SegmentPiece], max_bytes: int,
                     start_time: int | None, end_time: int | None) -> list[SegmentPiece]:
    """Pieces of segments larger than ``max_bytes``, or bounded by offsets or times, cut into
    runs of whole batches of at most ``max_bytes`` stored bytes (one batch at least) by the
    segment's batch index; only the batches that may hold a record in the piece's bounds are
    kept, so a task fetches exactly those bytes. Segments without a usable index stay whole."""
    big = {p.ref.path: p.ref for p in pieces if p.ref.index_crc32 is not None and p.ref.size_bytes is not None
           and (p.weight() > max_bytes or _cut(p, start_time, end_time))}
    if not big:
        return pieces
    # Reads all their indexes at once where the store can; a bad index: that segment is read
    # whole, and its task reports what is wrong.
    with contextlib.suppress(KbsError):
        backup.check_time_bounds(list(big.values()))
    out: list[SegmentPiece] = []
    for p in pieces:
        try:
            index = backup.batch_index(p.ref) if p.ref.path in big else None
        except KbsError:
            index = None
        if index is None or not len(index):
            out.append(p)
        else:
            out.extend(_batch_runs(p, index, max_bytes, start_time, end_time))
    return out


def _missing(what: str, name: str, url: str) -> BackupNotFoundError:
    return BackupNotFoundError(
        f"{what} (option {name!r}) is not in the backup at {url}; set failOnDataLoss=false "
        "to read what the backup has instead")


#: (first offset, next offset) of each topic-partition of a backup; None: unknown (a 1.0 manifest).
Extents = dict[tuple[str, int], tuple[int | None, int | None]]


def _check_requested(o: KbsOptions, extents: Extents) -> None:
    """``failOnDataLoss``: every partition the options name is in the backup."""
    topics = {t for t, _ in extents}
    for t in o.topics or ():
        if t not in topics:
            raise _missing(f"topic {t!r}", "subscribe", o.path)
    for t, p in o.assign or ():
        if (t, p) not in extents:
            raise _missing(f"partition {t}/{p}", "assign", o.path)
    for name, doc in (("startingOffsets", o.starting_offsets), ("endingOffsets", o.ending_offsets),
                      ("startingOffsetsByTimestamp", o.starting_offsets_by_timestamp),
                      ("endingOffsetsByTimestamp", o.ending_offsets_by_timestamp)):
        for t, parts in doc.items():
            for p in parts:
                if (t, int(p)) not in extents:
                    raise _missing(f"partition {t}/{p}", name, o.path)


def _check_offsets(o: KbsOptions, extents: Extents) -> None:
    """``failOnDataLoss``: offsets asked for by ``startingOffsets``/``endingOffsets`` are in
    the backup (from its earliest offset to one past its latest)."""
    for name, doc in (("startingOffsets", o.starting_offsets), ("endingOffsets", o.ending_offsets)):
        for t, parts in doc.items():
            for p, off in parts.items():
                lo, hi = extents.get((t, int(p)), (None, None))
                if off < 0 or lo is None or hi is None:
                    continue
                if off < lo or off > hi:
                    raise BackupNotFoundError(
                        f"option {name!r} asks for offset {off} of {t}/{p}, but the backup at {o.path} "
                        f"holds offsets {lo} to {hi - 1} of it: offsets "
                        f"{f'{off} to {lo - 1}' if off < lo else f'{hi} to {off - 1}'} are not in the "
                        "backup; set failOnDataLoss=false to read what it has")


def refs_by_partition(backup: KbsBackup) -> tuple[dict[tuple[str, int], list[SegmentRef]], Extents]:
    """The backup's refs per topic-partition (in the manifest's order), and each partition's
    extent (None where a ref has no offsets: a 1.0 manifest)."""
    by_part: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in backup.segments():
        by_part.setdefault((ref.topic, ref.partition), []).append(ref)
    extents: Extents = {}
    for key, refs in by_part.items():
        firsts = [r.first_offset for r in refs]
        lasts = [r.last_offset for r in refs]
        extents[key] = (None if None in firsts else min(firsts),  # type: ignore[type-var]
                        None if None in lasts else max(lasts) + 1)  # type: ignore[type-var, operator]
    return by_part, extents


def _time_ranges(backup: KbsBackup, o: KbsOptions, sf: ScanFilter,
                 by_part: dict[tuple[str, int], list[SegmentRef]],
                 extents: Extents) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """The offset range of each partition read that the timestamp options give (found in the data)."""
    ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for (t, p), refs in sorted(by_part.items()):
        if not (sf.wants_partition(t, p) and o.wants(t, p)):
            continue
        start_ts, end_ts = o.starting_time(t, p), o.ending_time(t, p)
        start = end = None
        if start_ts is not None:  # none found with strategy latest: nothing of this partition
            start = starting_offset_at(backup, refs, (t, p), start_ts, o, extents[(t, p)][1])
        if end_ts is not None:
            end = first_offset_at(backup, refs, end_ts, o.verify_checksums)  # None: latest
        if start is not None or end is not None:
            ranges[(t, p)] = (start, end)
    return ranges


def input_partitions(backup: KbsBackup, pieces: list[SegmentPiece], o: KbsOptions, start_time: int | None,
                     end_time: int | None, manifest_crc32: int | None) -> list[KbsSegmentPartition]:
    """``pieces`` grouped as the options say into input partitions (of a read or a micro-batch);
    an OSO segment's piece carries its decompressed-size bound from the manifest."""
    if isinstance(backup, OsoBackup):
        pieces = [replace(p, limit=backup.max_uncompressed(p.ref)) for p in pieces]
    return [KbsSegmentPartition(i, tuple(group), start_time, end_time, backup.layout, manifest_crc32)
            for i, group in enumerate(group_pieces(pieces, o))]


def plan(backup: KbsBackup, o: KbsOptions, pushed: ScanFilter,
         manifest_crc32: int | None = None) -> list[KbsSegmentPartition]:
    """The input partitions of a read: the segments that may match (manifest only), offsets
    found for the timestamp options, grouped as the options say."""
    sf = o.scan_filter().and_(pushed)
    if sf.start_time is not None and sf.end_time is not None and sf.start_time >= sf.end_time:
        return []
    by_part, extents = refs_by_partition(backup)
    if o.fail_on_data_loss:
        _check_requested(o, extents)
        _check_offsets(o, extents)
    if o.time_lookups:
        sf = sf.and_(ScanFilter(offset_ranges=_time_ranges(backup, o, sf, by_part, extents)))
    pieces = [SegmentPiece(ref, *sf.bounds(ref.topic, ref.partition))
              for ref in KbsDataset(backup, sf).fragments() if o.wants(ref.topic, ref.partition)]
    if not isinstance(backup, OsoBackup) and o.verify_checksums:
        # A batch-range read checks batch CRCs: never unchecked.
        pieces = split_by_batches(backup, pieces, o.max_partition_bytes, sf.start_time, sf.end_time)
    return input_partitions(backup, pieces, o, sf.start_time, sf.end_time, manifest_crc32)


# -- reading (executors) -------------------------------------------------------------------------

class KbsReader(DataSourceReader):
    """Reads a backup as DataFrame rows with the schema of Spark's Kafka source.

    Picklable: holds the parsed options, the output column names and the pushed bounds (a
    :class:`ScanFilter`), never a filesystem object; nothing in it grows with the backup.
    """

    def __init__(self, options: KbsOptions, columns: list[str]) -> None:
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"the kbs source has no column(s) {unknown}; it has {list(COLUMNS)}")
        self.options = options
        self.columns = list(columns)
        #: Spark's pushed filters this reader enforces (:class:`KbsPushdownReader`).
        self.pushed = ScanFilter()

    def scan_filter(self) -> ScanFilter:
        return self.options.scan_filter().and_(self.pushed)

    def partitions(self) -> list[KbsSegmentPartition]:
        backup, crc = open_for_planning(self.options)
        parts = plan(backup, self.options, self.pushed, crc)
        _freeze_worker_heap()  # the planner's worker is reused (and collected) as well
        # An empty list would make Spark call read(None); an empty partition is clearer.
        return parts or [KbsSegmentPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None or not getattr(partition, "segments", None):
            return iter(())
        return self._read(partition)  # type: ignore[arg-type]

    def executor_backup(self, partition: KbsSegmentPartition) -> KbsBackup:
        """The backup object a task reads through, built from the URL and the partition's
        layout: no manifest is read (the refs carry what the checks need)."""
        o = self.options
        fs, path = resolve(o.path, o.storage_options)
        cls = OsoBackup if partition.layout == "oso" else KbsBackup
        backup = cls(fs, path, None, o.path, o.storage_options, o.allow_incomplete)
        if isinstance(backup, OsoBackup):
            backup._limits.update({p.ref.path: p.limit for p in partition.segments if p.limit is not None})
        return backup

    def _read(self, partition: KbsSegmentPartition) -> Iterator[pa.RecordBatch]:
        yield from self._read_segments(partition)
        _freeze_worker_heap()

    def _read_segments(self, partition: KbsSegmentPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        backup = self.executor_backup(partition)
        for piece in partition.segments:
            ref = piece.ref
            sf = ScanFilter(start_offset=piece.start, end_offset=piece.end,
                            start_time=partition.start_time, end_time=partition.end_time)
            try:
                if o.on_corrupt == "fail":
                    yield from self._piece(backup, piece, sf)
                    continue
                # Skipping must drop all this task reads of the segment (the segment, or its run of
                # batches), so decode it fully before yielding any of it.
                batches = list(self._piece(backup, piece, sf))
            except KbsError as e:
                changed = self._changed(backup, partition, ref, e) if isinstance(e, _MAYBE_CHANGED) else None
                if changed is not None:
                    raise changed from e
                if o.on_corrupt == "fail":
                    raise
                self._skipped(ref, e)
                continue
            yield from batches

    @staticmethod
    def _skipped(ref: SegmentRef, e: KbsError) -> None:
        SKIPPED_SEGMENTS[ref.path] = f"{type(e).__name__}: {e}"
        msg = (f"kbs: skipped corrupt segment {ref.path} ({type(e).__name__}: {e}); "
               f"{len(SKIPPED_SEGMENTS)} segment(s) skipped in this process")
        log.warning(msg)
        warnings.warn(msg, KbsCorruptSegmentWarning, stacklevel=3)

    @staticmethod
    def _changed(backup: KbsBackup, partition: KbsSegmentPartition, ref: SegmentRef,
                 err: KbsError) -> BackupChangedError | None:
        """A :class:`BackupChangedError` when the manifest is no longer the one the read was
        planned from (read only now, to tell a rewritten backup from a damaged segment)."""
        if isinstance(err, BackupChangedError):
            return err
        try:
            raw = read_manifest_bytes(backup.fs, backup.path)
        except Exception:  # noqa: BLE001 - the original error says more
            return None
        now = None if raw is None else zlib.crc32(raw)
        pinned = partition.manifest_crc32
        if now == pinned:
            return None  # the same manifest: the segment itself is damaged
        then = "none" if pinned is None else f"CRC-32 {pinned:08x}"
        return BackupChangedError(
            f"the backup changed while reading: this segment no longer matches the manifest the read "
            f"was planned from (manifest.json {then} at planning, "
            f"{'deleted' if now is None else f'CRC-32 {now:08x}'} now); run the read again "
            f"({type(err).__name__}: {err})", ref.path)

    def _piece(self, backup: KbsBackup, piece: SegmentPiece, sf: ScanFilter) -> Iterator[pa.RecordBatch]:
        """The rows of ``piece`` within ``sf``, as Arrow batches of the output columns."""
        ref = piece.ref
        bounds = sf.segment_bounds(ref)
        verify = self.options.verify_checksums
        chunks = None
        if piece.run is not None:
            chunks = _batch_run(backup, ref, piece.run, bounds, verify)
            if chunks is None:
                # The batch index is gone or unusable now: read the segment, keep the run's offsets.
                lo, hi = piece.run.offsets
                sf = sf.and_(ScanFilter(start_offset=lo, end_offset=hi))
                bounds = sf.segment_bounds(ref)
        if chunks is None:
            chunks = backup.iter_columns(ref, verify_checksums=verify, bounds=bounds,
                                         max_chunk_bytes=CHUNK_BYTES)
        for cols in chunks:
            mask = sf.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
            batch = spark_batch(cols, ref, self.columns)
            if mask is not None:
                batch = batch.filter(bool_mask(mask))
            if batch.num_rows:
                yield batch


#: ``len(sys.modules)`` when :func:`_freeze_worker_heap` last froze (0: never).
_frozen_at_modules = 0


def _freeze_worker_heap() -> None:
    """In a Python worker forked by PySpark's daemon (a task's or the planner's), move what
    the process holds after its first use (modules, numba's compiled kernels and type system:
    some 140k objects) out of the cyclic garbage collector's reach; again only if modules were
    imported since (the planner loads the kernels only for its first timestamp lookup).

    The daemon runs a full ``gc.collect()`` after every task of a reused worker, and with
    fsspec-kbs's kernels loaded that walk costs ~30 ms on an idle core (several times that on
    a loaded one) before the worker takes its next task: in ``py-spy`` it was the largest item
    of the workers' samples during a full scan. Frozen objects are still freed by reference
    counting; only cycles among them (none expected in modules and kernels) would stay.
    Elsewhere (the driver, tests, a simple worker without the daemon) nothing changes.
    """
    global _frozen_at_modules
    if len(sys.modules) == _frozen_at_modules or not sys.argv \
            or not sys.argv[0].replace("\\", "/").endswith("pyspark/daemon.py"):
        return
    _frozen_at_modules = len(sys.modules)
    gc.collect()
    gc.freeze()


#: Stored bytes decoded per chunk on executors: batches of some 10k rows for PySpark's Arrow
#: path (a 32 MiB chunk made batches of ~100 MB that are slow to hand to the JVM).
CHUNK_BYTES = 4 * 1024 * 1024


def _batch_run(backup: KbsBackup, ref: SegmentRef, run: BatchRun, bounds: tuple,
               verify: bool) -> Iterator[RecordColumns | ViewColumns] | None:
    """The columns of the batch ``run`` of ``ref`` planned for the task, read through the segment's batch
    index (ranged reads; every batch CRC-32 checked, the index checked against
    ``index_crc32``), or None when the index is not usable now (read the segment instead)."""
    if not verify:
        return None
    index = backup.batch_index(ref)
    if index is None:
        return None
    a, b = run.batches
    if b > len(index) or (int(index.position[a]), int(index.end[b - 1])) != run.byte_range:
        raise SegmentMismatchError(
            f"the batch index no longer puts batches {a}..{b - 1} at bytes {list(run.byte_range)} as when the "
            "read was planned", ref.path, run.byte_range[0])
    runs = [(max(x, a), min(y, b)) for x, y in index.select(*bounds) if min(y, b) > max(x, a)]
    if not runs:
        return iter(())
    return read_runs(backup, ref, index, runs, verify)


def read_runs(backup: KbsBackup, ref: SegmentRef, index: BatchIndex, runs: list[tuple[int, int]],
              verify: bool = True) -> Iterator[RecordColumns | ViewColumns]:
    """The records of the batch ``runs`` of ``ref`` (ranged reads through its ``index``; the
    header checked against the ref's codec and CRC-64, every batch's CRC-32 and bounds); a
    format error is re-diagnosed on the whole segment, as :meth:`KbsBackup.iter_columns` does."""
    codec = CODEC_BY_NAME[ref.codec] if ref.codec is not None else None
    source = IndexedSource(backup.fs, ref.path, index, runs, codec=codec, crc64=ref.crc64)
    try:
        yield from iter_opened(OpenedSegment(ref, source, partial=True), CHUNK_BYTES)
    except SegmentFormatError as err:
        backup.rediagnose(ref, verify, err)


def spark_batch(cols: RecordColumns | ViewColumns, ref: SegmentRef, columns: list[str]) -> pa.RecordBatch:
    """Records as an Arrow batch already in :func:`spark_arrow_schema` (no cast of the batch):
    timestamps converted to µs from numpy, the headers' list type relabelled without a copy."""
    batch = columns_to_batch(cols, ref.topic, ref.partition, columns, ref.path)
    target = spark_arrow_schema(tuple(columns))
    arrays = list(batch.columns)
    for i, name in enumerate(batch.schema.names):
        if name == "timestamp":
            arrays[i] = numpy_array(np.asarray(cols.timestamps, dtype=np.int64) * 1000, target.field(i).type)
        elif name == "headers":
            arrays[i] = arrays[i].view(target.field(i).type)
    return pa.RecordBatch.from_arrays(arrays, schema=target)


@functools.lru_cache(maxsize=8)
def spark_arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema Spark expects back from ``read``: timestamps in µs, list items named
    ``element``. Same columns and values as :data:`KAFKA_SCHEMA`."""
    fields = []
    for f in project(list(columns)):
        if f.name == "timestamp":
            f = f.with_type(pa.timestamp("us", tz="UTC"))
        elif f.name == "headers":
            f = f.with_type(pa.list_(pa.field("element", HEADER_TYPE)))
        fields.append(f)
    return pa.schema(fields)


class KbsPushdownReader(KbsReader):
    """:class:`KbsReader` that also takes Spark's filters on topic, partition, offset, timestamp.

    Only used when ``spark.sql.python.filterPushdown.enabled`` is true: Spark refuses a
    reader that implements ``pushFilters`` while the setting is off.
    """

    def pushFilters(self, filters: list) -> list:  # noqa: N802 - Spark's hook name
        sf, rest = translate(filters)
        self.pushed = self.pushed.and_(sf)
        return rest
