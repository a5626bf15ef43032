"""Back up a live Kafka cluster into a KBS backup and restore a backup into a cluster.

Uses confluent-kafka (librdkafka). Backups are read only through :class:`fsspec_kbs.KbsDataset`,
so every layout :func:`fsspec_kbs.store.open_backup` detects can be restored.
"""

from fsspec_kbs.kafka.backup import (
    BackupResult,
    BackupRun,
    IncrementalGapWarning,
    run_backup,
)
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
