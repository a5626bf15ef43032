"""Operations on whole backups: Kafka-style compaction and retention (docs/compaction-retention.md),
adding batch indexes to old backups."""

from fsspec_kbs.maintenance.compact import (
    CompactionReport,
    CompactionWarning,
    compact_backup,
    keep_mask,
)
from fsspec_kbs.maintenance.index import IndexReport, add_indexes
from fsspec_kbs.maintenance.retain import RetentionReport, plan_retention, retain_backup
from fsspec_kbs.maintenance.units import parse_duration, parse_size

__all__ = [
    "CompactionReport",
    "CompactionWarning",
    "IndexReport",
    "RetentionReport",
    "add_indexes",
    "compact_backup",
    "keep_mask",
    "parse_duration",
    "parse_size",
    "plan_retention",
    "retain_backup",
]
