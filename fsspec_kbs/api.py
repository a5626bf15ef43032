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
from fsspec_kbs.store.txn import WriteMode


class NoMatchWarning(UserWarning):
    """A filter names a topic or partition the backup does not hold, or bounds outside its data."""


def unmatched_filters(ds: KbsDataset) -> list[str]:
    """Why the dataset's filters select nothing, from the manifest alone (no segment is read):
    one sentence per topic, pattern, partition or bound that matches no data. Empty when each
    part of the filter matches something (the rows may still be few, or none)."""
    sf = ds.scan_filter
    refs = ds.backup.segments()
    if not refs:
        return []
    url = ds.backup.url
    topics = sorted({r.topic for r in refs})
    problems = []
    for t in sorted(sf.topics or ()):
        if t not in topics:
            problems.append(f"topic {t!r} is not in {url} (it holds {', '.join(topics)})")
    if sf.topic_pattern is not None:
        import re

        if not any(re.fullmatch(sf.topic_pattern, t) for t in topics):
            problems.append(f"topic pattern {sf.topic_pattern!r} matches no topic of {url} "
                            f"({', '.join(topics)}; the pattern must match the whole name)")
    by_topic: dict[str, set[int]] = {}
    for r in refs:
        by_topic.setdefault(r.topic, set()).add(r.partition)
    chosen = [t for t in topics if (sf.topics is None or t in sf.topics)]
    for p in sorted(sf.partitions or ()):
        if chosen and not any(p in by_topic.get(t, set()) for t in chosen):
            held = sorted({q for t in chosen for q in by_topic.get(t, set())})
            problems.append(f"partition {p} is not in {', '.join(chosen)} of {url} "
                            f"(partitions: {', '.join(map(str, held))})")
    if problems:
        return problems
    wanted = [r for r in refs if sf.wants_partition(r.topic, r.partition)]
    if not wanted:
        return [f"the filters select no partition of {url}"]
    firsts = [r.first_offset for r in wanted if r.first_offset is not None]
    lasts = [r.last_offset for r in wanted if r.last_offset is not None]
    if len(firsts) == len(wanted) and len(lasts) == len(wanted):
        lo, hi = min(firsts), max(lasts)
        if (sf.start_offset is not None and sf.start_offset > hi) or (
                sf.end_offset is not None and sf.end_offset <= lo):
            problems.append(f"offsets [{sf.start_offset}, {sf.end_offset}) are outside the selected data "
                            f"of {url} (offsets {lo} … {hi})")
    mins = [r.min_timestamp for r in wanted if r.min_timestamp is not None]
    maxs = [r.max_timestamp for r in wanted if r.max_timestamp is not None]
    if len(mins) == len(wanted) and len(maxs) == len(wanted):
        lo, hi = min(mins), max(maxs)
        if (sf.start_time is not None and sf.start_time > hi) or (sf.end_time is not None and sf.end_time <= lo):
            problems.append(f"the time bounds are outside the selected data of {url} "
                            f"(timestamps {_iso(lo)} … {_iso(hi)})")
    return problems


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def warn_unmatched(ds: KbsDataset, stacklevel: int = 3) -> KbsDataset:
    """Warn (:class:`NoMatchWarning`) for each part of the filters that matches no data."""
    import warnings

    for message in unmatched_filters(ds):
        warnings.warn(message, NoMatchWarning, stacklevel=stacklevel + 1)
    return ds


def storage_url(url: str) -> str:
    """The backup's storage URL from what a user may write: ``kbs::s3://...`` (a chained URL)
    reads ``s3://...``; ``kbs:///abs/path`` reads ``/abs/path``. Any other ``kbs://`` URL
    raises a ValueError saying what to write."""
    if not isinstance(url, str):
        return url
    if url.startswith("kbs::"):
        return url[len("kbs::"):]
    if url.startswith("kbs:///") and "::" not in url:
        return url[len("kbs://"):]
    if url.startswith("kbs://"):
        raise ValueError(f"{url}: read_table / open_reader / KbsDataset take the backup's own URL "
                         "(s3://bucket/backups/backup-1, /data/backups/backup-1), not a kbs:// path; "
                         "kbs:// is the file view of a backup for tools that only read files (docs/fsspec.md)")
    return url


def _dataset(url: str, storage_options: dict | None, allow_incomplete: bool, **filters: Any) -> KbsDataset:
    ds = KbsDataset.open(storage_url(url), storage_options, allow_incomplete=allow_incomplete).filter(**filters)
    return warn_unmatched(ds, stacklevel=4)


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
    mode: WriteMode = "error",
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
