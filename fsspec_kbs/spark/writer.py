"""Batch writer of the ``kbs`` data source: tasks stage segments, the driver publishes them.

Protocol (see docs/spark.md, "How writes commit"):

1. ``writer()`` (driver) picks a job id and, when appending, reads the last offset of every
   partition already in the backup.
2. Each task encodes its rows into segments under ``<backup>/_staging/<job>/<task-uuid>/``
   and returns a :class:`KbsCommitMessage` listing them (plain data, picklable).
3. ``commit()`` (driver) plans the staged segments' final names ``topics/<t>/<p>/segment-NNNNNNNN.kbs``
   in offset order, rewriting the ones whose provisional offsets must be shifted, and commits
   them with the protocol of :mod:`fsspec_kbs.store.txn` (transaction id = job id): one
   create-only commit record, then one batched move, then ``manifest.json``. A driver dying
   mid-commit leaves the record; the next writer or ``kbs repair`` finishes it.
4. ``abort()`` deletes the staging directory; a failed job never writes a manifest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from fsspec_kbs.arrow.convert import batch_to_columns, split_table, timestamps_of
from fsspec_kbs.errors import (
    IncompatibleWriteError,
    IncompleteBackupError,
    OffsetOrderError,
    PartialWriteError,
    UnsupportedLayoutError,
)
from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.store import BackupWriter, KbsBackup, open_backup
from fsspec_kbs.store.commit import put_atomic
from fsspec_kbs.store.names import MANIFEST, TOPICS_DIR, backup_id_of
from fsspec_kbs.store.staging import SegmentAdopter
from fsspec_kbs.store.txn import FaultHook
from fsspec_kbs.store.writer import WrittenSegment

log = logging.getLogger("fsspec_kbs.spark")

STAGING_DIR = "_staging"
# An abort marker outlives the clean-up of its job's files by this long: a task Spark cancelled
# may still be staging files and must still find the marker telling it to remove them.
MARKER_TTL_S = 24 * 3600


@dataclass
class KbsCommitMessage(WriterCommitMessage):
    """What one task staged: its segments (each with the batch index beside it), in the order
    it wrote them.

    ``assigned`` lists ``"topic/partition"`` keys whose offsets the task numbered itself
    (the input had no offsets); the driver may shift those to follow earlier tasks.
    """

    task_index: int
    task_id: str
    segments: list[WrittenSegment] = field(default_factory=list)
    assigned: list[str] = field(default_factory=list)
    records: int = 0


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class KbsWriter(DataSourceArrowWriter):
    """Writes a DataFrame with Kafka-sink columns as a KBS backup.

    Parameters
    ----------
    options : KbsOptions
        Parsed options (path, storage options, topic, compression, segment limits).
    overwrite : bool
        Spark's save mode: True for ``overwrite``, False for ``append``.
    """

    def __init__(self, options: KbsOptions, overwrite: bool) -> None:
        # Before anything is written (the abort marker goes to <path>/_staging): a path such
        # as ROOT/.. must not make this job write into ROOT's parent.
        backup_id_of(options.path)
        self.options = options
        self.overwrite = overwrite
        self.job_id = uuid.uuid4().hex
        #: Crash injection for tests: called with the name of each commit step on the driver.
        self.fault: FaultHook | None = None
        self.base_last: dict[str, int] = {}
        self.compression = options.compression
        if not overwrite:
            self._read_base()
        if self.compression is None:
            self.compression = "zstd"

    @property
    def staging_url(self) -> str:
        return f"{self.options.path.rstrip('/')}/{STAGING_DIR}/{self.job_id}"

    def _read_base(self) -> None:
        """Append: remember each partition's last offset, so tasks number new records after it."""
        o = self.options
        fs, path = url_to_fs(o.path, **o.storage_options)
        if not fs.exists(f"{path.rstrip('/')}/{MANIFEST}"):
            if fs.exists(f"{path.rstrip('/')}/{TOPICS_DIR}"):
                raise IncompleteBackupError(f"{o.path} holds segments but no manifest (an incomplete backup); "
                               "append needs a complete backup; use mode('overwrite') to replace it")
            return
        backup = open_backup(o.path, o.storage_options)
        if not isinstance(backup, KbsBackup):
            raise UnsupportedLayoutError(f"cannot append to {o.path}: it is a {backup.layout!r} backup, not a KBS one")
        codec = backup.manifest.compression.get("algorithm") if backup.manifest else None
        if self.compression is None:
            self.compression = codec
        elif codec and backup.segments() and codec != self.compression:
            raise IncompatibleWriteError(f"cannot append {self.compression} segments to {o.path}, a {codec} backup "
                           "(one codec per backup): drop option('compression') or match it")
        for ref in backup.segments():
            if ref.last_offset is not None:
                k = _key(ref.topic, ref.partition)
                self.base_last[k] = max(self.base_last.get(k, -1), ref.last_offset)

    def _writer_kwargs(self) -> dict:
        o = self.options
        return dict(compression=self.compression, level=o.level, segment_max_bytes=o.segment_max_bytes,
                    segment_max_records=o.segment_max_records, batch_max_bytes=o.batch_max_bytes)

    # -- executor ----------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> KbsCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task_index = ctx.partitionId() if ctx is not None else 0
        task_id = uuid.uuid4().hex
        o = self.options
        staged = BackupWriter(f"{self.staging_url}/{task_id}", o.storage_options, stage_only=True,
                              **self._writer_kwargs())
        next_offset: dict[str, int] = {}
        assigned: set[str] = set()
        given: set[str] = set()
        records = 0
        try:
            for batch in iterator:
                for topic, partition, part in split_table(batch, topic=o.topic):
                    k = _key(topic, partition)
                    offsets, part = self._offsets(part, k, next_offset, assigned, given)
                    cols = batch_to_columns(part, offsets, timestamps_of(part))
                    try:
                        staged.write_columns(topic, partition, cols)
                    except OffsetOrderError as e:
                        raise OffsetOrderError(
                            f"{e}. Within a task the offsets of a partition must increase from batch "
                            "to batch: sortWithinPartitions('topic', 'partition', 'offset') first") from e
                    records += len(cols)
            staged.flush()
        except BaseException:
            self._discard(staged)
            raise
        if self._aborted():
            # The job was aborted while this task ran (another task failed): the driver's abort
            # may have run before these files existed, so this task removes its own.
            self._discard(staged)
            raise PartialWriteError(f"write to {o.path} was aborted while task {task_index} ran")
        segments = list(staged.written_segments)
        return KbsCommitMessage(task_index, task_id, segments, sorted(assigned), records)

    def _offsets(self, part: pa.RecordBatch, k: str, next_offset: dict[str, int], assigned: set[str],
                 given: set[str]) -> tuple[np.ndarray, pa.RecordBatch]:
        n = part.num_rows
        col = part.column("offset") if "offset" in part.schema.names else None
        if col is not None and col.null_count == 0:
            if k in assigned:
                raise ValueError(f"partition {k}: some rows have offsets and some not; give all or none")
            given.add(k)
            if not pa.types.is_integer(col.type):
                raise TypeError(f"column 'offset' must be an integer, not {col.type}")
            offsets = col.cast(pa.int64()).to_numpy()
            if n > 1 and not bool(np.all(offsets[1:] >= offsets[:-1])):
                # Rows within one Arrow batch are sorted here; across batches the order must hold.
                order = pc.sort_indices(col)
                part = part.take(order)
                offsets = offsets[order.to_numpy()]
            return offsets, part
        if col is not None and col.null_count != n:
            raise ValueError(f"partition {k}: column 'offset' has nulls; give every record an offset or none")
        if k in given:
            raise ValueError(f"partition {k}: some rows have offsets and some not; give all or none")
        assigned.add(k)
        start = next_offset.get(k, self.base_last.get(k, -1) + 1)
        next_offset[k] = start + n
        return np.arange(start, start + n, dtype=np.int64), part

    # -- driver ------------------------------------------------------------------------------------
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        o = self.options
        msgs = [m for m in messages if isinstance(m, KbsCommitMessage)]
        if len(msgs) != len(messages):
            raise PartialWriteError("commit got a failed task's message; refusing to publish a partial backup")
        msgs.sort(key=lambda m: m.task_index)
        # Check the whole plan before touching the backup: an overwrite deletes the old one.
        plan = _plan(msgs)
        # Append to a missing backup creates it; the commit record's base decides the rest.
        mode = "overwrite" if self.overwrite else "append"
        adopter = SegmentAdopter(o.path, o.storage_options, mode=mode, txn_id=self.job_id,
                                 fault=self.fault, **self._writer_kwargs())
        claimed = False
        try:
            self.adopt_plan(adopter, plan)
            try:
                adopter.commit(extra={"writer": {"name": "fsspec-kbs spark", "job": self.job_id}})
            finally:
                claimed = adopter.claimed
            log.info("kbs: committed %d task(s) to %s", len(msgs), o.path)
        except BaseException:
            if claimed:
                # The commit record exists: its staged files must stay for the roll forward.
                log.error("kbs: commit to %s claimed but not finished; run `kbs repair %s`", o.path, o.path)
                raise
            adopter.abort()
            self._remove_staging()
            raise
        self._remove_staging()

    def adopt_plan(self, adopter: SegmentAdopter, plan: list) -> None:
        """Hand every staged segment of ``plan`` (:func:`_plan`) to ``adopter``, in order."""
        for (topic, partition), assigned, items in plan:
            if assigned:
                self._commit_assigned(adopter, topic, partition, items)
                continue
            for _, seg in items:
                # Raises OffsetOrderError when an append would make offsets go backwards.
                _adopt(adopter, seg)

    def _commit_assigned(self, adopter: SegmentAdopter, topic: str, partition: int,
                         items: list[tuple[KbsCommitMessage, WrittenSegment]]) -> None:
        """Offsets numbered by the tasks: each task's records follow the previous task's, in task order."""
        next_offset = adopter.last_offset(topic, partition) + 1
        shift = None
        task = None
        for m, seg in items:
            if m is not task:
                task, shift = m, next_offset - seg.stats.first_offset
            if shift == 0:
                _adopt(adopter, seg)
            else:
                adopter.rewrite_segment(topic, partition, seg.path, shift)  # type: ignore[arg-type]
            next_offset = seg.stats.last_offset + shift + 1  # type: ignore[operator]

    @staticmethod
    def _discard(staged: BackupWriter) -> None:
        """Remove a task's staged segments and its (local filesystems: now empty) directory."""
        staged.abort()
        with contextlib.suppress(FileNotFoundError, OSError):
            staged.fs.rm(staged.path, recursive=True)

    @property
    def _marker_url(self) -> str:
        return f"{self.staging_url}.aborted"

    def _aborted(self) -> bool:
        fs, path = url_to_fs(self._marker_url, **self.options.storage_options)
        return bool(fs.exists(path))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("kbs: write to %s aborted; removing staged segments", self.options.path)
        # Marker first, then delete: a task still running either staged its files before the
        # delete (removed here) or sees the marker afterwards and removes them itself.
        fs, path = url_to_fs(self._marker_url, **self.options.storage_options)
        put_atomic(fs, path, json.dumps({"job": self.job_id, "aborted_at": time.time()}).encode() + b"\n")
        self._remove_staging(keep_marker=True)

    def _remove_staging(self, keep_marker: bool = False) -> None:
        """Delete this job's staging directory; after a commit also what aborted jobs left."""
        o = self.options
        fs, path = url_to_fs(self.staging_url, **o.storage_options)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path, recursive=True)
        if not keep_marker:
            remove_aborted_leftovers(fs, path.rsplit("/", 1)[0])


