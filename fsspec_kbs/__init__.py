"""fsspec-kbs: Kafka backups (KBS format) on any fsspec URL, as Arrow tables and pandas frames.

The names below load on first use (PEP 562): ``import fsspec_kbs`` stays cheap, which every
Spark Python worker and ``kbs --help`` pays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsspec_kbs.lazy import lazy_exports

if TYPE_CHECKING:
    from fsspec_kbs.api import (
        NoMatchWarning,
        open_reader,
        read_pandas,
        read_table,
        write_batches,
        write_table,
    )
    from fsspec_kbs.arrow.schema import KAFKA_SCHEMA, KAFKA_VIEW_SCHEMA
    from fsspec_kbs.dataset import KbsDataset, KbsScanner
    from fsspec_kbs.errors import (
        BackupNotFoundError,
        ChecksumError,
        CommitConflictError,
        IncompleteBackupError,
        InvalidNameError,
        KbsError,
        ManifestError,
        SegmentFormatError,
        UnsupportedVersionError,
    )
    from fsspec_kbs.filters import ScanFilter
    from fsspec_kbs.kafka_log import import_log, open_kafka_log_reader, read_kafka_log
    from fsspec_kbs.maintenance.compact import compact_backup
    from fsspec_kbs.maintenance.convert import convert_backup
    from fsspec_kbs.maintenance.index import add_indexes
    from fsspec_kbs.maintenance.retain import retain_backup
    from fsspec_kbs.store import (
        Backup,
        BackupWriter,
        KbsBackup,
        Manifest,
        SegmentRef,
        list_backups,
        open_backup,
    )
    from fsspec_kbs.store.oso_backup import OsoBackup

__version__ = "0.1.0"

#: Public name -> the module defining it.
_EXPORTS = {
    "api": ("NoMatchWarning", "open_reader", "read_pandas", "read_table", "write_batches", "write_table"),
    "arrow.schema": ("KAFKA_SCHEMA", "KAFKA_VIEW_SCHEMA"),
    "dataset": ("KbsDataset", "KbsScanner"),
    "errors": (
        "BackupNotFoundError",
        "ChecksumError",
        "CommitConflictError",
        "IncompleteBackupError",
        "InvalidNameError",
        "KbsError",
        "ManifestError",
        "SegmentFormatError",
        "UnsupportedVersionError",
    ),
    "filters": ("ScanFilter",),
    "kafka_log": ("import_log", "open_kafka_log_reader", "read_kafka_log"),
    "maintenance.compact": ("compact_backup",),
    "maintenance.convert": ("convert_backup",),
    "maintenance.index": ("add_indexes",),
    "maintenance.retain": ("retain_backup",),
    "store": ("Backup", "BackupWriter", "KbsBackup", "Manifest", "SegmentRef", "list_backups", "open_backup"),
    "store.oso_backup": ("OsoBackup",),
}


__all__ = [
    "KAFKA_SCHEMA",
    "KAFKA_VIEW_SCHEMA",
    "Backup",
    "BackupNotFoundError",
    "BackupWriter",
    "ChecksumError",
    "CommitConflictError",
    "IncompleteBackupError",
    "InvalidNameError",
    "KbsBackup",
    "KbsDataset",
    "KbsError",
    "KbsScanner",
    "Manifest",
    "ManifestError",
    "NoMatchWarning",
    "OsoBackup",
    "ScanFilter",
    "SegmentFormatError",
    "SegmentRef",
    "UnsupportedVersionError",
    "add_indexes",
    "compact_backup",
    "convert_backup",
    "import_log",
    "list_backups",
    "open_backup",
    "open_kafka_log_reader",
    "open_reader",
    "read_pandas",
    "read_kafka_log",
    "read_table",
    "retain_backup",
    "write_batches",
    "write_table",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
