"""``kbs backup``: copy a consistent cut of Kafka topics into a KBS backup.

The cut: each partition's end offset is read once at the start and the backup stops there, so
records produced while it runs are left for the next (incremental) backup. After every durable
segment ``checkpoints/checkpoint.json`` records the last offset written per partition; a resumed
backup deletes segments the checkpoint does not cover, adopts the rest and restarts each partition
at checkpoint offset + 1, so nothing is lost or duplicated whenever the process died.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import repeat
from operator import is_not, itemgetter
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from fsspec_kbs.errors import CommitConflictError, KbsError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.kafka.clients import (
    CONNECT_TIMEOUT,
    admin_client,
    client_config,
    cluster_metadata,
    return_freed_buffers,
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
    check_backup_id,
    parse_segment_name,
)

#: Key of our own planning data inside checkpoint.json (extra fields are allowed there).
PLAN_KEY = "kbs_backup_plan"
#: Key of the writer's transaction id in checkpoint.json: a resumed run continues its staging.
TXN_KEY = "kbs_backup_txn"

ProgressFn = Callable[[int, int], None]

#: Consumer errors no retry can fix (others are retried by librdkafka; see the stall timeout).
_FATAL_NAMES = ("TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
                "SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION", "_SSL", "UNSUPPORTED_VERSION")
#: Errors after which librdkafka goes on *past* records it did not deliver: a batch failing its CRC
#: or not decodable is skipped, a fetch position out of range (records deleted by retention or
#: DeleteRecords, a truncated log) is reset. Ignoring them completes a backup with a silent gap.
_SKIPPED_NAMES = (
    "_BAD_MSG",
    "_BAD_COMPRESSION",
    "_NOT_IMPLEMENTED",
    "_AUTO_OFFSET_RESET",
    "_LOG_TRUNCATION",
    "OFFSET_OUT_OF_RANGE",
    "UNSUPPORTED_COMPRESSION_TYPE",
)
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


def _codes(names: tuple[str, ...]) -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


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
                raise KbsError(msg) from e
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


@dataclass
class BackupMemory:
    """What a backup holds in memory at most, beyond the interpreter and its libraries.

    None of it grows with the number of records or partitions: each is a bound in bytes, and
    a bound that is reached makes the backup wait (or write a segment early), not grow.
    """

    #: librdkafka's queue of fetched, not yet consumed records (``queued.max.messages.kbytes``;
    #: one queue for all partitions). ``-X queued.max.messages.kbytes=…`` overrides it.
    fetch_queue_bytes: int = 16 * 1024 * 1024
    #: Records of one partition handed to the compressing threads together.
    chunk_bytes: int = 4 * 1024 * 1024
    #: Records consumed and not yet handed over, all partitions together: beyond it the
    #: partition holding most is handed over early (so many partitions do not multiply it).
    buffer_bytes: int = 16 * 1024 * 1024
    #: Records handed over and queued for compression, not compressed yet (the compressing
    #: threads' work ahead; ``BackupWriter(compress_ahead_bytes=…)``): beyond it consuming waits.
    compress_ahead_bytes: int = 32 * 1024 * 1024
    #: Compressed data of unfinished segments, all partitions together: beyond it the largest
    #: is written early as a smaller segment (``BackupWriter(buffer_max_bytes=…)``). Writing a
    #: segment holds it a second time, briefly. With many partitions, raise it for larger segments.
    segment_buffer_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("fetch_queue_bytes", "chunk_bytes", "buffer_bytes", "compress_ahead_bytes",
                     "segment_buffer_bytes"):
            if getattr(self, name) <= 0:
                raise KbsError(f"BackupMemory.{name} must be positive")


def _message_methods() -> tuple[Callable, ...]:
    from confluent_kafka import Message

    return (Message.error, Message.topic, Message.partition, Message.offset, Message.key, Message.value,
            Message.headers, Message.timestamp)


def _pack(values: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(values)
    valid = np.fromiter(map(is_not, values, repeat(None)), dtype=np.bool_, count=n)
    present = values if bool(valid.all()) else [v for v in values if v is not None]
    lens = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
    offs = np.zeros(n + 1, dtype=np.int64)
    if len(present) == n:
        np.cumsum(lens, out=offs[1:])
    else:
        full = np.zeros(n, dtype=np.int64)
        full[valid] = lens
        np.cumsum(full, out=offs[1:])
    if offs[-1] > np.iinfo(np.int32).max:
        raise KbsError("a chunk of records exceeds 2 GiB")  # chunks are bounded far below this
    data = np.frombuffer(b"".join(present), dtype=np.uint8)
    return offs.astype(np.int32), data, valid


def columns_of_messages(msgs: list[Any], offsets: np.ndarray) -> RecordColumns:
    """RecordColumns of consumed messages (one partition, increasing ``offsets``), field by field
    with C-level ``map`` calls: no Python work per record beyond what the columns need."""
    _, _, _, _, key, value, headers, timestamp = _message_methods()
    koffs, kdata, kvalid = _pack(list(map(key, msgs)))
    voffs, vdata, vvalid = _pack(list(map(value, msgs)))
    n = len(msgs)
    ts = np.fromiter(map(itemgetter(1), map(timestamp, msgs)), dtype=np.int64, count=n)
    hdrs = list(map(headers, msgs))
    hoffs = np.zeros(n + 1, dtype=np.int32)
    flat: list = []
    if hdrs.count(None) != n:
        counts = np.fromiter((len(h) if h else 0 for h in hdrs), dtype=np.int64, count=n)
        np.cumsum(counts, out=hoffs[1:], dtype=np.int32)
        flat = [kv for h in hdrs if h for kv in h]
    hkoffs, hkdata, _ = _pack([k.encode("utf-8") if isinstance(k, str) else bytes(k) for k, _ in flat])
    hvoffs, hvdata, hvvalid = _pack([v if v is None or isinstance(v, bytes) else bytes(v) for _, v in flat])
    return RecordColumns(
        offsets=offsets, timestamps=ts,
        key_offsets=koffs, key_data=kdata, key_valid=kvalid,
        value_offsets=voffs, value_data=vdata, value_valid=vvalid,
        header_offsets=hoffs, header_key_offsets=hkoffs, header_key_data=hkdata,
        header_value_offsets=hvoffs, header_value_data=hvdata, header_value_valid=hvvalid,
    )


@dataclass
class _Pending:
    """Consumed records of one partition not handed over yet (the Message objects themselves:
    their fields are read in bulk when the chunk is built)."""

    msgs: list[Any] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)
    nbytes: int = 0


class _Buffers:
    """Per-partition chunks being filled, bounded per partition and all together
    (:class:`BackupMemory`); full chunks go to ``emit(key, msgs, offsets)``."""

    def __init__(self, memory: BackupMemory, chunk_records: int,
                 emit: Callable[[tuple[str, int], list[Any], np.ndarray], None]) -> None:
        self.memory = memory
        self.chunk_records = chunk_records
        self.emit = emit
        self.parts: dict[tuple[str, int], _Pending] = {}
        self.total = 0

    def add(self, key: tuple[str, int], msgs: list[Any], offsets: np.ndarray, nbytes: int) -> None:
        pend = self.parts.get(key)
        if pend is None:
            pend = self.parts[key] = _Pending()
        pend.msgs.extend(msgs)
        pend.offsets.append(offsets)
        pend.nbytes += nbytes
        self.total += nbytes
        if pend.nbytes >= self.memory.chunk_bytes or len(pend.msgs) >= self.chunk_records:
            self.flush(key)
        while self.total > self.memory.buffer_bytes:
            self.flush(max(self.parts, key=lambda k: self.parts[k].nbytes))

    def last_offset(self, key: tuple[str, int]) -> int | None:
        pend = self.parts.get(key)
        return int(pend.offsets[-1][-1]) if pend else None

    def flush(self, key: tuple[str, int]) -> None:
        pend = self.parts.pop(key, None)
        if pend is None:
            return
        self.total -= pend.nbytes
        offs = pend.offsets[0] if len(pend.offsets) == 1 else np.concatenate(pend.offsets)
        self.emit(key, pend.msgs, offs)

    def flush_all(self) -> None:
        for key in list(self.parts):
            self.flush(key)

def default_backup_id() -> str:
    return datetime.now(timezone.utc).strftime("backup-%Y%m%dT%H%M%SZ")


def select_topics(all_topics: list[str], patterns: list[str], include_internal: bool = False) -> list[str]:
    """Topics whose whole name matches one of the regular expressions."""
    regs = []
    for p in patterns:
        try:
            regs.append(re.compile(p))
        except re.error as e:
            raise KbsError(f"bad topic pattern {p!r}: {e}") from e
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
                try:
                    keep = parse_segment_name(name) <= parse_segment_name(prog.segment)
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


class _CutReader:
    """Consumes every partition from its position up to the cut and hands the records over in
    chunks. One ``consume()`` call returns many messages; they are cut into runs of one
    partition and each run is checked and buffered as a whole (offsets as an array)."""

    def __init__(self, consumer: Any, cut: dict[tuple[str, int], tuple[int, int]],
                 positions: dict[tuple[str, int], int], buffers: _Buffers, *, consume_batch: int,
                 timeout: float, on_chunk: Callable[[], None] | None) -> None:
        self.consumer = consumer
        self.cut = cut
        self.positions = positions
        self.active = {k: cut[k][1] for k, v in positions.items() if v < cut[k][1]}  # key -> end offset
        self.buffers = buffers
        self.consume_batch = consume_batch
        self.timeout = timeout
        self.on_chunk = on_chunk
        self.last_error: str | None = None

    def remaining(self) -> int:
        return sum(end - self.positions[k] for k, end in self.active.items())

    def run(self, every: float, periodic: Callable[[], None]) -> None:
        """Read until every partition reached the cut; ``periodic`` every ``every`` seconds."""
        from confluent_kafka import TopicPartition

        if self.active:
            self.consumer.assign([TopicPartition(t, p, self.positions[(t, p)]) for (t, p) in sorted(self.active)])
        last_tick = last_progress = time.monotonic()
        # librdkafka retries retriable errors (leader moves, a broker down) by itself; give up
        # only when nothing at all arrives for this long, so --resume can take over later.
        stall_timeout = max(4 * self.timeout, 60.0)
        while self.active:
            # consume() waits for num_messages or the timeout: ask for no more than can still
            # come (plus one EOF event per partition) so the tail does not wait out the timeout.
            want = self.remaining() + len(self.active)
            msgs = self.consumer.consume(num_messages=max(1, min(self.consume_batch, want)), timeout=0.5)
            now = time.monotonic()
            if self.take(msgs):
                last_progress = now
            elif now - last_progress > stall_timeout:
                raise KbsError(f"no record arrived for {stall_timeout:.0f} s with {len(self.active)} partition(s) "
                               f"unfinished (last error: {self.last_error}); continue later with --resume")
            if self.on_chunk is not None:
                self.on_chunk()
            if now - last_tick > every:
                periodic()
                last_tick = time.monotonic()
        self.buffers.flush_all()

    def take(self, msgs: list[Any]) -> bool:
        """Buffer one consume() result; True when it held a record or an end-of-partition."""
        error, topic, partition, offset, *_ = _message_methods()
        if not msgs:
            return False
        errs = list(map(error, msgs))
        eofs: list[Any] = []
        if any(map(is_not, errs, repeat(None))):  # (KafkaError == None raises: no count())
            eofs = self._errors(msgs, errs)
            msgs = [m for m, e in zip(msgs, errs, strict=True) if e is None]
        if msgs:
            parts = np.fromiter(map(partition, msgs), dtype=np.int64, count=len(msgs))
            topics = list(map(topic, msgs))
            if topics.count(topics[0]) != len(topics):
                ids = {t: i for i, t in enumerate(sorted(set(topics)))}
                parts = parts + (1 << 32) * np.array([ids[t] for t in topics], dtype=np.int64)
            bounds = [0, *(np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist(), len(msgs)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                m0 = msgs[a]
                self._take_run((topic(m0), partition(m0)), msgs[a:b], offset)
        for m in eofs:  # after the records that came before them
            key = (topic(m), partition(m))
            if key in self.active and offset(m) >= self.active[key]:
                self._finish(key)
        return bool(msgs) or bool(eofs)

    def _take_run(self, key: tuple[str, int], run: list[Any], offset: Callable) -> None:
        end = self.active.get(key)
        if end is None:
            return  # a partition already finished (records past the cut)
        offs = np.fromiter(map(offset, run), dtype=np.int64, count=len(run))
        if offs[-1] >= end:
            k = int(np.searchsorted(offs, end))
            run, offs = run[:k], offs[:k]
        if len(run):
            self.buffers.add(key, run, offs, sum(map(len, run)))
            self.positions[key] = int(offs[-1]) + 1
        if self.positions[key] >= end:
            self._finish(key)

    def _errors(self, msgs: list[Any], errs: list[Any]) -> list[Any]:
        """Raise on errors a backup cannot go past; return the end-of-partition events."""
        from confluent_kafka import KafkaError

        fatal, skipped = _codes(_FATAL_NAMES), _codes(_SKIPPED_NAMES)
        eofs = []
        for m, err in zip(msgs, errs, strict=True):
            if err is None:
                continue
            key = (m.topic(), m.partition())
            if err.code() == KafkaError._PARTITION_EOF:
                eofs.append(m)
            elif err.fatal() or err.code() in fatal:
                raise KbsError(f"consuming {key[0]}/{key[1]} failed: {err.str()}")
            elif key in self.active and err.code() in skipped:
                at = self.buffers.last_offset(key)
                at = self.positions[key] if at is None else at + 1
                raise KbsError(
                    f"records of {key[0]}/{key[1]} from about offset {at} cannot be "
                    f"read ({err.name()}: {err.str()}): deleted from the broker "
                    "(retention, DeleteRecords) after the backup planned them, or "
                    "corrupt; the backup would miss them"
                )
            else:
                self.last_error = err.str()
        return eofs

    def _finish(self, key: tuple[str, int]) -> None:
        """The partition reached the cut: hand over what it holds and stop fetching it."""
        from confluent_kafka import TopicPartition

        del self.active[key]
        self.buffers.flush(key)
        self.consumer.incremental_unassign([TopicPartition(*key)])


def _warm_up(compression: str, level: int | None) -> None:
    """Load the encoding kernels (numba: ~1 s of CPU in a fresh process) and the codec while the
    main thread plans the cut, mostly waiting for the brokers, instead of at the first chunk."""
    from fsspec_kbs.format import compress_batch, encode_batches
    from fsspec_kbs.format.codecs import codec_from_name

    try:
        cols = RecordColumns.from_records([{"offset": 0, "timestamp": 0, "key": b"k", "value": b"v",
                                            "headers": [("h", b"v")]}])
        for batch in encode_batches(cols, 1024):
            compress_batch(batch, codec_from_name(compression), level)
    except Exception:  # only an optimisation: the real work reports real errors
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
                 consume_batch: int = 10_000, progress: ProgressFn | None = None,
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

    def run(self) -> BackupResult:
        t0 = time.monotonic()
        return_freed_buffers()
        threading.Thread(target=_warm_up, args=(self.compression, self.level), name="kbs-warm-up",
                         daemon=True).start()
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
        self.backup_id = check_backup_id(self.path.rsplit("/", 1)[-1])
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

        queue = self.memory.fetch_queue_bytes
        return Consumer(client_config({
            "group.id": f"kbs-backup-{self.backup_id}",  # never committed: we assign, not subscribe
            # A small queue refilled by small fetches right away (librdkafka waits a second by
            # default once the queue is full): bounded memory, and faster than one big queue.
            "queued.max.messages.kbytes": max(1, queue // 1024),
            "fetch.queue.backoff.ms": 5,
            "fetch.max.bytes": max(1024 * 1024, min(8 * 1024 * 1024, queue // 2)),
            "max.partition.fetch.bytes": 2 * 1024 * 1024,
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
            raise KbsError(f"no topic matches {self.patterns} on {self.conf['bootstrap.servers']}")
        prev = self._previous_ends()
        cut: dict[tuple[str, int], tuple[int, int]] = {}
        gaps: dict[tuple[str, int], tuple[int, int]] = {}  # records gone between the two backups
        for t in chosen:
            tmd = md.topics[t]
            if tmd.error is not None or not tmd.partitions:
                # Its partitions would be missing from the cut, and from the backup, silently.
                raise KbsError(f"topic {t}: no partition metadata ({tmd.error or 'no partitions'}); try again")
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

        def emit(key: tuple[str, int], msgs: list[Any], offsets: np.ndarray) -> None:
            cols = columns_of_messages(msgs, offsets)
            nbytes = (len(cols.key_data) + len(cols.value_data) + len(cols.header_key_data)
                      + len(cols.header_value_data))
            writer.write_columns(key[0], key[1], cols)
            self.totals[0] += len(cols)
            self.totals[1] += nbytes
            if self.progress is not None:
                self.progress(len(cols), nbytes)

        buffers = _Buffers(self.memory, self.consume_batch, emit)
        reader = _CutReader(consumer, plan.cut, positions, buffers, consume_batch=self.consume_batch,
                            timeout=self.timeout, on_chunk=self.on_chunk)
        if self.on_plan is not None:
            self.on_plan(reader.remaining())

        def checkpoint() -> None:  # bound what a crash makes --resume read again
            buffers.flush_all()
            writer.flush()

        try:
            reader.run(self.checkpoint_interval, checkpoint)
        except BaseException:
            writer._cancel_queue()  # compressions queued for segments that will not be written
            raise

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
        Memory bounds (see :class:`BackupMemory`).
    consume_batch : int
        Messages asked of each ``consume()`` call (and most records of a chunk).
    progress : callable, optional
        Called with (records, bytes) increments.
    on_plan : callable, optional
        Called once with the number of records the cut holds (an upper bound with gaps).
    on_chunk : callable, optional
        Called after every ``consume()`` call (tests slow a backup down with it to kill it).
    """
    return BackupRun(client_config, topics, url, **options).run()
