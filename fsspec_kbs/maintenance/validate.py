"""Check a backup: quick (manifest, headers, footers, sizes) or deep (every CRC and record)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from fsspec_kbs.arrow.convert import check_header_keys
from fsspec_kbs.errors import BatchIndexDamagedError, KbsError, SegmentMismatchError
from fsspec_kbs.format import FOOTER_SIZE, HEADER_SIZE, SegmentFooter, SegmentHeader
from fsspec_kbs.format.batch_index import verify_index
from fsspec_kbs.format.codecs import CODEC_NAMES
from fsspec_kbs.store import KbsBackup, SegmentRef, open_backup
from fsspec_kbs.store.backup import check_size
from fsspec_kbs.store.batch_index import index_path


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


def _quick_segment(backup: KbsBackup, ref: SegmentRef) -> None:
    fs = backup.fs
    size = fs.size(ref.path)
    check_size(ref, size)
    head = fs.cat_file(ref.path, start=0, end=HEADER_SIZE)
    h = SegmentHeader.parse(head, ref.path)
    foot = fs.cat_file(ref.path, start=max(0, size - FOOTER_SIZE), end=size)
    f = SegmentFooter.parse(b"\0" * HEADER_SIZE + foot if size >= HEADER_SIZE + FOOTER_SIZE else head[:size], ref.path)
    for what, mine, theirs, at in (("record count", h.record_count, ref.records, 16),
                                   ("first offset", h.first_offset, ref.first_offset, 8),
                                   ("CRC-64", h.checksum, ref.crc64, 24),
                                   ("last offset", f.last_offset, ref.last_offset, size - FOOTER_SIZE)):
        if theirs is not None and mine != theirs:
            raise SegmentMismatchError(f"{what} {mine} in the file but {theirs} in the manifest", ref.path, at)
    if ref.codec is not None and CODEC_NAMES[h.codec] != ref.codec:
        raise SegmentMismatchError(f"segment codec {h.codec.name.lower()} but the manifest says {ref.codec}", ref.path, 5)


#: Record data per decoded chunk in deep validation: with one batch at most 16 MiB, memory
#: stays at about one batch per decoding thread, whatever the batches claim.
DEEP_CHUNK_BYTES = 2 * 1024 * 1024


def _deep_segment(backup: KbsBackup, ref: SegmentRef, report: ValidationReport) -> None:
    # A matching CRC-64 covers every batch byte, but a writer may still have stored a wrong
    # CRC-32 under a right CRC-64: deep validation checks each batch's own checksum too.
    # Streamed or whole, every batch CRC-32 is checked as its batch is decoded.
    for cols in backup.iter_columns(ref, max_chunk_bytes=DEEP_CHUNK_BYTES):
        check_header_keys(cols, ref.path)
        report.records_checked += len(cols)
    index = backup.batch_index(ref)
    if index is not None:
        verify_index(index, backup.open_segment(ref))


def _check_index(backup: KbsBackup, ref: SegmentRef, report: ValidationReport) -> None:
    """A batch index the manifest names (1.2 ``index_crc32``) must be there and intact."""
    if ref.index_crc32 is None:
        return
    if backup.batch_index(ref) is None:
        report.add(ref.path, BatchIndexDamagedError(
            f"batch index not usable ({backup.index_problems.get(ref.path)}); reads fall back to the "
            "whole segment (`kbs index` rewrites it)", index_path(ref.path), None, ref.path, index_path(ref.path)))


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
    if backup.layout == "kbs" and backup.manifest is not None:
        stats = backup.manifest.statistics
        total = sum(r.records or 0 for r in refs)
        if stats.get("records") != total:
            report.add(url, SegmentMismatchError(
                f"manifest statistics say {stats.get('records')} records but its segments hold {total}", url))
        for t in backup.manifest.topics:
            for p in t.partitions:
                if p.segment_index is not None and p.records != sum(s.records for s in p.segment_index):
                    report.add(url, SegmentMismatchError(
                        f"{t.name}/{p.partition}: partition records {p.records} differ from its segment_index", url))
    check = getattr(backup, "validate_segment", None)
    for ref in refs:
        try:
            if check is not None:
                check(ref, deep, report, partial(check_header_keys, path=ref.path))
            else:
                _quick_segment(backup, ref)
                _check_index(backup, ref, report)
                if deep:
                    _deep_segment(backup, ref, report)
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
