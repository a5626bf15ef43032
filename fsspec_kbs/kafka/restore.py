"""``kbs restore``: produce the records of a backup into a Kafka cluster.

Records keep their key, value, headers and timestamp (as CreateTime) and go to the same partition
number of the target topic, in offset order, through an idempotent producer. The backup is read
through :class:`fsspec_kbs.KbsDataset`, so every layout ``open_backup`` detects restores.
"""

from __future__ import annotations

import bisect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import KafkaClusterError, KafkaOptionError
from fsspec_kbs.filters import ScanFilter, to_millis
from fsspec_kbs.kafka.clients import (
    CONNECT_TIMEOUT,
    admin_client,
    client_config,
    cluster_metadata,
    gc_paused,
)
from fsspec_kbs.kafka.groups import read_group_offsets
from fsspec_kbs.kafka.produce import (
    PRODUCER_DEFAULTS,
    _Chunk,
    _ReadAhead,
    _Sender,
)
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
            raise KafkaOptionError(f"--map {pair!r} is not SOURCE:TARGET")
        out[check_topic(src)] = check_topic(dst)
    return out


def parse_offset_ranges(specs: list[str] | tuple[str, ...]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """``TOPIC:PARTITION:START:END`` bounds (START inclusive, END exclusive, either may be empty);
    ranges of the same partition intersect."""
    out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for spec in specs:
        parts = spec.rsplit(":", 3)
        try:
            topic, part, start, end = parts
            key = (topic, int(part))
            lo, hi = (int(start) if start else None, int(end) if end else None)
        except ValueError as e:
            raise KafkaOptionError(f"offset range {spec!r} is not TOPIC:PARTITION:START:END") from e
        if key in out:  # the same partition again (e.g. a continuation added): both bounds hold
            a, b = out[key]
            lo = a if lo is None else lo if a is None else max(a, lo)
            hi = b if hi is None else hi if b is None else min(b, hi)
        out[key] = (lo, hi)
    return out


def _source_partition_counts(ds: KbsDataset) -> dict[str, int]:
    counts = (ds.backup.manifest_extra.get("kafka") or {}).get("partition_counts") or {}
    return {str(t): int(n) for t, n in counts.items()}


class RestoreRun:
    """One ``kbs restore`` run, in phases: select, plan (exact counts), target topics,
    produce, consumer-group offsets. See :func:`run_restore` for the parameters."""

    def __init__(self, backup_url: str, client_config: dict[str, str], *, storage_options: dict | None = None,
                 topics: list[str] | None = None, topic_pattern: str | None = None,
                 mapping: dict[str, str] | None = None, partitions: list[int] | None = None,
                 from_time: Any = None, to_time: Any = None,
                 offset_ranges: dict[tuple[str, int], tuple[int | None, int | None]] | None = None,
                 create_topics: bool = False, replication_factor: int = -1, topic_config: dict[str, str] | None = None,
                 include_offset_headers: bool = False, offset_header_style: str = "kbs",
                 restore_consumer_offsets: bool = False, dry_run: bool = False, timeout: float = 30.0,
                 connect_timeout: float = CONNECT_TIMEOUT, progress: ProgressFn | None = None,
                 on_plan: Callable[[list[PartitionPlan]], None] | None = None) -> None:
        if offset_header_style not in OFFSET_HEADER_STYLES:
            raise KafkaOptionError(f"offset header style must be one of {OFFSET_HEADER_STYLES}")
        self.backup_url, self.conf, self.storage_options = backup_url, client_config, storage_options
        self.topics, self.topic_pattern, self.partitions = topics, topic_pattern, partitions
        self.mapping = {check_topic(src): check_topic(dst) for src, dst in (mapping or {}).items()}
        self.from_time, self.to_time, self.offset_ranges = from_time, to_time, offset_ranges
        self.create_topics, self.replication_factor, self.topic_config = create_topics, replication_factor, topic_config
        self.include_offset_headers, self.offset_header_style = include_offset_headers, offset_header_style
        self.restore_consumer_offsets, self.dry_run = restore_consumer_offsets, dry_run
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.progress, self.on_plan = progress, on_plan

    def run(self) -> RestoreResult:
        t0 = time.monotonic()
        ds = self._select()
        plans = self._plan(ds)
        if self.on_plan is not None:
            self.on_plan(plans)
        admin = admin_client(self.conf)
        result = self._targets(admin, ds, plans)
        if not self.dry_run:
            groups = (read_group_offsets(ds.backup.fs, ds.backup.path) or []) if self.restore_consumer_offsets else []
            translation = _Translation(groups, {(pp.topic, pp.partition) for pp in plans})
            result.records, result.bytes = self._produce(ds, translation)
            result.group_offsets = self._set_group_offsets(admin, translation)
        result.seconds = time.monotonic() - t0
        return result

    # -- phases -------------------------------------------------------------------------------
    def _select(self) -> KbsDataset:
        ds = KbsDataset.open(self.backup_url, self.storage_options)
        in_backup = set(ds.backup.topics())
        unknown = sorted({*(self.topics or []), *self.mapping} - in_backup)
        if unknown:
            raise KafkaOptionError(f"topic(s) {', '.join(unknown)} are not in the backup {self.backup_url} "
                           f"(it holds {', '.join(sorted(in_backup)) or 'no topics'})")
        ds = ds.filter(topics=self.topics, partitions=self.partitions, start_time=to_millis(self.from_time),
                       end_time=to_millis(self.to_time), topic_pattern=self.topic_pattern)
        if self.offset_ranges:
            ds = KbsDataset(ds.backup, ds.scan_filter.and_(ScanFilter(offset_ranges=dict(self.offset_ranges))))
        return ds

    def _plan(self, ds: KbsDataset) -> list[PartitionPlan]:
        """Exact counts per partition: from the manifest where a whole segment is inside the
        bounds, else from the segment's offsets and timestamps."""
        sf = ds.scan_filter
        plan: dict[tuple[str, int], PartitionPlan] = {}

        def add(t: str, p: int, n: int, first: int, last: int, lo: int | None, hi: int | None) -> None:
            pp = plan.get((t, p))
            if pp is None:
                pp = plan[(t, p)] = PartitionPlan(t, p, self.mapping.get(t, t))
            pp.records += n
            pp.first_offset = first if pp.first_offset is None else min(pp.first_offset, first)
            pp.last_offset = last if pp.last_offset is None else max(pp.last_offset, last)
            if lo is not None:
                pp.min_timestamp = lo if pp.min_timestamp is None else min(pp.min_timestamp, lo)
            if hi is not None:
                pp.max_timestamp = hi if pp.max_timestamp is None else max(pp.max_timestamp, hi)

        for ref in ds.fragments():
            if _wholly_inside(ref, sf):
                if ref.records:
                    add(ref.topic, ref.partition, ref.records, ref.first_offset, ref.last_offset,
                        ref.min_timestamp, ref.max_timestamp)
                continue
            for cols in ds.backup.iter_columns(ref, bounds=sf.segment_bounds(ref)):
                mask = sf.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
                offs, ts = (cols.offsets, cols.timestamps) if mask is None else (cols.offsets[mask], cols.timestamps[mask])
                if len(offs):
                    add(ref.topic, ref.partition, len(offs), int(offs[0]), int(offs[-1]), int(ts.min()), int(ts.max()))
        return sorted(plan.values(), key=lambda x: (x.topic, x.partition))

    def _targets(self, admin: Any, ds: KbsDataset, plans: list[PartitionPlan]) -> RestoreResult:
        """Check (and with ``create_topics`` create) the target topics; retention warnings."""
        from confluent_kafka.admin import NewTopic

        md = cluster_metadata(admin, self.conf, self.connect_timeout)
        src_counts = _source_partition_counts(ds)
        needed: dict[str, int] = {}
        highest: dict[str, int] = {}
        for pp in plans:
            needed[pp.target] = max(needed.get(pp.target, 0), pp.partition + 1, src_counts.get(pp.topic, 0))
            highest[pp.target] = max(highest.get(pp.target, 0), pp.partition + 1)
        missing = sorted(t for t in needed if t not in md.topics)
        for t in needed:
            if t in md.topics and len(md.topics[t].partitions) < highest[t]:
                raise KafkaClusterError(f"target topic {t} has {len(md.topics[t].partitions)} partitions; the backup needs "
                               f"{highest[t]} (partition numbers are kept)")
        if missing and not self.create_topics and not self.dry_run:
            raise KafkaClusterError(f"target topic(s) {', '.join(missing)} do not exist; pass --create-topics to create them")
        result = RestoreResult(0, 0, 0.0, plans, missing if self.create_topics else [], dry_run=self.dry_run)
        if self.dry_run:
            return result
        if missing:
            futs = admin.create_topics([NewTopic(t, num_partitions=needed[t], replication_factor=self.replication_factor,
                                                 config=dict(self.topic_config or {})) for t in missing],
                                       request_timeout=self.timeout)
            for t, f in futs.items():
                try:
                    f.result()
                except Exception as e:  # KafkaException carries the broker's reason
                    raise KafkaClusterError(f"cannot create topic {t}: {e}") from e
            _wait_for_topics(admin, missing, self.timeout)
        result.retention_warnings = _retention_warnings(admin, plans, self.timeout)
        for msg in result.retention_warnings:
            warnings.warn(msg, RetentionWarning, stacklevel=4)
        return result

    def _producer(self, sender: _Sender, full_reports: bool) -> Any:
        from confluent_kafka import Producer

        return Producer(client_config({
            **PRODUCER_DEFAULTS,
            # A delivery report per record costs a Python call each; errors are all we need
            # unless consumer-group offsets are translated (their marker records report).
            "delivery.report.only.error": not full_reports,
            **self.conf,
            "enable.idempotence": True,  # no duplicates from internal retries, order kept
            "on_delivery": sender.on_error,
        }))

    def _produce(self, ds: KbsDataset, translation: _Translation) -> tuple[int, int]:
        """Produce the selection in offset order per partition; on any stop, flush and raise
        :class:`RestoreIncompleteError` saying what reached the target."""
        sender = _Sender(None, self.mapping, self.include_offset_headers, self.offset_header_style)
        producer = sender.producer = self._producer(sender, bool(translation.wanted))
        cause = None
        try:
            with gc_paused():
                for chunk in _ReadAhead(ds):
                    sender.send(chunk, translation.markers(chunk))
                    if self.progress is not None:
                        self.progress(len(chunk.offsets), chunk.nbytes)
                    if sender.errors:
                        cause = "the cluster refused records: " + "; ".join(sender.errors)
                        break
        except Exception as e:  # a corrupt segment, storage errors: what was sent still counts
            cause = str(e)
            error: Exception | None = e
        else:
            error = None
        remaining = producer.flush(max(self.timeout, 60.0))
        if cause is None and sender.errors:
            cause = "the cluster refused records: " + "; ".join(sender.errors)
        if cause is None and remaining:
            cause = f"{remaining} records were not acknowledged by the cluster in time"
        if cause is not None:
            raise sender.incomplete(cause, remaining) from error
        return sender.records, sender.bytes

    def _set_group_offsets(self, admin: Any, translation: _Translation) -> dict[str, dict[tuple[str, int], int]]:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        out: dict[str, dict[tuple[str, int], int]] = {}
        for gid, table in translation.targets(self.mapping).items():
            tps = [TopicPartition(t, p, off) for (t, p), off in table.items()]
            futs = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(gid, tps)],
                                                      request_timeout=self.timeout)
            try:
                futs[gid].result()
            except Exception as e:
                raise KafkaClusterError(f"cannot set offsets of consumer group {gid}: {e}") from e
            out[gid] = table
        return out


