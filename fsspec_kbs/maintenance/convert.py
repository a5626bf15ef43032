"""Convert a backup between the KBS layout and the OSO kafka-backup tool's layout ("oso-native").

Streaming: segments are read one at a time and written as they fill, so memory stays bounded
by one segment per partition. Lossless for everything a Kafka record holds here: keys, values
(null or not), headers (null header values included), timestamps and offsets.

The oso-native side is written by :class:`fsspec_kbs.store.oso_writer.OsoBackupWriter`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsspec.utils import get_protocol

from fsspec_kbs.arrow.convert import check_header_keys
from fsspec_kbs.store import Backup, BackupWriter, SegmentRef, open_backup
from fsspec_kbs.store.oso_writer import OSO_SEGMENT_MAX_BYTES, OsoBackupWriter

LAYOUTS = ("kbs", "oso")


@dataclass
class ConvertProgress:
    """Passed to the progress callback after each source segment."""

    segments_total: int
    segments_done: int = 0
    records: int = 0
    bytes_read: int = 0
    segment: SegmentRef | None = None


@dataclass
class ConvertResult:
    src_url: str
    dst_url: str
    to: str
    segments_read: int = 0
    segments_written: int = 0
    records: int = 0
    seconds: float = 0.0
    manifest: Any = None


def _source_codec(src: Backup) -> str:
    refs = src.segments()
    return (refs[0].codec if refs and refs[0].codec else None) or "zstd"


def _oso_writer(src: Backup, dst_url: str, dst_storage_options: dict | None, *, compression: str,
                level: int | None, segment_max_bytes: int | None, segment_max_records: int | None,
                overwrite: bool) -> OsoBackupWriter:
    """The OSO-layout writer, carrying the source's creation time and cluster over."""
    origin = src.origin()
    return OsoBackupWriter(dst_url, dst_storage_options, compression=compression, level=level,
                           segment_max_bytes=segment_max_bytes or OSO_SEGMENT_MAX_BYTES,
                           segment_max_records=segment_max_records, overwrite=overwrite,
                           created_at=origin.created_at_ms, source_cluster_id=origin.cluster_id,
                           source_brokers=origin.brokers)


def _kbs_writer(src: Backup, dst_url: str, dst_storage_options: dict | None, *, compression: str,
                level: int | None, segment_max_bytes: int | None, segment_max_records: int | None,
                overwrite: bool) -> BackupWriter:
    """The KBS writer, carrying the source's creation time and cluster over."""
    origin = src.origin()
    kwargs: dict[str, Any] = {} if segment_max_bytes is None else {"segment_max_bytes": segment_max_bytes}
    writer = BackupWriter(dst_url, dst_storage_options, compression=compression, level=level,
                          segment_max_records=segment_max_records, mode="overwrite" if overwrite else "error",
                          source_cluster=origin.source_cluster, **kwargs)
    if origin.created_at is not None:
        writer.created_at = origin.created_at
    return writer


def _copy(src: Backup, refs: list[SegmentRef], writer: BackupWriter | OsoBackupWriter, *, flush_partitions: bool,
          verify_checksums: bool, progress: Callable[[ConvertProgress], None] | None) -> ConvertProgress:
    """Every record of ``refs``, read and checked, into ``writer`` (not committed)."""
    state = ConvertProgress(segments_total=len(refs))
    prev: tuple[str, int] | None = None
    for ref in refs:
        if flush_partitions and prev is not None and prev != (ref.topic, ref.partition):
            writer.flush_partition(*prev)  # type: ignore[union-attr]  # bound memory: one partition at a time
        prev = (ref.topic, ref.partition)
        for cols in src.iter_columns(ref, verify_checksums=verify_checksums):
            check_header_keys(cols, ref.path)  # what a reader of the copy checks, before writing it
            writer.write_columns(ref.topic, ref.partition, cols)
            state.records += len(cols)
        state.segments_done += 1
        state.bytes_read += ref.size_bytes or 0
        state.segment = ref
        if progress is not None:
            progress(state)
    return state


