"""One-call functions in the style of ``pyarrow.parquet``: read_table, read_pandas, write_table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from fsspec_kbs.arrow.convert import batch_to_columns, split_table, timestamps_of
from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.filters import TimeLike
from fsspec_kbs.store import BackupWriter, Manifest


def _dataset(url: str, storage_options: dict | None, allow_incomplete: bool, **filters: Any) -> KbsDataset:
    return KbsDataset.open(url, storage_options, allow_incomplete=allow_incomplete).filter(**filters)


def read_table(
    url: str,
    topics: str | Iterable[str] | None = None,
    partitions: int | Iterable[int] | None = None,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_time: TimeLike | None = None,
    end_time: TimeLike | None = None,
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    topic_pattern: str | None = None,
    storage_options: dict | None = None,
    allow_incomplete: bool = False,
    use_threads: bool = True,
    verify_checksums: bool = True,
    binary_view: bool = False,
) -> pa.Table:
    """Read a backup (or part of it) into a :class:`pyarrow.Table`.

    Parameters
    ----------
    url : str
        Backup directory on any fsspec URL (``s3://bucket/backups/backup-1``, a local path…).
    topics, partitions : optional
        Names / numbers to keep (a single value or an iterable).
    start_offset, end_offset : int, optional
        Offset bounds: start inclusive, end exclusive.
    start_time, end_time : int, datetime or str, optional
        Record timestamp bounds (Unix ms, datetime, ISO 8601): start inclusive, end exclusive.
    columns : list of str, optional
        Subset of ``key, value, topic, partition, offset, timestamp, timestampType, headers``.
    filter : pyarrow Expression or DNF list of tuples, optional
        Extra row filter; DNF tuples on topic/partition/offset/timestamp also prune segments.
    topic_pattern : str, optional
        Regular expression topics must match in full.
    storage_options : dict, optional
        Passed to fsspec for ``url``.
    allow_incomplete : bool, default False
        Read a backup that has no manifest (interrupted).
    binary_view : bool, default False
        Zero-copy: ``binary_view``/``string_view`` columns pointing into the decompressed
        batches (see :meth:`KbsDataset.scanner`).

    Raises
    ------
    IncompleteBackupError, ManifestError, SegmentFormatError, BackupNotFoundError

    Examples
    --------
    >>> import fsspec_kbs
    >>> t = fsspec_kbs.read_table("/backups/backup-1", topics="orders", start_offset=100)  # doctest: +SKIP
    """
    ds = _dataset(url, storage_options, allow_incomplete, topics=topics, partitions=partitions,
                  start_offset=start_offset, end_offset=end_offset, start_time=start_time,
                  end_time=end_time, topic_pattern=topic_pattern)
    return ds.to_table(columns=columns, filter=filter, use_threads=use_threads,
                       verify_checksums=verify_checksums, binary_view=binary_view)


def open_reader(
    url: str,
    topics: str | Iterable[str] | None = None,
    partitions: int | Iterable[int] | None = None,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_time: TimeLike | None = None,
    end_time: TimeLike | None = None,
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    topic_pattern: str | None = None,
    batch_size: int | None = None,
    storage_options: dict | None = None,
    allow_incomplete: bool = False,
    use_threads: bool = True,
    verify_checksums: bool = True,
    binary_view: bool = False,
) -> pa.RecordBatchReader:
    """Stream a backup as a :class:`pyarrow.RecordBatchReader` in bounded memory.

    Same parameters as :func:`read_table`, plus ``batch_size`` (max rows per batch).
    """
    ds = _dataset(url, storage_options, allow_incomplete, topics=topics, partitions=partitions,
                  start_offset=start_offset, end_offset=end_offset, start_time=start_time,
                  end_time=end_time, topic_pattern=topic_pattern)
    return ds.to_reader(columns=columns, filter=filter, batch_size=batch_size, use_threads=use_threads,
                        verify_checksums=verify_checksums, binary_view=binary_view)


def read_pandas(url: str, **kwargs: Any) -> Any:
    """:func:`read_table` then ``to_pandas()``; takes the same arguments."""
    return read_table(url, **kwargs).to_pandas()


def _as_arrow(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if type(data).__module__.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(f"write_table takes a pyarrow Table/RecordBatch or a pandas DataFrame, not {type(data)}")


def write_batches(writer: BackupWriter, data: Any, topic: str | None = None, partition: int | None = None) -> None:
    """Add Arrow/pandas rows to an open :class:`BackupWriter` (offsets assigned where missing)."""
    table = _as_arrow(data)
    for t, p, batch in split_table(table, topic, partition):
        if "offset" in batch.schema.names and batch.column("offset").null_count < batch.num_rows:
            col = batch.column("offset")
            if col.null_count:
                raise ValueError(f"column 'offset' of {t}/{p} is partly null; give all offsets or none")
            offsets = col.cast(pa.int64()).to_numpy()
        else:
            start = writer.last_offset(t, p) + 1
            offsets = np.arange(start, start + batch.num_rows, dtype=np.int64)
        writer.write_columns(t, p, batch_to_columns(batch, offsets, timestamps_of(batch)))


def write_table(
    url: str,
    data: Any,
    *,
    topic: str | None = None,
    partition: int | None = None,
    compression: str = "zstd",
    level: int | None = None,
    mode: str = "error",
    segment_max_bytes: int = 64 * 1024 * 1024,
    segment_max_records: int | None = None,
    batch_max_bytes: int = 1024 * 1024,
    storage_options: dict | None = None,
) -> Manifest:
    """Write Arrow or pandas data as a KBS backup at ``url`` (``<root>/<backup-id>``).

    Columns as Spark's Kafka sink takes them: ``value`` (required, binary or string) and
    optionally ``key``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``headers``.
    Missing ``topic`` needs ``topic=``; missing ``partition`` means ``partition`` (default 0);
    missing offsets are assigned densely per partition, continuing after what the backup holds;
    missing timestamps are the current time.

    ``mode``: ``"error"`` (default) refuses an existing backup, ``"overwrite"`` replaces it,
    ``"append"`` adds segments (offsets must keep increasing per partition).

    The manifest is written last, atomically: an interrupted write leaves no manifest (or the
    previous one). Returns the manifest written.
    """
    writer = BackupWriter(url, storage_options, compression=compression, level=level, mode=mode,
                          segment_max_bytes=segment_max_bytes, segment_max_records=segment_max_records,
                          batch_max_bytes=batch_max_bytes)
    try:
        write_batches(writer, data, topic, partition)
    except BaseException:
        writer.abort()
        raise
    return writer.commit()
