"""Check a backup: quick (manifest, headers, footers, sizes) or deep (every CRC and record)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from fsspec_kbs.arrow.convert import check_header_keys
from fsspec_kbs.errors import KbsError, SegmentMismatchError
from fsspec_kbs.store import SegmentRef, open_backup


@dataclass
class Defect:
    path: str
    message: str
    error: str  # exception class name


@dataclass
class ValidationReport:
    url: str
    deep: bool
    segments_checked: int = 0
    records_checked: int = 0
    bytes_checked: int = 0
    defects: list[Defect] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.defects

    def add(self, path: str, error: Exception) -> None:
        self.defects.append(Defect(path, str(error), type(error).__name__))


def _check_partition_order(refs: list[SegmentRef], report: ValidationReport) -> None:
    prev: SegmentRef | None = None
    for ref in refs:
        if prev is not None and (prev.topic, prev.partition) == (ref.topic, ref.partition):
            if ref.seq != prev.seq + 1:
                report.add(ref.path, SegmentMismatchError(f"segment sequence jumps from {prev.seq} to {ref.seq}", ref.path))
            if (ref.first_offset is not None and prev.last_offset is not None
                    and ref.first_offset <= prev.last_offset):
                report.add(ref.path, SegmentMismatchError(
                    f"first offset {ref.first_offset} overlaps the previous segment (last offset {prev.last_offset})",
                    ref.path, 8))
        elif ref.seq != 0:
            report.add(ref.path, SegmentMismatchError("a partition's segments must start at sequence 0", ref.path))
        prev = ref


def validate_backup(
    url: str,
    storage_options: dict | None = None,
    deep: bool = False,
    allow_incomplete: bool = False,
    progress: Callable[[SegmentRef], None] | None = None,
) -> ValidationReport:
    """Check every segment of a backup and collect every defect (does not stop at the first).

    Quick: manifest, names, segment sizes, headers and footers against the manifest.
    Deep: also every CRC-64 and CRC-32, and every record decoded.
    """
    report = ValidationReport(url, deep)
    try:
        backup = open_backup(url, storage_options, allow_incomplete=allow_incomplete)
        refs = backup.segments()
    except (KbsError, FileNotFoundError) as e:
        report.add(url, e)
        return report
    _check_partition_order(refs, report)
    for defect in backup.manifest_defects(refs):
        report.add(url, defect)
    for ref in refs:
        try:
            backup.validate_segment(ref, deep, report, partial(check_header_keys, path=ref.path))
            report.bytes_checked += ref.size_bytes or 0
        except (KbsError, FileNotFoundError) as e:
            report.add(ref.path, e)
        report.segments_checked += 1
        if progress is not None:
            progress(ref)
    if deep and report.ok:
        try:
            backup.check_totals()
        except KbsError as e:
            report.add(url, e)
    return report
