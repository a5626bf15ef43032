"""``kbs backup``: copy a consistent cut of Kafka topics into a KBS backup.

The cut: each partition's end offset is read once at the start and the backup stops there, so
records produced while it runs are left for the next (incremental) backup. After every durable
segment ``checkpoints/checkpoint.json`` records the last offset written per partition; a resumed
backup deletes segments the checkpoint does not cover, adopts the rest and restarts each partition
at checkpoint offset + 1, so nothing is lost or duplicated whenever the process died.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from fsspec_kbs.errors import CommitConflictError, KbsError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.kafka.groups import GROUPS_FILE, groups_json, snapshot_group_offsets
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

#: Test hook: seconds to sleep after each consumed chunk (makes a backup slow enough to kill).
THROTTLE_ENV = "KBS_TEST_BACKUP_THROTTLE"
#: Key of our own planning data inside checkpoint.json (extra fields are allowed there).
PLAN_KEY = "kbs_backup_plan"
#: Key of the writer's transaction id in checkpoint.json: a resumed run continues its staging.
TXN_KEY = "kbs_backup_txn"

ProgressFn = Callable[[int, int], None]

_CHUNK_RECORDS = 5000
_CHUNK_BYTES = 8 * 1024 * 1024
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
class _PartBuf:
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[list | None] = field(default_factory=list)
    nbytes: int = 0


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


def columns_from_buffer(buf: _PartBuf) -> RecordColumns:
    """RecordColumns from consumed messages' fields (one partition, increasing offsets)."""
    koffs, kdata, kvalid = _pack(buf.keys)
    voffs, vdata, vvalid = _pack(buf.values)
    n = len(buf.headers)
    hoffs = np.zeros(n + 1, dtype=np.int32)
    if any(buf.headers):
        counts = np.fromiter((len(h) if h else 0 for h in buf.headers), dtype=np.int64, count=n)
        np.cumsum(counts, out=hoffs[1:], dtype=np.int32)
        flat = [kv for h in buf.headers if h for kv in h]
    else:
        flat = []
    hkoffs, hkdata, _ = _pack([k.encode("utf-8") if isinstance(k, str) else bytes(k) for k, _ in flat])
    hvoffs, hvdata, hvvalid = _pack([v if v is None or isinstance(v, bytes) else bytes(v) for _, v in flat])
    return RecordColumns(
        offsets=np.array(buf.offsets, dtype=np.int64),
        timestamps=np.array(buf.timestamps, dtype=np.int64),
        key_offsets=koffs, key_data=kdata, key_valid=kvalid,
        value_offsets=voffs, value_data=vdata, value_valid=vvalid,
        header_offsets=hoffs, header_key_offsets=hkoffs, header_key_data=hkdata,
        header_value_offsets=hvoffs, header_value_data=hvdata, header_value_valid=hvvalid,
    )


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


