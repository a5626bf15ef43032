"""Kafka log compaction applied to a backup: the latest record per key, per partition.

Semantics (docs/compaction-retention.md):

* Within each partition, a record is kept when no later record (higher offset) has the same key.
* Records with a null key cannot be compacted (a compacted Kafka topic rejects them); they are
  all kept and counted in the report, with a warning.
* A tombstone (the latest record of its key, with a null value) is kept unless
  ``delete_retention`` is given and the tombstone's timestamp is more than ``delete_retention``
  before the partition's largest timestamp. Kafka measures ``delete.retention.ms`` from when the
  cleaner last passed over the tombstone's segment (wall-clock); a backup has no such time, so
  the partition's own newest record is the clock. The result does not depend on when you run it.
* Offsets, timestamps, keys, values and headers of kept records are unchanged: offsets keep
  their gaps, as on a compacted Kafka topic.

The work is two passes over each partition: the first reads only keys, offsets, timestamps and
whether the value is null (memory: the partition's keys), the second copies the kept records.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from fsspec_kbs.arrow.convert import batch_to_columns, columns_to_batch
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.codecs import CODEC_BY_NAME
from fsspec_kbs.maintenance.units import parse_duration
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.commit import STREAMS_FIELD
from fsspec_kbs.store.layout import Backup
from fsspec_kbs.store.manifest import Manifest
from fsspec_kbs.store.open import open_backup
from fsspec_kbs.store.segment_ref import SegmentRef
from fsspec_kbs.store.txn import WriteMode
from fsspec_kbs.store.writer import BackupWriter

log = logging.getLogger(__name__)


class CompactionWarning(UserWarning):
    """Records that compaction cannot handle (null keys) were kept as they are."""


@dataclass
class PartitionCompaction:
    topic: str
    partition: int
    records_in: int = 0
    records_out: int = 0
    superseded: int = 0
    tombstones_removed: int = 0
    null_key_records: int = 0
    max_timestamp: int | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class CompactionReport:
    source: str
    target: str
    delete_retention_ms: int | None
    partitions: list[PartitionCompaction] = field(default_factory=list)

    @property
    def records_in(self) -> int:
        return sum(p.records_in for p in self.partitions)

    @property
    def records_out(self) -> int:
        return sum(p.records_out for p in self.partitions)

    def to_dict(self) -> dict:
        return {"source": self.source, "target": self.target, "delete_retention_ms": self.delete_retention_ms,
                "records_in": self.records_in, "records_out": self.records_out,
                "partitions": [p.to_dict() for p in self.partitions]}


def keep_mask(keys: pa.Array, offsets: np.ndarray, timestamps: np.ndarray, tombstone: np.ndarray,
              delete_retention_ms: int | None) -> tuple[np.ndarray, dict[str, int]]:
    """Which records of one partition compaction keeps (all inputs in the same row order).

    Returns the mask and counts (``superseded``, ``tombstones_removed``, ``null_key_records``).
    """
    n = len(offsets)
    keep = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return keep, {"superseded": 0, "tombstones_removed": 0, "null_key_records": 0}
    valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    null_keys = int(n - valid.sum())
    keep[~valid] = True
    rows = np.flatnonzero(valid)
    if len(rows):
        t = pa.table({"key": keys.take(pa.array(rows)), "offset": pa.array(offsets[rows])})
        latest = t.group_by("key", use_threads=False).aggregate([("offset", "max")]).column("offset_max")
        keep[rows[np.isin(offsets[rows], latest.to_numpy())]] = True
    superseded = int(n - keep.sum())
    removed = 0
    if delete_retention_ms is not None:
        horizon = int(timestamps.max()) - delete_retention_ms
        expired = keep & valid & tombstone & (timestamps < horizon)
        removed = int(expired.sum())
        keep &= ~expired
    return keep, {"superseded": superseded, "tombstones_removed": removed, "null_key_records": null_keys}


def _filter_columns(cols: RecordColumns, mask: np.ndarray, topic: str, partition: int) -> RecordColumns:
    batch = columns_to_batch(cols, topic, partition, ["key", "value", "headers"]).filter(pa.array(mask))
    return batch_to_columns(batch, np.ascontiguousarray(cols.offsets[mask]),
                            np.ascontiguousarray(cols.timestamps[mask]))


def compact_backup(
    url: str,
    to_url: str,
    *,
    storage_options: dict | None = None,
    to_storage_options: dict | None = None,
    delete_retention: Any = None,
    compression: str | None = None,
    mode: WriteMode = "error",
    verify_checksums: bool = True,
    **writer_options: Any,
) -> CompactionReport:
    """Write a compacted copy of the backup at ``url`` to ``to_url``.

    Parameters
    ----------
    url, to_url : str
        Source backup and the new backup directory (any fsspec URLs; must differ).
    storage_options, to_storage_options : dict, optional
        fsspec options for each side.
    delete_retention : int (ms), str (``"1d"``) or timedelta, optional
        Drop tombstones older than this, measured back from the partition's largest timestamp.
        None (default) keeps every tombstone that is the latest record of its key.
    compression : str, optional
        Codec of the new backup; defaults to the source's.
    mode : str, default "error"
        :class:`~fsspec_kbs.store.BackupWriter` mode for ``to_url``.

    Returns
    -------
    CompactionReport

    Warns
    -----
    CompactionWarning
        A partition holds records with a null key (kept, since they cannot be compacted).
    """
    retention = None if delete_retention is None else parse_duration(delete_retention)
    backup = open_backup(url, storage_options)  # either layout (KBS or oso-native); writes KBS
    # What a KBS source's manifest says is kept (codec, cluster, streaming sinks' records).
    kbs_manifest = backup.manifest if isinstance(backup, KbsBackup) else None
    if compression is None:
        compression = _source_codec(backup)
    report = CompactionReport(url, to_url, retention)
    writer = BackupWriter(to_url, to_storage_options, compression=compression, mode=mode,
                          source_cluster=kbs_manifest.source_cluster if kbs_manifest is not None else None,
                          **writer_options)
    try:
        for (topic, partition), part_refs in _by_partition(backup.segments()):
            report.partitions.append(_compact_partition(backup, writer, topic, partition, part_refs, retention,
                                                        verify_checksums))
        writer.commit(extra=_manifest_extra(report, kbs_manifest))
    except BaseException:
        writer.abort()
        raise
    return report


def _source_codec(backup: Backup) -> str:
    """A KBS source's codec; else the one codec of all its segments, if the KBS layout has it."""
    codecs = {r.codec for r in backup.segments()}  # listed and checked before anything is written
    if isinstance(backup, KbsBackup) and backup.manifest is not None:
        return backup.manifest.compression.get("algorithm")
    return codecs.pop() if len(codecs) == 1 and codecs <= set(CODEC_BY_NAME) else "zstd"