def remove_aborted_leftovers(fs: AbstractFileSystem, root: str, now: float | None = None) -> None:
    """Delete the files of aborted jobs under the staging ``root``, and markers past their TTL.

    A task Spark cancelled mid-write never ran its own clean-up, so its files are removed
    here. The marker stays for :data:`MARKER_TTL_S`: such a task may still be running and
    relies on it to know its job was aborted.
    """
    now = time.time() if now is None else now
    try:
        for entry in fs.ls(root, detail=False):
            if not entry.endswith(".aborted"):
                continue
            with contextlib.suppress(FileNotFoundError):
                fs.rm(entry[: -len(".aborted")], recursive=True)
            if now - _aborted_at(fs, entry) > MARKER_TTL_S:
                fs.rm_file(entry)
        if not fs.ls(root, detail=False):
            fs.rm(root, recursive=True)
    except (FileNotFoundError, OSError):
        pass  # nothing left, or an object store without directories


def _aborted_at(fs: AbstractFileSystem, marker: str) -> float:
    """When a marker was written; 0 (expired) for an unreadable one."""
    try:
        return float(json.loads(fs.cat_file(marker))["aborted_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _plan(msgs: list[KbsCommitMessage]) -> list[tuple[tuple[str, int], bool, list[tuple[KbsCommitMessage, WrittenSegment]]]]:
    """Staged segments per (topic, partition), in the order they will be published.

    Segments whose offsets the tasks numbered stay in task order (they are shifted at commit);
    segments with given offsets are sorted by offset and must not overlap.
    """
    by_key: dict[tuple[str, int], list[tuple[KbsCommitMessage, WrittenSegment]]] = {}
    for m in msgs:
        for seg in sorted(m.segments, key=lambda s: s.seq):
            by_key.setdefault((seg.topic, seg.partition), []).append((m, seg))
    plan = []
    for (topic, partition), items in sorted(by_key.items()):
        k = _key(topic, partition)
        kinds = {k in m.assigned for m, _ in items}
        if len(kinds) > 1:
            raise ValueError(f"partition {k}: some tasks gave offsets and some did not; give all or none")
        assigned = kinds == {True}
        if not assigned:
            items = sorted(items, key=lambda it: it[1].stats.first_offset)
            for (_, a), (_, b) in zip(items, items[1:], strict=False):
                if b.stats.first_offset <= a.stats.last_offset:
                    raise OffsetOrderError(
                        f"offsets of {k} overlap between tasks ({a.stats.first_offset}..{a.stats.last_offset} and "
                        f"{b.stats.first_offset}..{b.stats.last_offset}): repartition('topic', 'partition') and "
                        "sortWithinPartitions('offset') so one task writes each partition in order, "
                        "or drop the offset column to have offsets assigned")
        plan.append(((topic, partition), assigned, items))
    return plan


def _adopt(adopter: SegmentAdopter, seg: WrittenSegment) -> None:
    """Make a task's staged segment the partition's next one, with its batch index."""
    adopter.adopt_segment(seg.topic, seg.partition, seg.path, seg.stats, seg.index_crc32)
