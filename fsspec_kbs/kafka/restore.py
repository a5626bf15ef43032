"""``kbs restore``: produce the records of a backup into a Kafka cluster.

Records keep their key, value, headers and timestamp (as CreateTime) and go to the same partition
number of the target topic, in offset order, through an idempotent producer. The backup is read
through :class:`fsspec_kbs.KbsDataset`, so every layout ``open_backup`` detects restores.
"""

from __future__ import annotations

import struct
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import KbsError
from fsspec_kbs.filters import ScanFilter, to_millis
from fsspec_kbs.kafka.groups import read_group_offsets
from fsspec_kbs.store.names import check_topic

ProgressFn = Callable[[int, int], None]
OFFSET_HEADER_STYLES = ("kbs", "oso")


@dataclass
class PartitionPlan:
    topic: str
    partition: int
    target: str
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None


@dataclass
class RestoreResult:
    records: int
    bytes: int
    seconds: float
    plan: list[PartitionPlan]
    created_topics: list[str] = field(default_factory=list)
    group_offsets: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)  # group -> (topic, p) -> offset
    dry_run: bool = False
    #: Target topics whose time retention is shorter than the age of the records restored into them
    #: (see :class:`RetentionWarning`), as messages.
    retention_warnings: list[str] = field(default_factory=list)


class RetentionWarning(UserWarning):
    """Restored records are older than their target topic's ``retention.ms``.

    Kafka deletes by record timestamp and a restore keeps the original timestamps, so the broker
    deletes such records at its next retention check (every 5 min by default), soon after the
    restore reported them written.
    """


