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
    "Backup": "fsspec_kbs.store",
    "BackupNotFoundError": "fsspec_kbs.errors",
    "BackupWriter": "fsspec_kbs.store",
    "ChecksumError": "fsspec_kbs.errors",
    "CommitConflictError": "fsspec_kbs.errors",
    "IncompleteBackupError": "fsspec_kbs.errors",
    "InvalidNameError": "fsspec_kbs.errors",
    "KAFKA_SCHEMA": "fsspec_kbs.arrow.schema",
    "KAFKA_VIEW_SCHEMA": "fsspec_kbs.arrow.schema",
    "KbsBackup": "fsspec_kbs.store",
    "KbsDataset": "fsspec_kbs.dataset",
    "KbsError": "fsspec_kbs.errors",
    "KbsScanner": "fsspec_kbs.dataset",
    "Manifest": "fsspec_kbs.store",
    "ManifestError": "fsspec_kbs.errors",
    "NoMatchWarning": "fsspec_kbs.api",
    "OsoBackup": "fsspec_kbs.store.oso_backup",
    "ScanFilter": "fsspec_kbs.filters",
    "SegmentFormatError": "fsspec_kbs.errors",
    "SegmentRef": "fsspec_kbs.store",
    "UnsupportedVersionError": "fsspec_kbs.errors",
    "add_indexes": "fsspec_kbs.maintenance.index",
    "compact_backup": "fsspec_kbs.maintenance.compact",
    "convert_backup": "fsspec_kbs.maintenance.convert",
    "import_log": "fsspec_kbs.kafka_log",
    "list_backups": "fsspec_kbs.store",
    "open_backup": "fsspec_kbs.store",
    "open_kafka_log_reader": "fsspec_kbs.kafka_log",
    "open_reader": "fsspec_kbs.api",
    "read_kafka_log": "fsspec_kbs.kafka_log",
    "read_pandas": "fsspec_kbs.api",
    "read_table": "fsspec_kbs.api",
    "retain_backup": "fsspec_kbs.maintenance.retain",
    "write_batches": "fsspec_kbs.api",
    "write_table": "fsspec_kbs.api",
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
