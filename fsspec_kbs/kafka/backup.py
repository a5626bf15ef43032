"""``kbs backup``: copy a consistent cut of Kafka topics into a KBS backup.

The cut: each partition's end offset is read once at the start and the backup stops there, so
records produced while it runs are left for the next (incremental) backup. After every durable
segment ``checkpoints/checkpoint.json`` records the last offset written per partition; a resumed
backup deletes segments the checkpoint does not cover, adopts the rest and restarts each partition
at checkpoint offset + 1, so nothing is lost or duplicated whenever the process died.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from fsspec_kbs.errors import (
    CommitConflictError,
    KafkaClusterError,
    KafkaOptionError,
    KbsError,
)
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.batch_index import INDEX_SUFFIX
from fsspec_kbs.kafka.clients import (
    CONNECT_TIMEOUT,
    admin_client,
    client_config,
    cluster_metadata,
    fix_mmap_threshold,
    gc_paused,
)
from fsspec_kbs.kafka.consume import (
    BackupMemory,
    _Buffers,
    _codes,
    _CutReader,
    columns_of_fields,
    columns_of_messages,
)
from fsspec_kbs.kafka.groups import (
    GROUPS_FILE,
    groups_json,
    read_group_offsets,
    snapshot_group_offsets,
)
from fsspec_kbs.store import (
    BackupWriter,
    Checkpoint,
    PartitionProgress,
    WrittenSegment,
    open_backup,
)
from fsspec_kbs.store.commit import STAGING_DIR, put_atomic
from fsspec_kbs.store.manifest import utc_now_iso
from fsspec_kbs.store.names import (
    CHECKPOINT,
    MANIFEST,
    TOPICS_DIR,
    backup_id_of,
    parse_segment_name,
)

#: Key of our own planning data inside checkpoint.json (extra fields are allowed there).
PLAN_KEY = "kbs_backup_plan"
#: Key of the writer's transaction id in checkpoint.json: a resumed run continues its staging.
TXN_KEY = "kbs_backup_txn"
#: Chunks the consuming thread may hand over before the writing thread took them (each at most
#: about ``BackupMemory.chunk_bytes``): beyond it consuming waits.
HANDOFF_CHUNKS = 1

ProgressFn = Callable[[int, int], None]

#: Watermark query errors of a partition whose leader is not serving yet (a topic just created, a
#: leader moving): asked again until the timeout.
_RETRY_WATERMARK_NAMES = (
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_TOPIC_OR_PART",
    "_UNKNOWN_PARTITION",
    "OFFSET_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "REQUEST_TIMED_OUT",
    "_TRANSPORT",
)
#: Consumer settings a backup relies on; applied over the user's client config. ``error`` rather
#: than ``earliest``: an out-of-range position must stop the backup, not skip to what is left.
_FORCED_CONSUMER_CONF = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
    "check.crcs": True,  # a corrupt batch fails the backup instead of being copied as is
}


def consumer_tuning(memory: BackupMemory) -> dict[str, Any]:
    """The fetch settings of a backup's consumer (``-X`` overrides them): a small queue refilled
    by small fetches right away (librdkafka waits a second by default once the queue is full):
    bounded memory, and faster than one big queue."""
    queue = memory.fetch_queue_bytes
    return {
        "queued.max.messages.kbytes": max(1, queue // 1024),
        "fetch.queue.backoff.ms": 5,
        "fetch.max.bytes": max(1024 * 1024, min(8 * 1024 * 1024, queue // 2)),
        "max.partition.fetch.bytes": 2 * 1024 * 1024,
    }


class IncrementalGapWarning(UserWarning):
    """An incremental backup starts after records its predecessor did not hold: they were deleted
    from the broker (retention, DeleteRecords) in between, so neither backup has them."""


def _nested(ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[str, dict[str, list[int]]]:
    """``{(topic, partition): (a, b)}`` as JSON: ``{topic: {"partition": [a, b]}}``."""
    out: dict[str, dict[str, list[int]]] = {}
    for (t, p), (a, b) in sorted(ranges.items()):
        out.setdefault(t, {})[str(p)] = [a, b]
    return out


def _watermarks(consumer: Any, tp: Any, timeout: float) -> tuple[int, int]:
    """(low, high) of a partition from its leader; transient errors are retried until ``timeout``."""
    from confluent_kafka import KafkaException

    retry = _codes(_RETRY_WATERMARK_NAMES)
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = max(0.1, deadline - time.monotonic())
            return consumer.get_watermark_offsets(tp, timeout=left, cached=False)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            code = err.code() if hasattr(err, "code") else None
            if code not in retry or time.monotonic() + 0.2 > deadline:
                msg = f"cannot read the end offsets of {tp.topic}/{tp.partition}: {err}"
                raise KafkaClusterError(msg) from e
            time.sleep(0.2)


@dataclass
class BackupResult:
    url: str
    backup_id: str
    records: int
    bytes: int  # key + value + header bytes consumed
    seconds: float
    partitions: dict[tuple[str, int], tuple[int, int]]  # (start, end) offsets of the cut
    segments: int
    groups: int
    resumed: bool = False
    manifest: Any = None
    #: Incremental only: offsets ``[first, end)`` of a partition that were deleted from the broker
    #: (retention, DeleteRecords) after the earlier backup ended and before this one started: in
    #: neither backup. Also in the manifest (``kafka.gaps``).
    gaps: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)


def default_backup_id() -> str:
    return datetime.now(timezone.utc).strftime("backup-%Y%m%dT%H%M%SZ")


def select_topics(all_topics: list[str], patterns: list[str], include_internal: bool = False) -> list[str]:
    """Topics whose whole name matches one of the regular expressions."""
    regs = []
    for p in patterns:
        try:
            regs.append(re.compile(p))
        except re.error as e:
            raise KafkaOptionError(f"bad topic pattern {p!r}: {e}") from e
    return sorted(
        t for t in all_topics
        if (include_internal or not t.startswith("__")) and any(r.fullmatch(t) for r in regs)
    )


class _Checkpointer:
    """Keeps checkpoint.json in step with the writer's durable segments."""

    def __init__(self, fs: Any, path: str, backup_id: str, plan: dict, txn_id: str,
                 topics: dict[str, dict[int, PartitionProgress]] | None = None) -> None:
        self.fs = fs
        self.path = f"{path}/{CHECKPOINT}"
        self.ck = Checkpoint(backup_id, utc_now_iso(), topics or {}, {PLAN_KEY: plan, TXN_KEY: txn_id})
        self.segments = 0

    def write(self) -> None:
        self.ck.timestamp = utc_now_iso()
        put_atomic(self.fs, self.path, self.ck.to_json())

    def on_segment(self, seg: WrittenSegment) -> None:
        s = seg.stats
        self.ck.topics.setdefault(seg.topic, {})[seg.partition] = PartitionProgress(
            offset=s.last_offset, timestamp=s.max_timestamp, segment=seg.path.rsplit("/", 1)[-1],
            segment_offset=s.size_bytes)
        self.segments += 1
        self.write()


