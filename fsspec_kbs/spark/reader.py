"""Batch reader of the ``kbs`` data source: plan on the driver, decode on executors.

The driver plans the read once (:meth:`KbsReader.partitions`, :mod:`fsspec_kbs.spark.planning`),
reading ``manifest.json`` once; each input partition
(:class:`~fsspec_kbs.spark.partition.KbsSegmentPartition`) then carries everything its task
needs as small frozen values: a :class:`~fsspec_kbs.spark.partition.SegmentPiece` per segment
(its :class:`SegmentRef` with path, size, CRC-64, offsets, timestamps, index CRC and codec; the
offset bounds; the OSO size limit; for a batch range of a large or bounded indexed segment its
:class:`~fsspec_kbs.spark.partition.BatchRun`), the layout and the CRC-32 of the manifest it
was planned from. Executors build the backup object from the URL and those refs and never read
the manifest; a segment that no longer matches its ref fails as :class:`BackupChangedError`.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import warnings
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from fsspec_kbs.arrow import COLUMNS, columns_to_batch
from fsspec_kbs.arrow.convert import bool_mask, numpy_array
from fsspec_kbs.arrow.schema import HEADER_TYPE, project
from fsspec_kbs.errors import (
    BackupNotFoundError,
    KbsError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.filters import ScanFilter
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.spark.filters import translate
from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.spark.partition import BatchRun, KbsSegmentPartition, SegmentPiece
from fsspec_kbs.spark.planning import open_for_planning, plan
from fsspec_kbs.store import Backup, SegmentRef
from fsspec_kbs.store.batch_index import read_runs
from fsspec_kbs.store.layout import read_manifest_bytes, resolve
from fsspec_kbs.store.open import backup_class

log = logging.getLogger("fsspec_kbs.spark")

#: Stored bytes decoded per chunk on executors: batches of some 10k rows for PySpark's Arrow
#: path (a 32 MiB chunk made batches of ~100 MB that are slow to hand to the JVM).
CHUNK_BYTES = 4 * 1024 * 1024

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

    def executor_backup(self, partition: KbsSegmentPartition) -> Backup:
        """The backup object a task reads through, built from the URL and the partition's
        layout: no manifest is read (the refs carry what the checks need)."""
        o = self.options
        fs, path = resolve(o.path, o.storage_options)
        backup = backup_class(partition.layout)(fs, path, None, o.path, o.storage_options, o.allow_incomplete)
        backup.set_max_uncompressed({p.ref.path: p.limit for p in partition.segments if p.limit is not None})
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
    def _changed(backup: Backup, partition: KbsSegmentPartition, ref: SegmentRef,
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

    def _piece(self, backup: Backup, piece: SegmentPiece, sf: ScanFilter) -> Iterator[pa.RecordBatch]:
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


def _batch_run(backup: Backup, ref: SegmentRef, run: BatchRun, bounds: tuple,
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
    return read_runs(backup, ref, index, runs, verify, CHUNK_BYTES)


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
