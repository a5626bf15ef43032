"""``kbs backup``: copy a consistent cut of Kafka topics into a KBS backup.

The cut: each partition's end offset is read once at the start and the backup stops there, so
records produced while it runs are left for the next (incremental) backup. After every durable
segment ``checkpoints/checkpoint.json`` records the last offset written per partition; a resumed
backup deletes segments the checkpoint does not cover, adopts the rest and restarts each partition
at checkpoint offset + 1, so nothing is lost or duplicated whenever the process died.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
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
from fsspec_kbs.store.commit import put_atomic
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

ProgressFn = Callable[[int, int], None]

_CHUNK_RECORDS = 5000
_CHUNK_BYTES = 8 * 1024 * 1024


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
    lens = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=n)
    offs = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offs[1:], dtype=np.int32)
    data = np.frombuffer(b"".join([v for v in values if v is not None]), dtype=np.uint8)
    valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=n)
    return offs, data, valid


def columns_from_buffer(buf: _PartBuf) -> RecordColumns:
    """RecordColumns from consumed messages' fields (one partition, increasing offsets)."""
    koffs, kdata, kvalid = _pack(buf.keys)
    voffs, vdata, vvalid = _pack(buf.values)
    counts = np.fromiter((0 if h is None else len(h) for h in buf.headers), dtype=np.int64, count=len(buf.headers))
    hoffs = np.zeros(len(buf.headers) + 1, dtype=np.int32)
    np.cumsum(counts, out=hoffs[1:], dtype=np.int32)
    flat = [kv for h in buf.headers if h for kv in h]
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

    def __init__(self, fs: Any, path: str, backup_id: str, plan: dict,
                 topics: dict[str, dict[int, PartitionProgress]] | None = None) -> None:
        self.fs = fs
        self.path = f"{path}/{CHECKPOINT}"
        self.ck = Checkpoint(backup_id, utc_now_iso(), topics or {}, {PLAN_KEY: plan})
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
    """Delete segment (and stray temp) files the checkpoint does not vouch for; returns the count."""
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
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        "log_level": 3,
        **client_config,
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
            for t in chosen:
                for p in sorted(md.topics[t].partitions):
                    low, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout, cached=False)
                    start = max(low, prev.get((t, p), -1) + 1)
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

        groups = []
        if consumer_groups and ck_old is None:
            groups = snapshot_group_offsets(admin, {t for t, _ in cut}, timeout)
            put_atomic(fs, f"{path}/{GROUPS_FILE}", groups_json(groups))
        elif ck_old is not None and fs.exists(f"{path}/{GROUPS_FILE}"):
            from fsspec_kbs.kafka.groups import read_group_offsets

            groups = read_group_offsets(fs, path) or []

        if ck_old is not None:
            _drop_uncovered(fs, path, ck_old)
            ckp = _Checkpointer(fs, path, backup_id, plan, ck_old.topics)
        else:
            ckp = _Checkpointer(fs, path, backup_id, plan)
        ckp.write()  # the plan is durable before any segment exists

        writer = BackupWriter(
            path, fs=fs, compression=compression, level=level,
            segment_max_bytes=segment_max_bytes, segment_max_records=segment_max_records,
            mode="resume" if ck_old is not None else "error",
            source_cluster=plan.get("source_cluster", source_cluster), on_segment=ckp.on_segment,
        )
        positions = {}
        for (t, p), (s, _e) in cut.items():
            done_upto = writer.last_offset(t, p)
            positions[(t, p)] = max(s, done_upto + 1)
        active = {k: v for k, v in positions.items() if v < cut[k][1]}
        if on_plan is not None:
            on_plan(sum(cut[k][1] - v for k, v in active.items()))

        throttle = float(os.environ.get(THROTTLE_ENV) or 0)
        chunk_records = 100 if throttle else _CHUNK_RECORDS
        bufs: dict[tuple[str, int], _PartBuf] = {}
        total_records = total_bytes = 0

        def flush_buf(key: tuple[str, int]) -> None:
            buf = bufs.pop(key, None)
            if buf and buf.offsets:
                writer.write_columns(key[0], key[1], columns_from_buffer(buf))

        if active:
            consumer.assign([TopicPartition(t, p, off) for (t, p), off in sorted(active.items())])
        last_flush = time.monotonic()
        while active:
            # consume() waits for num_messages or the timeout: ask for no more than can still come
            # (plus one EOF event per partition) so the tail does not wait out the timeout.
            want = sum(cut[k][1] - positions[k] for k in active) + len(active)
            msgs = consumer.consume(num_messages=max(1, min(chunk_records, want)), timeout=0.5)
            n_new = b_new = 0
            for m in msgs:
                err = m.error()
                key = (m.topic(), m.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if key in active and m.offset() >= cut[key][1]:
                            del active[key]
                            flush_buf(key)
                            consumer.incremental_unassign([TopicPartition(*key)])
                        continue
                    if err.fatal() or not err.retriable():
                        raise KbsError(f"consuming {key[0]}/{key[1]} failed: {err.str()}")
                    continue
                if key not in active:
                    continue
                off = m.offset()
                end = cut[key][1]
                if off >= end:
                    continue
                positions[key] = off + 1
                buf = bufs.get(key)
                if buf is None:
                    buf = bufs[key] = _PartBuf()
                k, v = m.key(), m.value()
                h = m.headers()
                buf.offsets.append(off)
                buf.timestamps.append(m.timestamp()[1])
                buf.keys.append(k)
                buf.values.append(v)
                buf.headers.append(h)
                size = (len(k) if k else 0) + (len(v) if v else 0)
                if h:
                    size += sum(len(hk) + (len(hv) if hv else 0) for hk, hv in h)
                buf.nbytes += size
                n_new += 1
                b_new += size
                if off >= end - 1:
                    del active[key]
                    flush_buf(key)
                    consumer.incremental_unassign([TopicPartition(*key)])
                elif len(buf.offsets) >= chunk_records or buf.nbytes >= _CHUNK_BYTES:
                    flush_buf(key)
            if throttle:
                for key in list(bufs):
                    flush_buf(key)
                time.sleep(throttle)
            total_records += n_new
            total_bytes += b_new
            if progress is not None and (n_new or b_new):
                progress(n_new, b_new)
            if time.monotonic() - last_flush > checkpoint_interval:
                for key in list(bufs):
                    flush_buf(key)
                writer.flush()
                last_flush = time.monotonic()
        for key in list(bufs):
            flush_buf(key)
        manifest = writer.commit(extra={
            "kafka": {
                "backup_type": "incremental" if plan.get("incremental_from") else "full",
                "incremental_from": plan.get("incremental_from"),
                "partition_counts": plan.get("partition_counts", {}),
                "cut": plan["partitions"],
                "consumer_groups_file": GROUPS_FILE if fs.exists(f"{path}/{GROUPS_FILE}") else None,
            },
        })
        ckp.write()
        return BackupResult(url, backup_id, total_records, total_bytes, time.monotonic() - t0,
                            cut, ckp.segments, len(groups), ck_old is not None, manifest)
    finally:
        consumer.close()
