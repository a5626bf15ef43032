"""Reading runs of whole batches of a segment through its batch index (kbs-format.md §7).

Used by executors for a task's batch range and by the driver to find offsets by timestamp
(:func:`fsspec_kbs.spark.planning.first_offset_at`).
"""

from __future__ import annotations

from collections.abc import Iterator

from fsspec_kbs.errors import SegmentFormatError
from fsspec_kbs.format.batch_index import BatchIndex
from fsspec_kbs.format.codecs import CODEC_BY_NAME
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.store import KbsBackup, SegmentRef
from fsspec_kbs.store.batch_index import IndexedSource
from fsspec_kbs.store.opened import OpenedSegment, iter_opened

#: Stored bytes decoded per chunk on executors: batches of some 10k rows for PySpark's Arrow
#: path (a 32 MiB chunk made batches of ~100 MB that are slow to hand to the JVM).
CHUNK_BYTES = 4 * 1024 * 1024


def read_runs(backup: KbsBackup, ref: SegmentRef, index: BatchIndex, runs: list[tuple[int, int]],
              verify: bool = True) -> Iterator[RecordColumns | ViewColumns]:
    """The records of the batch ``runs`` of ``ref`` (ranged reads through its ``index``; the
    header checked against the ref's codec and CRC-64, every batch's CRC-32 and bounds); a
    format error is re-diagnosed on the whole segment, as :meth:`KbsBackup.iter_columns` does."""
    codec = CODEC_BY_NAME[ref.codec] if ref.codec is not None else None
    source = IndexedSource(backup.fs, ref.path, index, runs, codec=codec, crc64=ref.crc64)
    try:
        yield from iter_opened(OpenedSegment(ref, source, partial=True), CHUNK_BYTES)
    except SegmentFormatError as err:
        backup.rediagnose(ref, verify, err)
