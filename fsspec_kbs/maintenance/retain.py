"""Kafka-style retention applied to a backup: drop whole leading segments by age or size.

Semantics (docs/compaction-retention.md), per partition, in Kafka's order:

1. time (``max_age``): leading segments whose largest timestamp is more than ``max_age`` before
   the reference time are dropped (Kafka: ``now - segment.largestTimestamp > retention.ms``),
   stopping at the first segment that is kept. The reference time is ``now`` when given, else the
   backup's latest timestamp (so an old backup is not emptied just because it is old).
2. size (``max_bytes``): with ``excess = partition bytes - max_bytes``, leading segments are
   dropped while ``excess - segment bytes >= 0`` (Kafka's ``retention.bytes`` rule: the partition
   never goes below the limit by more than one segment's size).

Kept segments are copied byte for byte to the new backup (with a batch index rebuilt from each),
renumbered from ``segment-00000000``
(the manifest requires sequence numbers to start at 0); they are staged and committed with the
commit protocol (:mod:`fsspec_kbs.store.txn`), so a reader sees either no backup (or the one
replaced) or the whole retained one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from fsspec_kbs.errors import IncompleteBackupError, UnsupportedLayoutError
from fsspec_kbs.filters import to_millis
from fsspec_kbs.format.batch_index import encode_index
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.maintenance.units import parse_duration, parse_size
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.batch_index import index_path
from fsspec_kbs.store.commit import put_file
from fsspec_kbs.store.manifest import (
    WRITE_VERSION,
    Manifest,
    PartitionEntry,
    SegmentEntry,
    TopicEntry,
    summarize,
    utc_now_iso,
)
from fsspec_kbs.store.names import (
    backup_id_of,
    partition_dir,
    segment_name,
)
from fsspec_kbs.store.open import open_backup
from fsspec_kbs.store.segment_ref import SegmentRef
from fsspec_kbs.store.txn import Move, Transaction, json_of


@dataclass
class PartitionRetention:
    topic: str
    partition: int
    segments_in: int = 0
    segments_dropped_by_age: int = 0
    segments_dropped_by_size: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    records_out: int = 0
    first_offset: int | None = None

    @property
    def segments_out(self) -> int:
        return self.segments_in - self.segments_dropped_by_age - self.segments_dropped_by_size

    def to_dict(self) -> dict:
        return {**self.__dict__, "segments_out": self.segments_out}


@dataclass
class RetentionReport:
    source: str
    target: str
    max_age_ms: int | None
    max_bytes: int | None
    reference_time: int | None
    partitions: list[PartitionRetention] = field(default_factory=list)

    @property
    def segments_dropped(self) -> int:
        return sum(p.segments_dropped_by_age + p.segments_dropped_by_size for p in self.partitions)

    def to_dict(self) -> dict:
        return {"source": self.source, "target": self.target, "max_age_ms": self.max_age_ms,
                "max_bytes": self.max_bytes, "reference_time": self.reference_time,
                "segments_dropped": self.segments_dropped, "partitions": [p.to_dict() for p in self.partitions]}


def plan_retention(sizes: list[int], max_timestamps: list[int | None], max_age_ms: int | None,
                   max_bytes: int | None, reference_time: int | None) -> tuple[int, int]:
    """How many leading segments time retention drops, then how many more size retention drops."""
    by_age = 0
    if max_age_ms is not None and reference_time is not None:
        for ts in max_timestamps:
            # A segment without records (no timestamp) has nothing to keep.
            if ts is None or reference_time - ts > max_age_ms:
                by_age += 1
            else:
                break
    by_size = 0
    if max_bytes is not None:
        excess = sum(sizes[by_age:]) - max_bytes
        for size in sizes[by_age:]:
            if excess - size >= 0:
                excess -= size
                by_size += 1
            else:
                break
    return by_age, by_size


def _segment_max_ts(backup: KbsBackup, ref: SegmentRef) -> int | None:
    if ref.max_timestamp is not None or ref.records == 0:
        return ref.max_timestamp
    # A 1.0 manifest has no per-segment timestamps: read them from the data.
    stamps = [int(c.timestamps.max()) for c in backup.iter_columns(ref) if len(c)]
    return max(stamps) if stamps else None


def retain_backup(
    url: str, to_url: str, *, storage_options: dict | None = None, to_storage_options: dict | None = None,
    max_age: Any = None, max_bytes: Any = None, now: Any = None, overwrite: bool = False,
) -> RetentionReport:
    """Copy the backup at ``url`` to ``to_url`` without the leading segments retention drops.

    Parameters
    ----------
    url, to_url : str
        Source backup and the new backup directory (must differ).
    storage_options, to_storage_options : dict, optional
        fsspec options for each side.
    max_age : int (ms), str (``"7d"``) or timedelta, optional
        Kafka's ``retention.ms``.
    max_bytes : int or str (``"10GiB"``), optional
        Kafka's ``retention.bytes``, per partition, counted in segment file bytes.
    now : int (ms), ISO-8601 str or datetime, optional
        Reference time for ``max_age``; defaults to the backup's latest timestamp.
    overwrite : bool, default False
        Replace a backup already at ``to_url``.

    Raises
    ------
    CommitConflictError
        A backup exists at ``to_url`` and ``overwrite`` is False.
    """
    age = None if max_age is None else parse_duration(max_age)
    size_cap = None if max_bytes is None else parse_size(max_bytes)
    if age is None and size_cap is None:
        raise ValueError("give max_age and/or max_bytes")
    backup = _open_source(url, storage_options)
    fs, path, backup_id = _target(backup, to_url, to_storage_options)
    txn = Transaction(fs, path, to_url, "overwrite" if overwrite else "error")

    segments = backup.segments()
    ref_time = _reference_time(backup, segments, now)
    report = RetentionReport(url, to_url, age, size_cap, ref_time)
    groups: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in segments:
        groups.setdefault((ref.topic, ref.partition), []).append(ref)
    topics: dict[str, list[PartitionEntry]] = {}
    copy = _Copy(backup, fs, path, txn)
    try:
        for (topic, partition), refs in sorted(groups.items()):
            pr = PartitionRetention(topic, partition, len(refs))
            report.partitions.append(pr)
            entries = _retain_partition(copy, refs, pr, age, size_cap, ref_time)
            if entries:
                topics.setdefault(topic, []).append(PartitionEntry(
                    partition, entries[0].first_offset, entries[-1].last_offset,
                    sum(e.records for e in entries), len(entries), entries))
        manifest = json_of(_manifest(backup, backup_id, topics, copy.uncompressed, report))
        txn.commit(lambda state: (manifest, copy.moves))
    except BaseException:
        txn.abort()  # only this run's staging; a claimed commit keeps it for the roll forward
        raise
    return report


def _open_source(url: str, storage_options: dict | None) -> KbsBackup:
    """The complete KBS backup at ``url``: retain copies its segment files unchanged."""
    backup = open_backup(url, storage_options)
    if not isinstance(backup, KbsBackup):
        raise UnsupportedLayoutError(f"{url} is a {backup.layout} backup; retain copies KBS segment files unchanged, so convert "
                       "it first (kbs convert SRC DST --layout kbs)")
    if backup.manifest is None:  # pragma: no cover - open_backup refuses incomplete backups
        raise IncompleteBackupError(f"{url} has no manifest")
    return backup


def _target(backup: KbsBackup, to_url: str, to_storage_options: dict | None,
            ) -> tuple[fsspec.AbstractFileSystem, str, str]:
    """The new backup's filesystem, path and id; it must not be the source."""
    fs, path = url_to_fs(to_url, **(to_storage_options or {}))
    path = path.rstrip("/")
    backup_id = backup_id_of(path)
    if type(fs) is type(backup.fs) and fs._strip_protocol(path) == backup.fs._strip_protocol(backup.path):
        raise ValueError("retain writes a new backup: --to must differ from the source")
    return fs, path, backup_id


