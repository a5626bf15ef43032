"""Streaming sink of the ``kbs`` data source: each micro-batch is one exactly-once commit.

Spark's micro-batch protocol (``DataSourceStreamWriter``): tasks write, the driver commits
batch ``n``, then Spark records ``n`` in the checkpoint's commit log. A driver that dies
between the two replays batch ``n`` on restart, with the same data. So the sink records,
in the manifest it publishes, the last batch of each query (``streams``: query id -> batch
id, like Delta Lake's ``txn`` action) and skips a batch the backup already holds.

Per micro-batch:

1. Spark calls ``streamWriter()`` on the driver (a fresh job id; in append mode the last
   offset of every partition, for records without offsets).
2. Tasks stage segments under ``_staging/<job>/<task>/`` exactly as the batch writer's tasks
   do, and return the job id, the query id and the batch id (Spark's task-local properties).
3. ``commit(messages, batch)`` (driver) adopts the staged segments with the commit protocol
   (:mod:`fsspec_kbs.store.txn`): the manifest it builds, on top of whatever commit is current
   (rebased after concurrent appends), records ``streams[query] = batch``. If that base already
   records this batch or a later one, nothing is published and the staged files are removed.
4. ``abort`` removes the staged files; nothing of a failed batch is ever in the manifest.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from fsspec_kbs.errors import (
    CommitInProgressError,
    KbsError,
    PartialWriteError,
)
from fsspec_kbs.spark.options import KbsOptions, parse_options
from fsspec_kbs.spark.writer import KbsCommitMessage, KbsWriter, _plan
from fsspec_kbs.store.commit import stream_batch, with_stream_batch
from fsspec_kbs.store.layout import resolve
from fsspec_kbs.store.manifest import Manifest, utc_now_iso
from fsspec_kbs.store.staging import SegmentAdopter
from fsspec_kbs.store.txn import BackupState, FaultHook, Move, load_state

log = logging.getLogger("fsspec_kbs.spark")

#: Task-local properties Spark's micro-batch execution sets (``StreamExecution``): the query id
#: is the one stored in the checkpoint (the same after a restart), the batch id the epoch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: Options Spark passes to a streaming sink besides the user's (``checkpointLocation``).
SPARK_STREAM_WRITE_OPTIONS = ("checkpointlocation",)


def parse_stream_write_options(options: Mapping[str, str]) -> KbsOptions:
    """The write options of a streaming sink: those of a batch write, plus what Spark adds."""
    return parse_options({k: v for k, v in options.items()
                          if str(k).lower() not in SPARK_STREAM_WRITE_OPTIONS}, "write")


@dataclass
class KbsStreamCommitMessage(KbsCommitMessage):
    """:class:`KbsCommitMessage` plus the micro-batch it belongs to (from the task's context)."""

    job_id: str = ""
    query_id: str | None = None
    batch_id: int | None = None


class BatchAlreadyCommitted(KbsError):  # noqa: N818 - an outcome, raised to leave the commit
    """The backup already records this micro-batch of this query: a replay, not published again."""


class _StreamAdopter(SegmentAdopter):
    """A :class:`SegmentAdopter` whose manifest records the micro-batch, checked on every base
    the commit is built on (the first one and any rebase after a concurrent writer)."""

    def __init__(self, *args: Any, query_id: str, batch_id: int, **kwargs: Any) -> None:
        self.query_id, self.batch_id = query_id, batch_id
        super().__init__(*args, **kwargs)

    def committed_batch(self, state: BackupState | None = None) -> int:
        """The last batch of this query recorded by ``state`` (default: the state read first)."""
        assert self._txn is not None
        state = self._txn.base if state is None else state
        return -1 if state.manifest is None else stream_batch(state.manifest, self.query_id)

    def build_manifest(self, extra: dict[str, Any] | None = None,
                       state: BackupState | None = None) -> tuple[Manifest, list[Move]]:
        done = self.committed_batch(state)
        if done >= self.batch_id:
            raise BatchAlreadyCommitted(f"{self.url}: batch {self.batch_id} of streaming query "
                                        f"{self.query_id} is already committed (the backup records batch {done})")
        manifest, moves = super().build_manifest(extra, state)
        manifest.extra = with_stream_batch(manifest.extra, self.query_id, self.batch_id,
                                           self.txn_id or "", utc_now_iso())
        return manifest, moves


class KbsStreamWriter(DataSourceStreamArrowWriter):
    """Appends each micro-batch of a streaming query to a KBS backup, exactly once.

    Rows are those of the batch writer (Kafka-sink columns; with ``offset`` the offsets are
    kept, without they are numbered after the partition's last offset). Only append output
    mode: a backup, like a Kafka topic, is never truncated by a stream.

    Parameters
    ----------
    options : KbsOptions
        Parsed write options (:func:`parse_stream_write_options`).
    """

    def __init__(self, options: KbsOptions) -> None:
        self.options = options
        # Tasks write exactly as a batch append does; its job id names this batch's staging.
        try:
            self._writer = KbsWriter(options, overwrite=False)
        except CommitInProgressError:
            # A driver killed mid-commit (this query's, after a restart, or another writer's):
            # finish that commit, as every writer does before its own, then start this batch.
            fs, path = resolve(options.path, options.storage_options)
            load_state(fs, path.rstrip("/"))
            self._writer = KbsWriter(options, overwrite=False)
        #: Crash injection for tests: called with the name of each commit step on the driver.
        self.fault: FaultHook | None = None

    # -- executor ----------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> KbsStreamCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        msg = self._writer.write(iterator)
        return KbsStreamCommitMessage(msg.task_index, msg.task_id, msg.segments, msg.assigned, msg.records,
                                      job_id=self._writer.job_id, query_id=query,
                                      batch_id=None if batch is None else int(batch))

    # -- driver ------------------------------------------------------------------------------------
    def _job(self, messages: list[KbsStreamCommitMessage]) -> KbsWriter:
        """A writer bound to the job the tasks of this batch staged under."""
        jobs = {m.job_id for m in messages}
        if len(jobs) != 1:
            raise PartialWriteError(f"commit got messages of {len(jobs)} jobs ({sorted(jobs)}); expected one per micro-batch")
        writer = copy.copy(self._writer)
        writer.job_id = jobs.pop()
        writer.fault = self.fault
        return writer

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        o = self.options
        msgs = [m for m in messages if isinstance(m, KbsStreamCommitMessage)]
        if len(msgs) != len(messages):
            raise PartialWriteError(f"commit of batch {batchId} got a failed task's message; refusing to publish "
                           "a partial micro-batch")
        if not msgs:
            return
        writer = self._job(msgs)
        queries = {m.query_id for m in msgs}
        if len(queries) != 1 or None in queries:
            raise PartialWriteError(f"commit of batch {batchId} to {o.path}: tasks report query ids {sorted(map(str, queries))}; "
                           "the kbs sink needs Spark's streaming query id to commit exactly once")
        query = str(queries.pop())
        if any(m.batch_id is not None and m.batch_id != batchId for m in msgs):
            raise PartialWriteError(f"commit of batch {batchId}: tasks wrote batch(es) {sorted({m.batch_id for m in msgs})}")
        if not any(m.segments for m in msgs):
            writer._remove_staging()
            return  # an empty micro-batch: nothing to publish, nothing to remember
        msgs.sort(key=lambda m: m.task_index)
        plan = _plan(msgs)  # type: ignore[arg-type]
        adopter = _StreamAdopter(o.path, o.storage_options, mode="append", txn_id=writer.job_id,
                                 fault=writer.fault, query_id=query, batch_id=batchId, **writer._writer_kwargs())
        claimed = False
        try:
            done = adopter.committed_batch()
            if done >= batchId:
                raise BatchAlreadyCommitted(f"batch {batchId} of query {query} already committed (backup records {done})")
            writer.adopt_plan(adopter, plan)
            try:
                adopter.commit(extra={"writer": {"name": "fsspec-kbs spark stream", "job": writer.job_id}})
            finally:
                claimed = adopter.claimed
            log.info("kbs: committed batch %d of query %s to %s", batchId, query, o.path)
        except BatchAlreadyCommitted:
            log.warning("kbs: batch %d of streaming query %s is already in %s (a replay after a restart); "
                        "not written again", batchId, query, o.path)
            adopter.abort()
            writer._remove_staging()
            return
        except BaseException:
            if claimed:
                log.error("kbs: commit to %s claimed but not finished; run `kbs repair %s`", o.path, o.path)
                raise
            adopter.abort()
            writer._remove_staging()
            raise
        writer._remove_staging()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        jobs = {m.job_id for m in messages if isinstance(m, KbsStreamCommitMessage)}
        log.warning("kbs: micro-batch %d to %s aborted; removing its staged segments", batchId, self.options.path)
        for job in jobs:
            writer = copy.copy(self._writer)
            writer.job_id = job
            writer.abort(messages)