def parse_map(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``src:dst`` topic renames."""
    out = {}
    for pair in pairs:
        src, sep, dst = pair.partition(":")
        if not sep or not src or not dst:
            raise KbsError(f"--map {pair!r} is not SOURCE:TARGET")
        out[check_topic(src)] = check_topic(dst)
    return out


def parse_offset_ranges(specs: list[str] | tuple[str, ...]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """``TOPIC:PARTITION:START:END`` bounds (START inclusive, END exclusive, either may be empty)."""
    out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for spec in specs:
        parts = spec.rsplit(":", 3)
        try:
            topic, part, start, end = parts
            key = (topic, int(part))
            out[key] = (int(start) if start else None, int(end) if end else None)
        except ValueError as e:
            raise KbsError(f"offset range {spec!r} is not TOPIC:PARTITION:START:END") from e
    return out


def offset_headers(style: str, offset: int, timestamp: int, partition: int) -> list[tuple[str, bytes]]:
    """Provenance headers added to a restored record (kbs-format.md §5 or OSO's binary form)."""
    if style == "kbs":
        return [("x-kafka-backup-offset", str(offset).encode()),
                ("x-kafka-backup-timestamp", str(timestamp).encode()),
                ("x-kafka-backup-partition", str(partition).encode())]
    return [("x-original-offset", struct.pack("<q", offset)),
            ("x-original-timestamp", struct.pack("<q", timestamp)),
            ("x-source-partition", struct.pack("<i", partition))]


def _source_partition_counts(ds: KbsDataset) -> dict[str, int]:
    manifest = getattr(ds.backup, "manifest", None)
    extra = getattr(manifest, "extra", None) or {}
    counts = (extra.get("kafka") or {}).get("partition_counts") or {}
    return {str(t): int(n) for t, n in counts.items()}


def run_restore(
    backup_url: str,
    client_config: dict[str, str],
    *,
    storage_options: dict | None = None,
    topics: list[str] | None = None,
    topic_pattern: str | None = None,
    mapping: dict[str, str] | None = None,
    partitions: list[int] | None = None,
    from_time: Any = None,
    to_time: Any = None,
    offset_ranges: dict[tuple[str, int], tuple[int | None, int | None]] | None = None,
    create_topics: bool = False,
    replication_factor: int = -1,
    topic_config: dict[str, str] | None = None,
    include_offset_headers: bool = False,
    offset_header_style: str = "kbs",
    restore_consumer_offsets: bool = False,
    dry_run: bool = False,
    timeout: float = 30.0,
    progress: ProgressFn | None = None,
    on_plan: Callable[[list[PartitionPlan]], None] | None = None,
) -> RestoreResult:
    """Restore a backup (or the selected part of it) into the cluster of ``client_config``.

    Time bounds: ``from_time`` inclusive, ``to_time`` exclusive (Unix ms, ISO 8601, datetime).
    ``offset_ranges`` bounds single source partitions: ``{(topic, p): (start, end_exclusive)}``.
    With ``restore_consumer_offsets`` every consumer group of the backup's snapshot gets, per
    restored partition, the target offset of the first restored record whose source offset is
    at or after the group's committed offset (or the end of the restored data when none is).
    ``topic_config``: configs of the topics ``create_topics`` creates (e.g. ``{"retention.ms":
    "-1"}``: records older than a topic's retention are deleted by the broker soon after they are
    restored; each target topic's retention is checked and a :class:`RetentionWarning` given).
    """
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    if offset_header_style not in OFFSET_HEADER_STYLES:
        raise KbsError(f"offset header style must be one of {OFFSET_HEADER_STYLES}")
    t0 = time.monotonic()
    mapping = {check_topic(src): check_topic(dst) for src, dst in (mapping or {}).items()}
    ds = KbsDataset.open(backup_url, storage_options)
    in_backup = set(ds.backup.topics())
    unknown = sorted({*(topics or []), *mapping} - in_backup)
    if unknown:
        raise KbsError(f"topic(s) {', '.join(unknown)} are not in the backup {backup_url} "
                       f"(it holds {', '.join(sorted(in_backup)) or 'no topics'})")
    ds = ds.filter(topics=topics, partitions=partitions, start_time=to_millis(from_time),
                   end_time=to_millis(to_time), topic_pattern=topic_pattern)
    if offset_ranges:
        ds = KbsDataset(ds.backup, ds.scan_filter.and_(ScanFilter(offset_ranges=dict(offset_ranges))))

    # -- plan: exact counts; from the manifest where a whole segment is inside the bounds --------
    sf = ds.scan_filter
    plan: dict[tuple[str, int], PartitionPlan] = {}

    def add(t: str, p: int, n: int, first: int, last: int, lo: int | None, hi: int | None) -> None:
        pp = plan.get((t, p))
        if pp is None:
            pp = plan[(t, p)] = PartitionPlan(t, p, mapping.get(t, t))
        pp.records += n
        pp.first_offset = first if pp.first_offset is None else min(pp.first_offset, first)
        pp.last_offset = last if pp.last_offset is None else max(pp.last_offset, last)
        if lo is not None:
            pp.min_timestamp = lo if pp.min_timestamp is None else min(pp.min_timestamp, lo)
        if hi is not None:
            pp.max_timestamp = hi if pp.max_timestamp is None else max(pp.max_timestamp, hi)

    for ref in ds.fragments():
        s_off, e_off = sf.bounds(ref.topic, ref.partition)
        whole = (ref.records is not None and ref.first_offset is not None and ref.last_offset is not None
                 and ref.min_timestamp is not None and ref.max_timestamp is not None
                 and (s_off is None or ref.first_offset >= s_off) and (e_off is None or ref.last_offset < e_off)
                 and (sf.start_time is None or ref.min_timestamp >= sf.start_time)
                 and (sf.end_time is None or ref.max_timestamp < sf.end_time))
        if whole:
            if ref.records:
                add(ref.topic, ref.partition, ref.records, ref.first_offset, ref.last_offset,
                    ref.min_timestamp, ref.max_timestamp)
            continue
        for cols in ds.backup.iter_columns(ref):
            mask = sf.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
            offs, ts = (cols.offsets, cols.timestamps) if mask is None else (cols.offsets[mask], cols.timestamps[mask])
            if len(offs):
                add(ref.topic, ref.partition, len(offs), int(offs[0]), int(offs[-1]), int(ts.min()), int(ts.max()))
    plans = sorted(plan.values(), key=lambda x: (x.topic, x.partition))
    if on_plan is not None:
        on_plan(plans)

    # -- target topics -------------------------------------------------------------------------------
    admin = AdminClient(dict(client_config))
    md = admin.list_topics(timeout=timeout)
    src_counts = _source_partition_counts(ds)
    needed: dict[str, int] = {}
    for pp in plans:
        needed[pp.target] = max(needed.get(pp.target, 0), pp.partition + 1, src_counts.get(pp.topic, 0))
    missing = sorted(t for t in needed if t not in md.topics)
    for t in needed:
        if t in md.topics and len(md.topics[t].partitions) < max(pp.partition + 1 for pp in plans if pp.target == t):
            raise KbsError(f"target topic {t} has {len(md.topics[t].partitions)} partitions; the backup needs "
                           f"{max(pp.partition + 1 for pp in plans if pp.target == t)} (partition numbers are kept)")
    if missing and not create_topics and not dry_run:
        raise KbsError(f"target topic(s) {', '.join(missing)} do not exist; pass --create-topics to create them")
    result = RestoreResult(0, 0, 0.0, plans, missing if create_topics else [], dry_run=dry_run)
    if dry_run:
        result.seconds = time.monotonic() - t0
        return result
    if missing:
        futs = admin.create_topics([NewTopic(t, num_partitions=needed[t], replication_factor=replication_factor,
                                             config=dict(topic_config or {})) for t in missing],
                                   request_timeout=timeout)
        for t, f in futs.items():
            try:
                f.result()
            except Exception as e:  # KafkaException carries the broker's reason
                raise KbsError(f"cannot create topic {t}: {e}") from e
        _wait_for_topics(admin, missing, timeout)
    result.retention_warnings = _retention_warnings(admin, plans, timeout)
    for msg in result.retention_warnings:
        warnings.warn(msg, RetentionWarning, stacklevel=2)

    # -- consumer-group translation: which source offsets we need the target offset of ------------
    groups = []
    if restore_consumer_offsets:
        groups = read_group_offsets(ds.backup.fs, ds.backup.path) or []
    wanted: dict[tuple[str, int], list[int]] = {}
    for g in groups:
        for t, ps in g.offsets.items():
            for p, off in ps.items():
                if (t, p) in plan:
                    wanted.setdefault((t, p), []).append(off)
    wanted = {k: sorted(set(v)) for k, v in wanted.items()}
    translated: dict[tuple[str, int, int], int] = {}  # (src topic, p, src committed) -> target offset
    end_of: dict[tuple[str, int], int] = {}  # (src topic, p) -> last target offset + 1

    # -- produce --------------------------------------------------------------------------------------
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and len(errors) < 10:
            errors.append(f"{msg.topic()}/{msg.partition()}: {err.str() if hasattr(err, 'str') else err}")

    producer = Producer({
        "linger.ms": 20,
        "batch.size": 1024 * 1024,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "compression.type": "lz4",
        "log_level": 3,  # retried warnings (e.g. coordinator still loading) would garble the progress bar
        **client_config,
        "enable.idempotence": True,  # no duplicates from internal retries, order kept
        "on_delivery": on_delivery,
    })

    def marker(src: tuple[str, int], commits: list[int], is_last: bool) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                on_delivery(err, msg)
                return
            for c in commits:
                translated[(src[0], src[1], c)] = msg.offset()
            if is_last:
                end_of[src] = max(end_of.get(src, 0), msg.offset() + 1)
        return cb

    produce = producer.produce
    poll = producer.poll
    with_headers = include_offset_headers
    style = offset_header_style
    total = total_bytes = 0
    for batch in ds.to_batches():
        n = batch.num_rows
        if not n:
            continue
        src = (batch.column(2)[0].as_py(), batch.column(3)[0].as_py())
        dst = mapping.get(src[0], src[0])
        part = src[1]
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        offs_np = batch.column("offset").to_numpy()
        offs = offs_np.tolist()
        ts = batch.column("timestamp").cast(pa.int64()).to_numpy().tolist()
        hcol = batch.column("headers")
        hdrs = _headers_lists(hcol)
        markers: dict[int, list[int]] = {}
        for c in wanted.get(src, []):
            if c <= offs[-1] and (src[0], src[1], c) not in translated:
                i = int(np.searchsorted(offs_np, c))
                markers.setdefault(i, []).append(c)
        markers.setdefault(n - 1, [])  # the last record of each batch tells where the data ends
        nbytes = 0
        for i in range(n):
            h = hdrs[i] if hdrs is not None else None
            if with_headers:
                h = (h or []) + offset_headers(style, offs[i], ts[i], part)
            k, v = keys[i], values[i]
            while True:
                try:
                    if i in markers:
                        produce(dst, v, k, part, timestamp=ts[i], headers=h,
                                on_delivery=marker(src, markers[i], i == n - 1))
                    else:
                        produce(dst, v, k, part, timestamp=ts[i], headers=h)
                    break
                except BufferError:
                    poll(0.05)
            nbytes += (len(k) if k else 0) + (len(v) if v else 0)
        # Resolve commits that point past this batch's records only once all batches are seen;
        # mark the ones inside the batch as scheduled so later batches do not redo them.
        for cs in markers.values():
            for c in cs:
                translated.setdefault((src[0], src[1], c), -1)
        poll(0)
        total += n
        total_bytes += nbytes
        if progress is not None:
            progress(n, nbytes)
        if errors:
            break
    remaining = producer.flush(timeout=max(timeout, 60.0))
    if errors:
        raise KbsError("producing failed: " + "; ".join(errors))
    if remaining:
        raise KbsError(f"{remaining} records were not acknowledged by the cluster in time")

    # -- consumer-group offsets -------------------------------------------------------------------------
    if groups:
        for g in groups:
            tps = []
            table: dict[tuple[str, int], int] = {}
            for t, ps in g.offsets.items():
                for p, off in ps.items():
                    if (t, p) not in plan:
                        continue
                    new = translated.get((t, p, off))
                    if new is None or new < 0:
                        new = end_of.get((t, p))  # committed past the restored data: its end
                    if new is None:
                        continue
                    dst = mapping.get(t, t)
                    tps.append(TopicPartition(dst, p, new))
                    table[(dst, p)] = new
            if not tps:
                continue
            futs = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(g.group_id, tps)],
                                                      request_timeout=timeout)
            try:
                futs[g.group_id].result()
            except Exception as e:
                raise KbsError(f"cannot set offsets of consumer group {g.group_id}: {e}") from e
            result.group_offsets[g.group_id] = table

    result.records, result.bytes = total, total_bytes
    result.seconds = time.monotonic() - t0
    return result