def _by_partition(refs: list[SegmentRef]) -> list[tuple[tuple[str, int], list[SegmentRef]]]:
    """``refs`` grouped by (topic, partition), in that order."""
    groups: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in refs:
        groups.setdefault((ref.topic, ref.partition), []).append(ref)
    return sorted(groups.items())


def _manifest_extra(report: CompactionReport, kbs_manifest: Manifest | None) -> dict[str, Any]:
    """The new manifest's ``compaction`` report, and a KBS source's streaming sinks' records."""
    extra: dict[str, Any] = {"compaction": {"source": report.source, "delete_retention_ms": report.delete_retention_ms,
                                            "partitions": [p.to_dict() for p in report.partitions]}}
    # Streaming sinks' batch records stay valid (offsets are kept): a compacted backup put in
    # place of the source still tells a replayed micro-batch from a new one.
    streams = kbs_manifest.extra.get(STREAMS_FIELD) if kbs_manifest is not None else None
    if streams:
        extra[STREAMS_FIELD] = streams
    return extra


def _compact_partition(backup: Backup, writer: BackupWriter, topic: str, partition: int,
                       refs: list[SegmentRef], retention: int | None, verify: bool) -> PartitionCompaction:
    stats = PartitionCompaction(topic, partition)
    keys, offsets, stamps, tombs = [], [], [], []
    for ref in refs:
        for cols in backup.iter_columns(ref, verify):
            keys.append(columns_to_batch(cols, topic, partition, ["key"]).column(0))
            offsets.append(cols.offsets.copy())
            stamps.append(cols.timestamps.copy())
            tombs.append(~cols.value_valid)
    if not offsets:
        return stats
    all_offsets = np.concatenate(offsets)
    all_stamps = np.concatenate(stamps)
    mask, counts = keep_mask(pa.concat_arrays(keys) if keys else pa.array([], pa.binary()), all_offsets,
                             all_stamps, np.concatenate(tombs), retention)
    del keys, stamps, tombs
    stats.records_in = len(all_offsets)
    stats.max_timestamp = int(all_stamps.max())
    for name, value in counts.items():
        setattr(stats, name, value)
    if stats.null_key_records:
        message = (f"{topic}/{partition}: {stats.null_key_records} record(s) with a null key cannot be compacted; "
                   "they are kept")
        log.warning(message)
        warnings.warn(message, CompactionWarning, stacklevel=4)
    kept = np.sort(all_offsets[mask])
    for ref in refs:
        for cols in backup.iter_columns(ref, verify):
            sel = np.isin(cols.offsets, kept, assume_unique=True)
            if sel.all():
                out = cols
            elif not sel.any():
                continue
            else:
                out = _filter_columns(cols, sel, topic, partition)
            writer.write_columns(topic, partition, out)
            stats.records_out += len(out)
    return stats
