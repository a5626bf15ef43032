"""fsspec-kbs: Kafka backups (KBS format) on any fsspec URL, as Arrow tables and pandas frames."""

from fsspec_kbs.api import (
    NoMatchWarning,
    open_reader,
    read_pandas,
    read_table,
    write_batches,
    write_table,
)
from fsspec_kbs.arrow.schema import KAFKA_SCHEMA, KAFKA_VIEW_SCHEMA
from fsspec_kbs.convert import convert_backup
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
from fsspec_kbs.store import (
    BackupWriter,
    KbsBackup,
    Manifest,
    SegmentRef,
    list_backups,
    open_backup,
)
from fsspec_kbs.store.oso_backup import OsoBackup
from fsspec_kbs.tools.compact import compact_backup
from fsspec_kbs.tools.index import add_indexes
from fsspec_kbs.tools.retain import retain_backup

__version__ = "0.1.0"

__all__ = [
    "KAFKA_SCHEMA",
    "KAFKA_VIEW_SCHEMA",
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