def _headers_lists(hcol: pa.Array) -> list | None:
    """Per record a list of (key, value) tuples or None; None for the column when no record has any."""
    if hcol.null_count == len(hcol):
        return None
    offsets = hcol.offsets.to_numpy()
    if offsets[-1] == offsets[0]:
        return None
    # .values ignores a slice of the list array; offsets are absolute into it.
    base = int(offsets[0])
    flat = hcol.values.slice(base, int(offsets[-1]) - base)
    pairs = list(zip(flat.field("key").to_pylist(), flat.field("value").to_pylist(), strict=True))
    bounds = (offsets - base).tolist()
    return [pairs[a:b] or None for a, b in zip(bounds[:-1], bounds[1:], strict=False)]


def _retention_warnings(admin: Any, plans: list[PartitionPlan], timeout: float) -> list[str]:
    """One message per target topic whose ``retention.ms`` is shorter than the age of the oldest
    record restored into it (topics that only compact are left alone)."""
    from confluent_kafka.admin import ConfigResource

    oldest: dict[str, int] = {}
    for pp in plans:
        if pp.records and pp.min_timestamp is not None:
            oldest[pp.target] = min(oldest.get(pp.target, pp.min_timestamp), pp.min_timestamp)
    if not oldest:
        return []
    now = int(time.time() * 1000)
    out = []
    futs = admin.describe_configs([ConfigResource("TOPIC", t) for t in sorted(oldest)], request_timeout=timeout)
    for res, fut in sorted(futs.items(), key=lambda kv: kv[0].name):
        try:
            cfg = fut.result()
            ms = int(cfg["retention.ms"].value)
            policy = cfg["cleanup.policy"].value or "delete"
        except Exception:  # no right to describe configs: nothing to say, not a reason to stop
            continue
        age = now - oldest[res.name]
        if "delete" in policy and 0 <= ms < age:
            out.append(f"topic {res.name} deletes records older than retention.ms={ms} ({ms / 86_400_000:.1f} days) "
                       f"but the oldest record restored into it is {age / 86_400_000:.1f} days old: the broker "
                       "will delete such records at its next retention check. Raise retention.ms on the topic "
                       "(kafka-configs --alter --add-config retention.ms=-1), or create it with "
                       "--topic-config retention.ms=-1, and restore again")
    return out


def _wait_for_topics(admin: Any, topics: list[str], timeout: float) -> None:
    """Wait until new topics have leaders for every partition (producing before fails)."""
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        ready = all(t in md.topics and md.topics[t].partitions and md.topics[t].error is None
                    and all(p.leader >= 0 for p in md.topics[t].partitions.values()) for t in topics)
        if ready:
            return
        if time.monotonic() > deadline:
            raise KbsError(f"created topics {topics} did not get partition leaders in {timeout} s")
        time.sleep(0.1)