def run_backup(
    client_config: dict[str, str],
    topics: list[str],
    url: str,
    *,
    storage_options: dict | None = None,
    compression: str = "zstd",
    level: int | None = None,
    segment_max_bytes: int = 64 * 1024 * 1024,
    segment_max_records: int | None = None,
    resume: bool = False,
    incremental_from: str | None = None,
    incremental_storage_options: dict | None = None,
    include_internal: bool = False,
    consumer_groups: bool = True,
    checkpoint_interval: float = 60.0,
    timeout: float = 30.0,
    progress: ProgressFn | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> BackupResult:
    """Back up the topics matching ``topics`` (regular expressions) into the backup at ``url``.

    Parameters
    ----------
    client_config : dict
        librdkafka properties, at least ``bootstrap.servers``.
    topics : list of str
        Regular expressions; a topic is taken when one matches its whole name.
    url : str
        The backup directory ``<root>/<backup-id>`` on any fsspec URL.
    resume : bool
        Continue the interrupted backup at ``url`` from its checkpoint.
    incremental_from : str, optional
        URL of a previous backup; each partition starts after its last backed-up offset.
    checkpoint_interval : float
        Seconds after which pending data is written out as segments (and checkpointed) even
        if the segments are not full, bounding what a crash makes the resume re-read.
    progress : callable, optional
        Called with (records, bytes) increments.
    on_plan : callable, optional
        Called once with the number of records the cut holds (an upper bound with gaps).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    fatal_codes = _codes(_FATAL_NAMES)
    skipped_codes = _codes(_SKIPPED_NAMES)

    t0 = time.monotonic()
    fs, path = url_to_fs(url, **(storage_options or {}))
    path = path.rstrip("/")
    backup_id = check_backup_id(path.rsplit("/", 1)[-1])
    if fs.exists(f"{path}/{MANIFEST}"):
        if resume:
            raise CommitConflictError(f"{url} is already complete; nothing to resume")
        raise CommitConflictError(f"a backup already exists at {url}; choose another --backup-id")

    ck_old: Checkpoint | None = None
    if resume:
        try:
            ck_old = Checkpoint.from_json(fs.cat_file(f"{path}/{CHECKPOINT}"), f"{path}/{CHECKPOINT}")
        except FileNotFoundError:
            ck_old = None  # died before the first checkpoint: nothing durable, start over
            if fs.exists(f"{path}/{TOPICS_DIR}"):
                fs.rm(f"{path}/{TOPICS_DIR}", recursive=True)
        if ck_old is not None and PLAN_KEY not in ck_old.extra:
            raise KbsError(f"{url}: checkpoint has no backup plan; it was not written by kbs backup")
    elif fs.exists(f"{path}/{TOPICS_DIR}") or fs.exists(f"{path}/{CHECKPOINT}"):
        raise CommitConflictError(
            f"{url} holds an incomplete backup; continue it with --resume or choose another --backup-id")

    admin = AdminClient(dict(client_config))
    consumer_conf = {
        "group.id": f"kbs-backup-{backup_id}",  # never committed: we assign, not subscribe
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        "log_level": 3,
        **client_config,
        # Last: an application's properties file (auto.offset.reset=latest, auto commit into its
        # own group, no EOF events) must not change what the backup reads.
        **_FORCED_CONSUMER_CONF,
    }
    consumer = Consumer(consumer_conf)
    try:
        md = admin.list_topics(timeout=timeout)
        source_cluster = {"cluster_id": md.cluster_id,
                          "bootstrap_servers": [s.strip() for s in client_config["bootstrap.servers"].split(",")]}
        if ck_old is not None:
            plan = ck_old.extra[PLAN_KEY]
            cut = {(t, int(p)): (int(se[0]), int(se[1])) for t, ps in plan["partitions"].items() for p, se in ps.items()}
            compression = plan.get("compression", compression)
            level = plan.get("level", level)
        else:
            chosen = select_topics(list(md.topics), topics, include_internal)
            if not chosen:
                raise KbsError(f"no topic matches {topics} on {client_config['bootstrap.servers']}")
            prev: dict[tuple[str, int], int] = {}
            if incremental_from:
                for ref in open_backup(incremental_from, incremental_storage_options or storage_options).segments():
                    if ref.last_offset is not None:
                        key = (ref.topic, ref.partition)
                        prev[key] = max(prev.get(key, -1), ref.last_offset)
            cut = {}
            gaps: dict[tuple[str, int], tuple[int, int]] = {}  # records gone between the two backups
            for t in chosen:
                tmd = md.topics[t]
                if tmd.error is not None or not tmd.partitions:
                    # Its partitions would be missing from the cut, and from the backup, silently.
                    why = tmd.error or "no partitions"
                    raise KbsError(f"topic {t}: no partition metadata ({why}); try again")
                for p in sorted(tmd.partitions):
                    low, high = _watermarks(consumer, TopicPartition(t, p), timeout)
                    after = prev.get((t, p), -1) + 1
                    if (t, p) in prev and low > after:
                        gaps[(t, p)] = (after, low)
                    start = max(low, after)
                    cut[(t, p)] = (start, max(start, high))
            plan = {
                "partitions": {},
                "partition_counts": {t: len(md.topics[t].partitions) for t in chosen},
                "compression": compression,
                "level": level,
                "incremental_from": incremental_from,
                "source_cluster": source_cluster,
            }
            for (t, p), (s, e) in cut.items():
                plan["partitions"].setdefault(t, {})[str(p)] = [s, e]
            if gaps:
                plan["gaps"] = _nested(gaps)
                listed = ", ".join(f"{t}/{p} [{a}, {b})" for (t, p), (a, b) in sorted(gaps.items())[:5])
                warnings.warn(
                    f"records deleted from the broker since {incremental_from} ended are in neither backup: "
                    f"{listed}{' ...' if len(gaps) > 5 else ''} (recorded as kafka.gaps in the manifest)",
                    IncrementalGapWarning, stacklevel=2)

        groups = []
        if consumer_groups and ck_old is None:
            groups = snapshot_group_offsets(admin, {t for t, _ in cut}, timeout)
            put_atomic(fs, f"{path}/{GROUPS_FILE}", groups_json(groups))
        elif ck_old is not None and fs.exists(f"{path}/{GROUPS_FILE}"):
            from fsspec_kbs.kafka.groups import read_group_offsets

            groups = read_group_offsets(fs, path) or []

        # The run's segments are staged under _staging/<txn>/ and committed at the end; a
        # resumed run continues the same transaction (older runs wrote in place: no txn id).
        txn_id = str(ck_old.extra.get(TXN_KEY) or uuid.uuid4().hex) if ck_old is not None else uuid.uuid4().hex
        if ck_old is not None:
            _drop_uncovered(fs, path, ck_old)
            _drop_uncovered(fs, f"{path}/{STAGING_DIR}/{txn_id}", ck_old)
            ckp = _Checkpointer(fs, path, backup_id, plan, txn_id, ck_old.topics)
        else:
            ckp = _Checkpointer(fs, path, backup_id, plan, txn_id)
        ckp.write()  # the plan is durable before any segment exists

        writer = BackupWriter(
            path, fs=fs, compression=compression, level=level,
            segment_max_bytes=segment_max_bytes, segment_max_records=segment_max_records,
            mode="resume" if ck_old is not None else "error", txn_id=txn_id,
            source_cluster=plan.get("source_cluster", source_cluster), on_segment=ckp.on_segment,
        )
        positions = {}
        for (t, p), (s, _e) in cut.items():
            done_upto = writer.last_offset(t, p)
            positions[(t, p)] = max(s, done_upto + 1)
        active = {k: cut[k][1] for k, v in positions.items() if v < cut[k][1]}  # partition -> end offset
        if on_plan is not None:
            on_plan(sum(end - positions[k] for k, end in active.items()))

        throttle = float(os.environ.get(THROTTLE_ENV) or 0)
        chunk_records = 100 if throttle else _CHUNK_RECORDS
        bufs: dict[tuple[str, int], _PartBuf] = {}

        # Encoding and compressing run on one worker thread (zstd and the numba kernels release
        # the GIL) while this thread keeps consuming; order per partition is kept by the single
        # worker, and at most a few chunks are in flight to bound memory.
        pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbs-backup-writer")
        inflight: deque[cf.Future] = deque()
        totals = [0, 0]

        def write_chunk(key: tuple[str, int], buf: _PartBuf) -> None:
            cols = columns_from_buffer(buf)
            nbytes = (len(cols.key_data) + len(cols.value_data) + len(cols.header_key_data)
                      + len(cols.header_value_data))
            writer.write_columns(key[0], key[1], cols)
            totals[0] += len(cols)
            totals[1] += nbytes
            if progress is not None:
                progress(len(cols), nbytes)

        def submit(fn: Callable, *args: Any) -> None:
            inflight.append(pool.submit(fn, *args))
            while inflight and (inflight[0].done() or len(inflight) > 4):
                inflight.popleft().result()  # re-raises a failed write here

        def flush_buf(key: tuple[str, int]) -> None:
            buf = bufs.pop(key, None)
            if buf and buf.offsets:
                positions[key] = buf.offsets[-1] + 1
                submit(write_chunk, key, buf)

        def finish(key: tuple[str, int]) -> None:
            """The partition reached the cut: stop fetching it."""
            del active[key]
            flush_buf(key)
            consumer.incremental_unassign([TopicPartition(*key)])

        try:
            if active:
                consumer.assign([TopicPartition(t, p, positions[(t, p)]) for (t, p) in sorted(active)])
            last_flush = last_progress = time.monotonic()
            last_error = None
            # librdkafka retries retriable errors (leader moves, a broker down) by itself; give up
            # only when nothing at all arrives for this long, so --resume can take over later.
            stall_timeout = max(4 * timeout, 60.0)
            while active:
                # consume() waits for num_messages or the timeout: ask for no more than can still
                # come (plus one EOF event per partition) so the tail does not wait out the timeout.
                want = sum(end - positions[k] for k, end in active.items()) + len(active)
                msgs = consumer.consume(num_messages=max(1, min(chunk_records, want)), timeout=0.5)
                now = time.monotonic()
                if any(m.error() is None or m.error().code() == KafkaError._PARTITION_EOF for m in msgs):
                    last_progress = now
                elif now - last_progress > stall_timeout:
                    raise KbsError(f"no record arrived for {stall_timeout:.0f} s with {len(active)} partition(s) "
                                   f"unfinished (last error: {last_error}); continue later with --resume")
                for m in msgs:
                    key = (m.topic(), m.partition())
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if key in active and m.offset() >= cut[key][1]:
                                finish(key)
                            continue
                        if err.fatal() or err.code() in fatal_codes:
                            raise KbsError(f"consuming {key[0]}/{key[1]} failed: {err.str()}")
                        if key in active and err.code() in skipped_codes:
                            buf = bufs.get(key)
                            at = buf.offsets[-1] + 1 if buf and buf.offsets else positions[key]
                            raise KbsError(
                                f"records of {key[0]}/{key[1]} from about offset {at} cannot be "
                                f"read ({err.name()}: {err.str()}): deleted from the broker "
                                "(retention, DeleteRecords) after the backup planned them, or "
                                "corrupt; the backup would miss them"
                            )
                        last_error = err.str()
                        continue
                    end = active.get(key)
                    if end is None:
                        continue
                    off = m.offset()
                    if off >= end:
                        continue
                    buf = bufs.get(key)
                    if buf is None:
                        buf = bufs[key] = _PartBuf()
                    v = m.value()
                    buf.offsets.append(off)
                    buf.timestamps.append(m.timestamp()[1])
                    buf.keys.append(m.key())
                    buf.values.append(v)
                    buf.headers.append(m.headers())
                    if v:
                        buf.nbytes += len(v)
                    if off >= end - 1:
                        finish(key)
                    elif len(buf.offsets) >= chunk_records or buf.nbytes >= _CHUNK_BYTES:
                        flush_buf(key)
                if throttle:
                    for key in list(bufs):
                        flush_buf(key)
                    time.sleep(throttle)
                if time.monotonic() - last_flush > checkpoint_interval:
                    for key in list(bufs):
                        flush_buf(key)
                    submit(writer.flush)
                    last_flush = time.monotonic()
            for key in list(bufs):
                flush_buf(key)
            while inflight:
                inflight.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        total_records, total_bytes = totals
        manifest = writer.commit(extra={
            "kafka": {
                "backup_type": "incremental" if plan.get("incremental_from") else "full",
                "incremental_from": plan.get("incremental_from"),
                "partition_counts": plan.get("partition_counts", {}),
                "cut": plan["partitions"],
                "gaps": plan.get("gaps", {}),
                "consumer_groups_file": GROUPS_FILE if fs.exists(f"{path}/{GROUPS_FILE}") else None,
            },
        })
        ckp.write()
        return BackupResult(url, backup_id, total_records, total_bytes, time.monotonic() - t0,
                            cut, ckp.segments, len(groups), ck_old is not None, manifest,
                            {(t, int(p)): (g[0], g[1]) for t, ps in plan.get("gaps", {}).items()
                             for p, g in ps.items()})
    finally:
        consumer.close()
