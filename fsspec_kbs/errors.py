"""Exceptions raised by fsspec-kbs.

Every error derives from :class:`KbsError`; each also derives from the builtin a caller
would naturally catch (``ValueError`` for bad data, ``FileNotFoundError`` for missing data,
``FileExistsError`` for commit conflicts).
"""

from __future__ import annotations


class KbsError(Exception):
    """Root of every fsspec-kbs error."""


class InvalidNameError(KbsError, ValueError):
    """A topic, backup id, partition or segment name is not legal (e.g. path traversal)."""


class ManifestError(KbsError, ValueError):
    """``manifest.json`` is missing fields, malformed, or inconsistent."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class ManifestMismatchError(ManifestError):
    """The manifest contradicts what the backup's files hold (a file it does not list, counts
    or offsets its segments do not have)."""


class UnsupportedVersionError(ManifestError):
    """The manifest's major version (or a segment's version) is not one this reader knows."""


class BackupNotFoundError(KbsError, FileNotFoundError):
    """No backup (or no such topic/partition/segment) at the given location."""


class IncompleteBackupError(BackupNotFoundError):
    """The backup directory has no ``manifest.json``: the backup never completed."""


class SegmentFormatError(KbsError, ValueError):
    """A segment's bytes break the format; carries the file and the byte offset.

    Attributes
    ----------
    path : str or None
        The segment file.
    offset : int or None
        Byte offset in the file where the defect was found.
    """

    def __init__(self, message: str, path: str | None = None, offset: int | None = None) -> None:
        self.path = path
        self.offset = offset
        self.reason = message
        where = path or "<segment>"
        if offset is not None:
            where += f" at byte {offset}"
        super().__init__(f"{where}: {message}")

    def located(self, path: str, base: int = 0) -> SegmentFormatError:
        """Same error, re-anchored to ``path`` with the offset shifted by ``base``."""
        offset = base if self.offset is None else self.offset + base
        return type(self)(self.reason, path, offset)


class BadMagicError(SegmentFormatError):
    """The file does not start (or end) with the expected magic bytes."""


class UnsupportedCodecError(SegmentFormatError):
    """Unknown compression code in a segment header."""


class ChecksumError(SegmentFormatError):
    """A CRC-32 (batch) or CRC-64 (segment) does not match the data."""


class TruncatedSegmentError(SegmentFormatError):
    """The segment ends early: missing footer, batch or record bytes."""


class DecompressionError(SegmentFormatError):
    """A compressed frame is invalid or does not decompress to its declared size."""


class RecordFormatError(SegmentFormatError):
    """Records inside a decompressed batch are malformed."""


class SegmentMismatchError(SegmentFormatError):
    """Header, footer, batch and manifest fields disagree with each other."""


class CommitConflictError(KbsError, FileExistsError):
    """A backup already exists where a write wanted to create one."""


class OffsetOrderError(KbsError, ValueError):
    """Offsets written to a partition do not strictly increase."""


class BatchIndexError(SegmentMismatchError):
    """A batch index (kbs-format.md §7) disagrees with itself or with its segment.

    ``path`` and ``offset`` locate the defect (in the index file for its own structure, in the
    segment for a batch that disagrees with its entry); ``segment_path`` and ``index_path``
    name both files, and so does the message.
    """

    def __init__(self, message: str, path: str | None = None, offset: int | None = None,
                 segment_path: str | None = None, index_path: str | None = None) -> None:
        self.segment_path = segment_path
        self.index_path = index_path
        super().__init__(message, path, offset)
        self.reason = message
        self.args = (f"{self.args[0]} (segment {segment_path}, batch index {index_path})",)

    def located(self, path: str, base: int = 0) -> SegmentFormatError:
        offset = base if self.offset is None else self.offset + base
        return type(self)(self.reason, path, offset, self.segment_path, self.index_path)


class BatchIndexDamagedError(BatchIndexError):
    """A batch index that cannot be used: its CRC-32s do not match (damage) or its version is
    unknown. Readers read the segment without it; ``validate`` reports it."""


class CommitInProgressError(KbsError, RuntimeError):
    """A commit was claimed but is not yet published: in progress, or its writer died.

    ``kbs repair URL`` (or :func:`fsspec_kbs.store.txn.repair`) rolls it forward.
    """


class CommitError(KbsError, RuntimeError):
    """A commit record cannot be applied (a staged file it names is missing or damaged)."""


class UnsupportedStoreError(KbsError, NotImplementedError):
    """The filesystem offers no create-only (conditional) write, so commits could race."""


class UnsupportedLayoutError(KbsError, ValueError):
    """The operation needs a KBS backup; this one has another layout (e.g. the OSO tool's).
    ``kbs convert SRC DST --layout kbs`` makes a KBS copy."""


class IncompatibleWriteError(KbsError, ValueError):
    """A write that does not fit the backup it goes to (another codec for an append, ...)."""


class PartialWriteError(KbsError, RuntimeError):
    """A distributed write whose tasks did not all succeed (or that was aborted): nothing of it
    is published."""


class KafkaClusterError(KbsError, RuntimeError):
    """The Kafka cluster could not be reached or refused what a backup or restore asked of it
    (metadata, offsets, topics, consumer groups)."""


class KafkaOptionError(KbsError, ValueError):
    """A Kafka client setting or a backup/restore option that cannot be used as given
    (client config file, ``key=value`` pairs, topic patterns, ``--map``, offset ranges, ...)."""