def _wholly_inside(ref: Any, sf: ScanFilter) -> bool:
    """The manifest knows the segment's ranges and all of it is inside the bounds."""
    s_off, e_off = sf.bounds(ref.topic, ref.partition)
    return (ref.records is not None and ref.first_offset is not None and ref.last_offset is not None
            and ref.min_timestamp is not None and ref.max_timestamp is not None
            and (s_off is None or ref.first_offset >= s_off) and (e_off is None or ref.last_offset < e_off)
            and (sf.start_time is None or ref.min_timestamp >= sf.start_time)
            and (sf.end_time is None or ref.max_timestamp < sf.end_time))


class _Translation:
    """Consumer-group offsets: the source offsets whose target offsets are needed, and those
    found by the delivery reports of their records."""

    def __init__(self, groups: list[Any], restored: set[tuple[str, int]]) -> None:
        self.groups = groups
        wanted: dict[tuple[str, int], set[int]] = {}
        for g in groups:
            for t, ps in g.offsets.items():
                for p, off in ps.items():
                    if (t, p) in restored:
                        wanted.setdefault((t, p), set()).add(off)
        self.wanted = {k: sorted(v) for k, v in wanted.items()}
        self.translated: dict[tuple[str, int, int], int] = {}  # (src topic, p, committed) -> target offset
        self.end_of: dict[tuple[str, int], int] = {}  # (src topic, p) -> last target offset + 1

    def markers(self, c: _Chunk) -> dict[int, Callable[[Any, Any], None]]:
        """Record index -> delivery callback, for the records whose target offsets are needed
        (the first at or after each committed offset, and the chunk's last)."""
        commits = self.wanted.get(c.src)
        if not commits:
            return {}
        src, offs = c.src, c.offsets
        at: dict[int, list[int]] = {}
        for committed in commits:
            if committed <= offs[-1] and (src[0], src[1], committed) not in self.translated:
                at.setdefault(bisect.bisect_left(offs, committed), []).append(committed)
                self.translated[(src[0], src[1], committed)] = -1  # scheduled; later chunks skip it
        at.setdefault(len(offs) - 1, [])  # the last record tells where the data ends
        return {i: self._marker(src, cs) for i, cs in at.items()}

    def _marker(self, src: tuple[str, int], commits: list[int]) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                return  # counted by the producer's own callback
            for c in commits:
                self.translated[(src[0], src[1], c)] = msg.offset()
            self.end_of[src] = max(self.end_of.get(src, 0), msg.offset() + 1)
        return cb

    def targets(self, mapping: dict[str, str]) -> dict[str, dict[tuple[str, int], int]]:
        """Per group, the target offset to commit per target partition."""
        out: dict[str, dict[tuple[str, int], int]] = {}
        for g in self.groups:
            table: dict[tuple[str, int], int] = {}
            for t, ps in g.offsets.items():
                for p, off in ps.items():
                    if (t, p) not in self.wanted:
                        continue
                    new = self.translated.get((t, p, off))
                    if new is None or new < 0:
                        new = self.end_of.get((t, p))  # committed past the restored data: its end
                    if new is not None:
                        table[(mapping.get(t, t), p)] = new
            if table:
                out[g.group_id] = table
        return out


