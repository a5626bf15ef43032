"""Operations on whole backups: Kafka-style compaction and retention (docs/compaction-retention.md),
adding batch indexes to old backups. Names load on first use (:mod:`fsspec_kbs.lazy`)."""

from typing import TYPE_CHECKING

from fsspec_kbs.lazy import lazy_exports

if TYPE_CHECKING:
    from fsspec_kbs.maintenance.compact import (
        CompactionReport,
        CompactionWarning,
        compact_backup,
        keep_mask,
    )
    from fsspec_kbs.maintenance.index import IndexReport, add_indexes
    from fsspec_kbs.maintenance.retain import RetentionReport, plan_retention, retain_backup
    from fsspec_kbs.maintenance.units import parse_duration, parse_size

_EXPORTS = {
    "compact": ("CompactionReport", "CompactionWarning", "compact_backup", "keep_mask"),
    "index": ("IndexReport", "add_indexes"),
    "retain": ("RetentionReport", "plan_retention", "retain_backup"),
    "units": ("parse_duration", "parse_size"),
}

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

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
