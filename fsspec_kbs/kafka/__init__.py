"""Back up a live Kafka cluster into a KBS backup and restore a backup into a cluster.

Uses confluent-kafka (librdkafka). Backups are read only through :class:`fsspec_kbs.KbsDataset`,
so every layout :func:`fsspec_kbs.store.open_backup` detects can be restored.

The names below load on first use (PEP 562): a backup does not import the restore's reading
stack (pyarrow and the dataset), about 30 MB of resident memory it has no use for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsspec_kbs.lazy import lazy_exports

if TYPE_CHECKING:
    from fsspec_kbs.kafka.backup import BackupResult, BackupRun, IncrementalGapWarning, run_backup
    from fsspec_kbs.kafka.config import load_client_config, merge_client_config
    from fsspec_kbs.kafka.consume import BackupMemory
    from fsspec_kbs.kafka.groups import GROUPS_FILE, GroupOffsets, read_group_offsets
    from fsspec_kbs.kafka.produce import RestoreIncompleteError
    from fsspec_kbs.kafka.restore import (
        RestoreResult,
        RestoreRun,
        RetentionWarning,
        parse_offset_ranges,
        run_restore,
    )

_EXPORTS = {
    "backup": ("BackupResult", "BackupRun", "IncrementalGapWarning", "run_backup"),
    "config": ("load_client_config", "merge_client_config"),
    "consume": ("BackupMemory",),
    "groups": ("GROUPS_FILE", "GroupOffsets", "read_group_offsets"),
    "produce": ("RestoreIncompleteError",),
    "restore": ("RestoreResult", "RestoreRun", "RetentionWarning", "parse_offset_ranges", "run_restore"),
}

__all__ = [
    "GROUPS_FILE",
    "BackupMemory",
    "BackupResult",
    "BackupRun",
    "GroupOffsets",
    "IncrementalGapWarning",
    "RestoreIncompleteError",
    "RestoreResult",
    "RestoreRun",
    "RetentionWarning",
    "load_client_config",
    "merge_client_config",
    "parse_offset_ranges",
    "read_group_offsets",
    "run_backup",
    "run_restore",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