def convert_backup(
    src_url: str, dst_url: str, to: str = "kbs", *,
    storage_options: dict | None = None, dst_storage_options: dict | None = None,
    compression: str | None = None, level: int | None = None,
    segment_max_bytes: int | None = None, segment_max_records: int | None = None,
    overwrite: bool = False, verify_checksums: bool = True, allow_incomplete: bool = False,
    progress: Callable[[ConvertProgress], None] | None = None,
) -> ConvertResult:
    """Convert the backup at ``src_url`` (either layout, detected) into ``dst_url`` in layout ``to``.

    Parameters
    ----------
    src_url, dst_url : str
        Backup directories (``<root>/<backup_id>``) on any fsspec URLs.
    to : {"kbs", "oso"}
        Layout to write: the published KBS layout, or the OSO kafka-backup tool's own.
    storage_options, dst_storage_options : dict, optional
        fsspec options for the source and the destination (the destination defaults to the
        source's when both URLs use the same protocol).
    compression : {"zstd", "lz4", "none"}, optional
        Codec of the output; default: the source's. ``level``: its level.
    segment_max_bytes, segment_max_records : int, optional
        Segment rolling of the output (defaults: KBS 64 MiB compressed; oso 128 MiB of records).
    overwrite : bool, default False
        Replace a backup already at ``dst_url``.
    verify_checksums : bool, default True
        Check the source's checksums while reading.
    allow_incomplete : bool, default False
        Convert a source backup without manifest.
    progress : callable, optional
        Called with a :class:`ConvertProgress` after each source segment.

    Returns
    -------
    ConvertResult

    Raises
    ------
    CommitConflictError
        ``dst_url`` holds a backup and ``overwrite`` is False.
    KbsError
        Any defect of the source (the destination then gets no manifest: it is not published).
    """
    if to not in LAYOUTS:
        raise ValueError(f"to must be one of {LAYOUTS}, got {to!r}")
    started = time.monotonic()
    src = open_backup(src_url, storage_options, allow_incomplete=allow_incomplete)
    refs = src.segments()  # listed and checked before anything is written
    dst_options = dst_storage_options
    if dst_options is None and get_protocol(src_url) == get_protocol(dst_url):
        dst_options = storage_options
    writer = _writer(src, to, dst_url, dst_options, compression=compression or _source_codec(src),
                     level=level, segment_max_bytes=segment_max_bytes, segment_max_records=segment_max_records,
                     overwrite=overwrite)
    result = _run(src, refs, writer, ConvertResult(src_url, dst_url, to), verify_checksums, progress)
    result.seconds = time.monotonic() - started
    return result


def _writer(src: Backup, to: str, dst_url: str, dst_storage_options: dict | None,
            **options: Any) -> BackupWriter | OsoBackupWriter:
    """The writer of layout ``to``, carrying the source's creation time and cluster over."""
    if to == "oso":
        return _oso_writer(src, dst_url, dst_storage_options, **options)
    return _kbs_writer(src, dst_url, dst_storage_options, **options)


def _run(src: Backup, refs: list[SegmentRef], writer: BackupWriter | OsoBackupWriter, result: ConvertResult,
         verify_checksums: bool, progress: Callable[[ConvertProgress], None] | None) -> ConvertResult:
    """Copy ``refs`` of ``src`` into ``writer`` and commit it; abort it on any error."""
    try:
        state = _copy(src, refs, writer, flush_partitions=result.to == "oso",
                      verify_checksums=verify_checksums, progress=progress)
        src.check_totals()  # the manifest's totals, as a reader of the source would check them
        result.manifest, result.segments_written = _commit(src, writer)
    except BaseException:
        writer.abort()
        raise
    result.segments_read = state.segments_done
    result.records = state.records
    return result


def _commit(src: Backup, writer: BackupWriter | OsoBackupWriter) -> tuple[Any, int]:
    """Publish the copy: its manifest and how many segments it has. A KBS copy keeps the
    fields of the source's manifest that it carries over (``Backup.copy_fields``)."""
    if isinstance(writer, OsoBackupWriter):
        return writer.commit(), writer.segments_written
    return writer.commit(extra=src.copy_fields() or None), len(writer.written_segments)