def _drop_uncovered(fs: Any, path: str, ck: Checkpoint) -> int:
    """Delete segment (and stray temp) files under ``path/topics`` the checkpoint does not vouch
    for; returns the count. ``path`` is the run's staging directory (or, for a run of an older
    version, the backup itself)."""
    root = f"{path}/{TOPICS_DIR}"
    try:
        files = fs.find(root)
    except FileNotFoundError:
        return 0
    base = fs._strip_protocol(root).rstrip("/")
    dropped = 0
    for f in files:
        rel = f.rstrip("/")[len(base) + 1:].split("/")
        keep = False
        if len(rel) == 3:
            topic, part, name = rel
            prog = ck.topics.get(topic, {}).get(int(part)) if part.isdigit() else None
            if prog is not None:
                # A covered segment keeps its batch index too (resume checks and rewrites it).
                segment = name[: -len(INDEX_SUFFIX)] + ".kbs" if name.endswith(INDEX_SUFFIX) else name
                try:
                    keep = parse_segment_name(segment) <= parse_segment_name(prog.segment)
                except KbsError:
                    keep = False
        if not keep:
            fs.rm_file(f)
            dropped += 1
    # Object-store filesystems cache listings; the writer lists the segments right after this.
    fs.invalidate_cache(root)
    return dropped