def _reference_time(backup: KbsBackup, segments: list[SegmentRef], now: Any) -> int | None:
    """``now`` in ms when given, else the backup's latest timestamp (manifest, else segments)."""
    ref_time = to_millis(now)
    if ref_time is None:
        assert backup.manifest is not None
        stamps = [s.max_timestamp for s in segments if s.max_timestamp is not None]
        ref_time = backup.manifest.time_range.get("latest_timestamp") or (max(stamps) if stamps else None)
    return ref_time


def _retain_partition(copy: _Copy, refs: list[SegmentRef], pr: PartitionRetention, age: int | None,
                      size_cap: int | None, ref_time: int | None) -> list[SegmentEntry]:
    """Stage the segments of one partition that retention keeps (counted in ``pr``); their entries."""
    backup = copy.backup
    sizes = [r.size_bytes if r.size_bytes is not None else backup.fs.size(r.path) for r in refs]
    pr.bytes_in = sum(sizes)
    max_ts = [_segment_max_ts(backup, r) for r in refs] if age is not None else [None] * len(refs)
    by_age, by_size = plan_retention(sizes, max_ts, age, size_cap, ref_time)
    pr.segments_dropped_by_age, pr.segments_dropped_by_size = by_age, by_size
    entries = [copy.segment(ref, seq) for seq, ref in enumerate(refs[by_age + by_size :])]
    if entries:
        pr.first_offset = entries[0].first_offset
    pr.bytes_out = sum(e.size_bytes for e in entries)
    pr.records_out = sum(e.records for e in entries)
    return entries


