"""Backup layout on fsspec: manifest model, segment listing, reading, atomic writing."""

from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.checkpoint import Checkpoint, PartitionProgress
from fsspec_kbs.store.layout import Backup
from fsspec_kbs.store.manifest import Manifest, PartitionEntry, SegmentEntry, TopicEntry
from fsspec_kbs.store.open import BackupListing, list_backups, open_backup
from fsspec_kbs.store.segment_ref import SegmentRef
from fsspec_kbs.store.writer import BackupWriter, WrittenSegment

__all__ = [
    "Backup",
    "BackupListing",
    "BackupWriter",
    "Checkpoint",
    "KbsBackup",
    "Manifest",
    "PartitionEntry",
    "PartitionProgress",
    "SegmentEntry",
    "SegmentRef",
    "TopicEntry",
    "WrittenSegment",
    "list_backups",
    "open_backup",
]