@dataclass
class _Plan:
    """What this run backs up: the cut (start, end) per partition and the plan stored in the
    checkpoint (so a resumed run continues to the same cut)."""

    cut: dict[tuple[str, int], tuple[int, int]]
    doc: dict[str, Any]

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> _Plan:
        cut = {(t, int(p)): (int(se[0]), int(se[1])) for t, ps in doc["partitions"].items() for p, se in ps.items()}
        return cls(cut, doc)

    @property
    def gaps(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {(t, int(p)): (g[0], g[1]) for t, ps in self.doc.get("gaps", {}).items() for p, g in ps.items()}


def _warm_up(compression: str, level: int | None) -> None:
    """Load the encoding kernels (numba: ~1 s of CPU in a fresh process) and the codec while the
    main thread plans the cut, mostly waiting for the brokers, instead of at the first chunk.
    The columns are built as a backup builds them (read-only data arrays from ``bytes``), so
    the kernels are loaded for the very signatures the backup calls them with."""
    from fsspec_kbs.format import compress_batch, encode_batches
    from fsspec_kbs.format.codecs import codec_from_name

    try:
        for hdrs in ([None], [[("h", b"v")]]):
            cols = columns_of_fields(np.zeros(1, dtype=np.int64), [b"k"], [b"v"], np.zeros(1, dtype=np.int64), hdrs)
            for batch in encode_batches(cols, 1024):
                compress_batch(batch, codec_from_name(compression), level)
    except Exception:  # only an optimisation: the real work reports real errors
        pass


class _WritingThread:
    """Everything a backup does with consumed records after cutting them into partitions, on a
    thread of its own: building the columns, queueing them for compression, writing segments
    (assembly, checksums, ``fsync``) and checkpoints. The consuming thread only consumes and
    hands chunks over; it waits when :data:`HANDOFF_CHUNKS` chunks are waiting already.

    The writer is used by this thread alone until :meth:`close` returned; an error here is
    raised on the consuming thread at its next hand-over (or at :meth:`close`)."""

    _FLUSH = object()
    _END = object()

    def __init__(self, writer: BackupWriter, on_chunk: Callable[[RecordColumns], None],
                 warm_up: threading.Thread | None = None) -> None:
        self.writer = writer
        self.on_chunk = on_chunk
        #: Loads the kernels: the first chunk waits for it rather than loading them a second
        #: time beside it (~0.12 s of CPU when the warm-up had not finished).
        self.warm_up = warm_up
        self.items: queue.Queue = queue.Queue(maxsize=HANDOFF_CHUNKS)
        #: consume() results the consuming thread is done with: dropped here, so that the
        #: messages (whose other references this thread holds) are freed on this thread.
        self.garbage: deque[list[Any]] = deque()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="kbs-backup-write", daemon=True)
        self.thread.start()

    def chunk(self, key: tuple[str, int], msgs: list[Any], offsets: np.ndarray) -> None:
        self._put((key, msgs, offsets))

    def release(self, msgs: list[Any]) -> None:
        self.garbage.append(msgs)

    def flush(self) -> None:
        """Write every pending segment (and so a checkpoint), after the chunks handed over."""
        self._put(self._FLUSH)

    def _put(self, item: Any) -> None:
        while True:
            self._raise()
            try:
                self.items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, ok: bool) -> None:
        """Wait for the chunks handed over (``ok``) or drop them (an error on the consuming
        thread); then the writer is the caller's again."""
        if not ok and self.error is None:
            self.error = KbsError("backup stopped")  # the writing thread drops what waits
        while self.thread.is_alive():
            try:
                self.items.put(self._END, timeout=0.1)
                break
            except queue.Full:
                continue
        self.thread.join()
        if ok:
            self._raise()

    def _run(self) -> None:
        try:
            if self.warm_up is not None:
                self.warm_up.join()
            while True:
                while self.garbage:
                    self.garbage.popleft()
                try:
                    item = self.items.get(timeout=0.2)  # (garbage is dropped while idle, too)
                except queue.Empty:
                    continue
                if item is self._END:
                    return
                if self.error is not None:
                    continue  # stopped: drop the rest
                if item is self._FLUSH:
                    self.writer.flush()
                    continue
                (topic, partition), msgs, offsets = item
                del item
                cols = columns_of_messages(msgs, offsets)
                del msgs  # the Message objects are freed here, not on the consuming thread
                self.writer.write_columns(topic, partition, cols)
                self.on_chunk(cols)
        except BaseException as e:
            self.error = e
            while self.items.get() is not self._END:  # until the consuming thread saw it
                pass