class _Copy:
    """Kept segments, each read whole and checked, staged unchanged with a rebuilt batch index."""

    def __init__(self, backup: KbsBackup, fs: fsspec.AbstractFileSystem, path: str, txn: Transaction) -> None:
        self.backup, self.fs, self.path, self.txn = backup, fs, path, txn
        self.moves: list[Move] = []
        self.uncompressed = 0

    def segment(self, ref: SegmentRef, seq: int) -> SegmentEntry:
        """Stage ``ref`` as segment ``seq`` of its partition; its manifest entry."""
        txn, topic, partition = self.txn, ref.topic, ref.partition
        # Checked against the source manifest: a replaced segment stops the run, never lands
        # in a clean-looking copy.
        reader, stamps, entry = self.backup.read_whole_checked(ref)
        data = reader.data
        self.uncompressed += sum(b.uncompressed_size for b in reader.batches())
        staged = f"{partition_dir(txn.staging, topic, partition)}/{segment_name(seq)}"
        put_file(self.fs, staged, data)
        final = f"{partition_dir(self.path, topic, partition)}/{segment_name(seq)}"
        self.moves.append(Move(txn.relative(staged), txn.relative(final), len(data), reader.header.checksum))
        # The batch index (kbs-format.md §7) is rebuilt from the segment, which is read whole and
        # checked anyway: a damaged or missing source index is not carried over.
        index = encode_index(stamps)
        put_file(self.fs, index_path(staged), index)
        self.moves.append(Move(txn.relative(index_path(staged)), txn.relative(index_path(final)), len(index),
                               crc32=crc32(index)))
        return replace(entry, file=segment_name(seq), index_crc32=crc32(index))


def _manifest(backup: KbsBackup, backup_id: str, topics: dict[str, list[PartitionEntry]], uncompressed: int,
              report: RetentionReport) -> Manifest:
    src = backup.manifest
    assert src is not None
    statistics, time_range = summarize(topics, uncompressed)
    topic_extra = {t.name: t.extra for t in src.topics}
    return Manifest(
        version=WRITE_VERSION,
        backup_id=backup_id,
        created_at=src.created_at,
        completed_at=utc_now_iso(),
        source_cluster=src.source_cluster,
        compression=dict(src.compression),
        statistics=statistics,
        time_range=time_range,
        topics=[TopicEntry(name, parts, extra=dict(topic_extra.get(name, {}))) for name, parts in sorted(topics.items())],
        extra={**src.extra, "retention": report.to_dict()},
    )
