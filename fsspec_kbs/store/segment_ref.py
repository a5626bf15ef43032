"""What a backup's listing says of each segment (:class:`SegmentRef`), whatever its layout,
and the checks of a listing and of a segment file against it."""

from __future__ import annotations

from dataclasses import dataclass

from fsspec_kbs.errors import BackupNotFoundError, SegmentMismatchError, TruncatedSegmentError


@dataclass(frozen=True)
class SegmentRef:
    """One segment of a backup, with what is known about it before opening it.

    Fields that are unknown (a 1.0 manifest has no timestamps) are None. ``path`` is a path
    on the backup's filesystem, never a filesystem object, so refs pickle cheaply.
    """

    topic: str
    partition: int
    seq: int
    path: str
    first_offset: int | None = None
    last_offset: int | None = None
    records: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    size_bytes: int | None = None
    crc64: int | None = None
    codec: str | None = None
    layout: str = "kbs"
    #: ``min_timestamp``/``max_timestamp`` were checked against data (a batch index) and may
    #: prune: a manifest's claim alone never drops a segment from a time-filtered read.
    time_checked: bool = False
    #: The manifest's CRC-32 of the segment's batch index (1.2); None: no index to use.
    index_crc32: int | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def may_contain(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> bool:
        """False only if the segment certainly holds no record in the bounds (end exclusive)."""
        if start_offset is not None and self.last_offset is not None and self.last_offset < start_offset:
            return False
        if end_offset is not None and self.first_offset is not None and self.first_offset >= end_offset:
            return False
        if not self.time_checked:
            return True
        if start_time is not None and self.max_timestamp is not None and self.max_timestamp < start_time:
            return False
        return not (end_time is not None and self.min_timestamp is not None and self.min_timestamp >= end_time)


#: Start and end offset, start and end time of a read (end exclusive; None: unbounded).
Bounds = tuple[int | None, int | None, int | None, int | None]


def segment_missing(ref: SegmentRef, error: OSError | None = None) -> BackupNotFoundError:
    """The error for a segment the manifest lists but the store does not have as a file."""
    if isinstance(error, IsADirectoryError):
        return BackupNotFoundError(f"segment {ref.path} listed in the manifest is a directory, not a file")
    return BackupNotFoundError(f"segment {ref.path} listed in the manifest is missing")


def check_size(ref: SegmentRef, size: int) -> None:
    """Compare a segment file's size with what the manifest says of it."""
    if ref.size_bytes is None or size == ref.size_bytes:
        return
    if size < ref.size_bytes:
        raise TruncatedSegmentError(
            f"file is {size} bytes but the manifest says {ref.size_bytes}: the last "
            f"{ref.size_bytes - size} bytes are missing (truncated segment)", ref.path, size)
    raise SegmentMismatchError(
        f"file is {size} bytes but the manifest says {ref.size_bytes}", ref.path, ref.size_bytes)


def check_order(refs: list[SegmentRef]) -> list[SegmentRef]:
    """``refs`` (sorted), after checking that each partition's segments hold increasing,
    non-overlapping offset ranges in sequence order (§1), where their ranges are known."""
    for prev, ref in zip(refs, refs[1:], strict=False):
        if ((prev.topic, prev.partition) == (ref.topic, ref.partition) and prev.last_offset is not None
                and ref.first_offset is not None and ref.first_offset <= prev.last_offset):
            raise SegmentMismatchError(
                f"first offset {ref.first_offset} is not above the previous segment's last offset "
                f"{prev.last_offset} ({prev.name}): segments overlap or are out of order", ref.path, 8)
    return refs