class BackupRun:
    """One ``kbs backup`` run, in phases: open the target (refuse, or resume from the
    checkpoint), plan the cut, snapshot consumer groups, open the writer, read the cut,
    commit. See :func:`run_backup` for the parameters."""

    def __init__(self, client_config: dict[str, str], topics: list[str], url: str, *,
                 storage_options: dict | None = None, compression: str = "zstd", level: int | None = None,
                 segment_max_bytes: int = 64 * 1024 * 1024, segment_max_records: int | None = None,
                 resume: bool = False, incremental_from: str | None = None,
                 incremental_storage_options: dict | None = None, include_internal: bool = False,
                 consumer_groups: bool = True, checkpoint_interval: float = 60.0, timeout: float = 30.0,
                 connect_timeout: float = CONNECT_TIMEOUT, memory: BackupMemory | None = None,
                 consume_batch: int = 2_000, progress: ProgressFn | None = None,
                 on_plan: Callable[[int], None] | None = None, on_chunk: Callable[[], None] | None = None) -> None:
        self.conf = client_config
        self.patterns = topics
        self.url = url
        self.storage_options = storage_options
        self.compression, self.level = compression, level
        self.segment_max_bytes, self.segment_max_records = segment_max_bytes, segment_max_records
        self.resume = resume
        self.incremental_from = incremental_from
        self.incremental_storage_options = incremental_storage_options
        self.include_internal = include_internal
        self.consumer_groups = consumer_groups
        self.checkpoint_interval = checkpoint_interval
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.memory = memory or BackupMemory()
        self.consume_batch = consume_batch
        self.progress, self.on_plan, self.on_chunk = progress, on_plan, on_chunk
        self.totals = [0, 0]
        self.warm_up: threading.Thread | None = None

    def run(self) -> BackupResult:
        t0 = time.monotonic()
        fix_mmap_threshold(self.memory.chunk_bytes + self.memory.chunk_bytes // 8)
        self.warm_up = threading.Thread(target=_warm_up, args=(self.compression, self.level),
                                        name="kbs-warm-up", daemon=True)
        self.warm_up.start()
        self._open_target()
        admin = admin_client(self.conf)
        md = cluster_metadata(admin, self.conf, self.connect_timeout)
        consumer = self._consumer()
        try:
            plan = self._plan(md, consumer)
            groups = self._snapshot_groups(admin, plan)
            writer, ckp = self._open_writer(plan, md)
            self._read_cut(consumer, plan, writer)
            manifest = self._commit(writer, ckp, plan)
        finally:
            consumer.close()
        return BackupResult(self.url, self.backup_id, self.totals[0], self.totals[1], time.monotonic() - t0,
                            plan.cut, ckp.segments, groups, self.ck_old is not None, manifest, plan.gaps)

    # -- phases -------------------------------------------------------------------------------
    def _open_target(self) -> None:
        """Refuse a complete backup, or an incomplete one without ``resume``; read the checkpoint."""
        fs, path = url_to_fs(self.url, **(self.storage_options or {}))
        self.fs, self.path = fs, path.rstrip("/")
        self.backup_id = backup_id_of(self.path)
        url, path = self.url, self.path
        if fs.exists(f"{path}/{MANIFEST}"):
            if self.resume:
                raise CommitConflictError(f"{url} is already complete; nothing to resume")
            raise CommitConflictError(f"a backup already exists at {url}; choose another --backup-id")
        self.ck_old: Checkpoint | None = None
        if self.resume:
            try:
                self.ck_old = Checkpoint.from_json(fs.cat_file(f"{path}/{CHECKPOINT}"), f"{path}/{CHECKPOINT}")
            except FileNotFoundError:
                # died before the first checkpoint: nothing durable, start over
                if fs.exists(f"{path}/{TOPICS_DIR}"):
                    fs.rm(f"{path}/{TOPICS_DIR}", recursive=True)
            if self.ck_old is not None and PLAN_KEY not in self.ck_old.extra:
                raise KbsError(f"{url}: checkpoint has no backup plan; it was not written by kbs backup")
        elif fs.exists(f"{path}/{TOPICS_DIR}") or fs.exists(f"{path}/{CHECKPOINT}"):
            raise CommitConflictError(
                f"{url} holds an incomplete backup; continue it with --resume or choose another --backup-id")

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(client_config({
            "group.id": f"kbs-backup-{self.backup_id}",  # never committed: we assign, not subscribe
            **consumer_tuning(self.memory),
            **self.conf,
            # Last: an application's properties file (auto.offset.reset=latest, auto commit into its
            # own group, no EOF events) must not change what the backup reads.
            **_FORCED_CONSUMER_CONF,
        }))

    def _plan(self, md: Any, consumer: Any) -> _Plan:
        """The checkpoint's plan when resuming, else the cut read from the brokers now."""
        if self.ck_old is not None:
            plan = _Plan.from_doc(self.ck_old.extra[PLAN_KEY])
            self.compression = plan.doc.get("compression", self.compression)
            self.level = plan.doc.get("level", self.level)
            return plan
        from confluent_kafka import TopicPartition

        chosen = select_topics(list(md.topics), self.patterns, self.include_internal)
        if not chosen:
            raise KafkaOptionError(f"no topic matches {self.patterns} on {self.conf['bootstrap.servers']}")
        prev = self._previous_ends()
        cut: dict[tuple[str, int], tuple[int, int]] = {}
        gaps: dict[tuple[str, int], tuple[int, int]] = {}  # records gone between the two backups
        for t in chosen:
            tmd = md.topics[t]
            if tmd.error is not None or not tmd.partitions:
                # Its partitions would be missing from the cut, and from the backup, silently.
                raise KafkaClusterError(f"topic {t}: no partition metadata ({tmd.error or 'no partitions'}); try again")
            for p in sorted(tmd.partitions):
                low, high = _watermarks(consumer, TopicPartition(t, p), self.timeout)
                after = prev.get((t, p), -1) + 1
                if (t, p) in prev and low > after:
                    gaps[(t, p)] = (after, low)
                start = max(low, after)
                cut[(t, p)] = (start, max(start, high))
        doc: dict[str, Any] = {
            "partitions": _nested(cut),
            "partition_counts": {t: len(md.topics[t].partitions) for t in chosen},
            "compression": self.compression,
            "level": self.level,
            "incremental_from": self.incremental_from,
            "source_cluster": self._source_cluster(md),
        }
        if gaps:
            doc["gaps"] = _nested(gaps)
            listed = ", ".join(f"{t}/{p} [{a}, {b})" for (t, p), (a, b) in sorted(gaps.items())[:5])
            warnings.warn(
                f"records deleted from the broker since {self.incremental_from} ended are in neither backup: "
                f"{listed}{' ...' if len(gaps) > 5 else ''} (recorded as kafka.gaps in the manifest)",
                IncrementalGapWarning, stacklevel=4)
        return _Plan(cut, doc)

    def _previous_ends(self) -> dict[tuple[str, int], int]:
        """Incremental: the last offset the earlier backup holds per partition."""
        prev: dict[tuple[str, int], int] = {}
        if self.incremental_from:
            so = self.incremental_storage_options or self.storage_options
            for ref in open_backup(self.incremental_from, so).segments():
                if ref.last_offset is not None:
                    key = (ref.topic, ref.partition)
                    prev[key] = max(prev.get(key, -1), ref.last_offset)
        return prev

    def _source_cluster(self, md: Any) -> dict[str, Any]:
        return {"cluster_id": md.cluster_id,
                "bootstrap_servers": [s.strip() for s in self.conf["bootstrap.servers"].split(",")]}

    def _snapshot_groups(self, admin: Any, plan: _Plan) -> int:
        """Committed offsets of the groups on the chosen topics, beside the manifest (new runs)."""
        fs, path = self.fs, self.path
        if self.consumer_groups and self.ck_old is None:
            groups = snapshot_group_offsets(admin, {t for t, _ in plan.cut}, self.timeout)
            put_atomic(fs, f"{path}/{GROUPS_FILE}", groups_json(groups))
            return len(groups)
        if self.ck_old is not None and fs.exists(f"{path}/{GROUPS_FILE}"):
            return len(read_group_offsets(fs, path) or [])
        return 0

    def _open_writer(self, plan: _Plan, md: Any) -> tuple[BackupWriter, _Checkpointer]:
        """The run's segments are staged under _staging/<txn>/ and committed at the end; a
        resumed run drops what its checkpoint does not vouch for and continues the same
        transaction (older runs wrote in place: no txn id)."""
        fs, path, ck_old = self.fs, self.path, self.ck_old
        if ck_old is not None:
            txn_id = str(ck_old.extra.get(TXN_KEY) or uuid.uuid4().hex)
            _drop_uncovered(fs, path, ck_old)
            _drop_uncovered(fs, f"{path}/{STAGING_DIR}/{txn_id}", ck_old)
            ckp = _Checkpointer(fs, path, self.backup_id, plan.doc, txn_id, ck_old.topics)
        else:
            txn_id = uuid.uuid4().hex
            ckp = _Checkpointer(fs, path, self.backup_id, plan.doc, txn_id)
        ckp.write()  # the plan is durable before any segment exists
        writer = BackupWriter(
            path, fs=fs, compression=self.compression, level=self.level,
            segment_max_bytes=self.segment_max_bytes, segment_max_records=self.segment_max_records,
            mode="resume" if ck_old is not None else "error", txn_id=txn_id,
            buffer_max_bytes=self.memory.segment_buffer_bytes,
            compress_ahead_bytes=self.memory.compress_ahead_bytes,
            source_cluster=plan.doc.get("source_cluster") or self._source_cluster(md), on_segment=ckp.on_segment,
        )
        return writer, ckp

    def _read_cut(self, consumer: Any, plan: _Plan, writer: BackupWriter) -> None:
        """Consume up to the cut; chunks go to the writer, which compresses them on its threads
        while this thread goes on consuming."""
        positions = {k: max(s, writer.last_offset(*k) + 1) for k, (s, _e) in plan.cut.items()}

        def counted(cols: RecordColumns) -> None:  # on the writing thread
            nbytes = (len(cols.key_data) + len(cols.value_data) + len(cols.header_key_data)
                      + len(cols.header_value_data))
            self.totals[0] += len(cols)
            self.totals[1] += nbytes
            if self.progress is not None:
                self.progress(len(cols), nbytes)

        writing = _WritingThread(writer, counted, self.warm_up)
        buffers = _Buffers(self.memory, self.consume_batch, writing.chunk)
        reader = _CutReader(consumer, plan.cut, positions, buffers, consume_batch=self.consume_batch,
                            timeout=self.timeout, on_chunk=self.on_chunk, release=writing.release)
        if self.on_plan is not None:
            self.on_plan(reader.remaining())

        def checkpoint() -> None:  # bound what a crash makes --resume read again
            buffers.flush_all()
            writing.flush()

        ok = False
        try:
            with gc_paused():
                reader.run(self.checkpoint_interval, checkpoint)
            ok = True
        finally:
            try:
                writing.close(ok)
            except BaseException:
                writer._cancel_queue()  # compressions queued for segments that will not be written
                raise
            if not ok:
                writer._cancel_queue()

    def _commit(self, writer: BackupWriter, ckp: _Checkpointer, plan: _Plan) -> Any:
        """Pending segments, then the manifest (the backup is complete only then)."""
        doc = plan.doc
        manifest = writer.commit(extra={
            "kafka": {
                "backup_type": "incremental" if doc.get("incremental_from") else "full",
                "incremental_from": doc.get("incremental_from"),
                "partition_counts": doc.get("partition_counts", {}),
                "cut": doc["partitions"],
                "gaps": doc.get("gaps", {}),
                "consumer_groups_file": GROUPS_FILE if self.fs.exists(f"{self.path}/{GROUPS_FILE}") else None,
            },
        })
        ckp.write()
        return manifest


def run_backup(client_config: dict[str, str], topics: list[str], url: str, **options: Any) -> BackupResult:
    """Back up the topics matching ``topics`` (regular expressions) into the backup at ``url``.

    Parameters
    ----------
    client_config : dict
        librdkafka properties, at least ``bootstrap.servers``.
    topics : list of str
        Regular expressions; a topic is taken when one matches its whole name.
    url : str
        The backup directory ``<root>/<backup-id>`` on any fsspec URL.
    storage_options : dict, optional
    compression, level : str, int
        Codec (``zstd``, ``lz4``, ``none``) and level of the segments.
    segment_max_bytes, segment_max_records : int
        Roll segments at this compressed size (default 64 MiB) or record count.
    resume : bool
        Continue the interrupted backup at ``url`` from its checkpoint.
    incremental_from : str, optional
        URL of a previous backup; each partition starts after its last backed-up offset
        (``incremental_storage_options`` for its storage).
    include_internal, consumer_groups : bool
        Let the patterns match internal topics; snapshot consumer-group offsets (default True).
    checkpoint_interval : float
        Seconds after which pending data is written out as segments (and checkpointed) even
        if the segments are not full, bounding what a crash makes the resume re-read.
    timeout : float
        Seconds for broker requests (end offsets, groups); a backup fails when no record
        arrives for ``max(4 * timeout, 60)`` s.
    connect_timeout : float
        Seconds the first contact with the cluster may take (default 15).
    memory : BackupMemory, optional
        Memory bounds (see :class:`BackupMemory`). A backup also fixes glibc's mmap threshold
        just above ``chunk_bytes`` for the rest of the process (``fix_mmap_threshold``).
    consume_batch : int
        Messages asked of each ``consume()`` call (and most records of a chunk). 2,000
        keeps chunks near ``chunk_bytes``: with 10,000 one call's run of a partition made
        chunks of ~10 MB, which glibc serves from fresh mappings (a page fault per 4 KiB) or,
        once its threshold rose, from heaps that keep them (peak RSS ~30 MB higher).
    progress : callable, optional
        Called with (records, bytes) increments.
    on_plan : callable, optional
        Called once with the number of records the cut holds (an upper bound with gaps).
    on_chunk : callable, optional
        Called after every ``consume()`` call (tests slow a backup down with it to kill it).
    """
    return BackupRun(client_config, topics, url, **options).run()