def run_restore(backup_url: str, client_config: dict[str, str], **options: Any) -> RestoreResult:
    """Restore a backup (or the selected part of it) into the cluster of ``client_config``.

    Time bounds: ``from_time`` inclusive, ``to_time`` exclusive (Unix ms, ISO 8601, datetime).
    ``offset_ranges`` bounds single source partitions: ``{(topic, p): (start, end_exclusive)}``.
    With ``restore_consumer_offsets`` every consumer group of the backup's snapshot gets, per
    restored partition, the target offset of the first restored record whose source offset is
    at or after the group's committed offset (or the end of the restored data when none is).
    ``topic_config``: configs of the topics ``create_topics`` creates (e.g. ``{"retention.ms":
    "-1"}``: records older than a topic's retention are deleted by the broker soon after they are
    restored; each target topic's retention is checked and a :class:`RetentionWarning` given).
    ``connect_timeout``: seconds the first contact with the cluster may take (default 15).

    Raises
    ------
    RestoreIncompleteError
        The restore stopped part-way; it says per partition what reached the target and the
        ``--offset-range`` flags that continue it without duplicates.
    """
    return RestoreRun(backup_url, client_config, **options).run()


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
            raise KafkaClusterError(f"created topics {topics} did not get partition leaders in {timeout} s")
        time.sleep(0.1)
