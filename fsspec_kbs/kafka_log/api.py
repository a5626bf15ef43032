"""Kafka log directories as Arrow (``read_kafka_log``) and into a KBS backup (``import_log``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from fsspec_kbs.arrow.convert import bool_mask, columns_to_batch, numpy_array
from fsspec_kbs.arrow.schema import project
from fsspec_kbs.filters import to_millis
from fsspec_kbs.format.kafka_log import DEFAULT_MAX_UNCOMPRESSED, TIMESTAMP_TYPE_NAMES, KafkaColumns
from fsspec_kbs.kafka_log.log_dir import KafkaLogDir, LogPartition, PartitionStats, TailReport
from fsspec_kbs.store.txn import WriteMode
from fsspec_kbs.store.writer import BackupWriter


@dataclass
class KafkaLogReport:
    """What was read from a log directory: per-partition numbers and any truncated tails."""

    log_dir: str
    partitions: list[PartitionStats] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def tails(self) -> list[TailReport]:
        return [p.tail for p in self.partitions if p.tail is not None]

    def to_dict(self) -> dict:
        return {"log_dir": self.log_dir, "records": self.records,
                "partitions": [p.to_dict() for p in self.partitions]}


def _row_mask(kc: KafkaColumns, start_offset: int | None, end_offset: int | None, start_time: int | None,
              end_time: int | None) -> np.ndarray | None:
    cols = kc.columns
    mask = None
    for cond in (
        None if start_offset is None else cols.offsets >= start_offset,
        None if end_offset is None else cols.offsets < end_offset,
        None if start_time is None else cols.timestamps >= start_time,
        None if end_time is None else cols.timestamps < end_time,
    ):
        if cond is not None:
            mask = cond if mask is None else mask & cond
    return None if mask is None or bool(mask.all()) else mask


def _to_batch(kc: KafkaColumns, part: LogPartition, columns: list[str] | None, path: str) -> pa.RecordBatch:
    batch = columns_to_batch(kc.columns, part.topic, part.partition, columns, path)
    if "timestampType" in batch.schema.names:
        # The KBS converter has no timestamp type to offer; a Kafka log has the real one.
        i = batch.schema.get_field_index("timestampType")
        batch = batch.set_column(i, batch.schema.field(i), numpy_array(kc.timestamp_types.astype(np.int32), pa.int32()))
    return batch


class KafkaLogScan:
    """A lazy scan of a Kafka log directory; iterate :meth:`to_batches` or call :meth:`to_table`.

    See :func:`read_kafka_log` for the parameters. ``report`` fills in while the scan runs.
    """

    def __init__(self, log_dir: str, *, storage_options: dict | None = None, topics: str | Iterable[str] | None = None,
                 topic_pattern: str | None = None, partitions: int | Iterable[int] | None = None,
                 start_offset: int | None = None, end_offset: int | None = None, start_time: Any = None,
                 end_time: Any = None, columns: list[str] | None = None, verify_crc: bool = True,
                 on_corrupt_tail: str = "truncate", include_internal: bool = False,
                 max_batch_bytes: int = DEFAULT_MAX_UNCOMPRESSED) -> None:
        self.log = KafkaLogDir(log_dir, storage_options, include_internal=include_internal)
        self.topics = [topics] if isinstance(topics, str) else None if topics is None else list(topics)
        self.partitions = [partitions] if isinstance(partitions, int) else None if partitions is None \
            else list(partitions)
        self.topic_pattern = topic_pattern
        self.start_offset, self.end_offset = start_offset, end_offset
        self.start_time, self.end_time = to_millis(start_time), to_millis(end_time)
        self.columns = columns
        self.schema = project(columns)
        self.verify_crc = verify_crc
        self.on_corrupt_tail = on_corrupt_tail
        self.max_batch_bytes = max_batch_bytes
        self.report = KafkaLogReport(log_dir)

    def fragments(self) -> list[LogPartition]:
        """The partition directories the scan reads (nothing is read yet)."""
        return self.log.partitions(self.topics, self.partitions, self.topic_pattern)

    def iter_columns(self) -> Iterator[tuple[LogPartition, KafkaColumns]]:
        """Unfiltered decoded chunks (rows of partly matching batches included), per partition."""
        for part in self.fragments():
            stats = PartitionStats(part.topic, part.partition)
            self.report.partitions.append(stats)
            for kc in self.log.read_partition(
                    part, start_offset=self.start_offset, end_offset=self.end_offset, start_time=self.start_time,
                    verify_crc=self.verify_crc, on_corrupt_tail=self.on_corrupt_tail,
                    max_batch_bytes=self.max_batch_bytes, stats=stats):
                yield part, kc

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        for part, kc in self.iter_columns():
            batch = _to_batch(kc, part, self.columns, part.path)
            mask = _row_mask(kc, self.start_offset, self.end_offset, self.start_time, self.end_time)
            if mask is not None:
                batch = batch.filter(bool_mask(mask))
            if batch.num_rows:
                yield batch

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self.to_batches())

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), schema=self.schema)


def read_kafka_log(log_dir: str, **kwargs: Any) -> pa.Table:
    """Read a Kafka broker's log directory as an Arrow table with the backup schema.

    Parameters
    ----------
    log_dir : str
        A ``log.dirs`` entry (holding ``<topic>-<partition>/``), any fsspec URL.
    storage_options : dict, optional
        For the fsspec filesystem.
    topics, topic_pattern, partitions : optional
        Which partitions to read (``topic_pattern`` is a regular expression matched in full).
    start_offset, end_offset : int, optional
        Offsets, start inclusive, end exclusive. The start seeks with the ``.index`` files.
    start_time, end_time : int (Unix ms), ISO-8601 str or datetime, optional
        Record timestamps, start inclusive, end exclusive. The start seeks with ``.timeindex``.
    columns : list of str, optional
        Subset of ``key, value, topic, partition, offset, timestamp, timestampType, headers``.
        ``timestampType`` is the real type of each record (0 CreateTime, 1 LogAppendTime).
    verify_crc : bool, default True
        Check every batch's CRC-32C.
    on_corrupt_tail : {"truncate", "error"}, default "truncate"
        At a cut-off or corrupt batch: end the partition there with a
        :class:`~fsspec_kbs.kafka_log.KafkaLogWarning` (like Kafka's recovery), or raise.
    include_internal : bool, default False
        Also read Kafka's internal topics (``__consumer_offsets`` …).

    Returns
    -------
    pyarrow.Table
        Records as a ``read_committed`` consumer would see them: no control records, no records
        of aborted transactions.

    Raises
    ------
    BackupNotFoundError
        ``log_dir`` does not exist.
    SegmentFormatError
        Legacy (v0/v1) messages, or any defect with ``on_corrupt_tail="error"``.
    """
    return KafkaLogScan(log_dir, **kwargs).to_table()


def open_kafka_log_reader(log_dir: str, **kwargs: Any) -> pa.RecordBatchReader:
    """Streaming form of :func:`read_kafka_log` (one partition's chunk in memory at a time)."""
    return KafkaLogScan(log_dir, **kwargs).to_reader()


def import_log(
    log_dir: str,
    to_url: str,
    *,
    storage_options: dict | None = None,
    to_storage_options: dict | None = None,
    topics: str | Iterable[str] | None = None,
    topic_pattern: str | None = None,
    partitions: int | Iterable[int] | None = None,
    compression: str = "zstd",
    mode: WriteMode = "error",
    verify_crc: bool = True,
    on_corrupt_tail: str = "truncate",
    include_internal: bool = False,
    progress: Callable[[PartitionStats], None] | None = None,
    **writer_options: Any,
) -> KafkaLogReport:
    """Copy the records of a Kafka log directory into a new KBS backup at ``to_url``.

    Offsets and timestamps are kept as they are in the log (compacted topics keep their gaps);
    control records and aborted transactions are left out. The KBS format has no timestamp-type
    field, so each partition's timestamp type(s) go to the manifest under
    ``extra["kafka_log_import"]["partitions"]``, with the truncated tails and other numbers of the
    returned report.

    Parameters
    ----------
    log_dir, to_url : str
        Source log directory and the backup directory to create (``<root>/<backup-id>``).
    storage_options, to_storage_options : dict, optional
        fsspec options for each side.
    compression, mode, **writer_options
        Passed to :class:`~fsspec_kbs.store.BackupWriter`.
    progress : callable, optional
        Called with each partition's :class:`PartitionStats` when it is done.

    Other parameters are those of :func:`read_kafka_log`.
    """
    scan = KafkaLogScan(log_dir, storage_options=storage_options, topics=topics, topic_pattern=topic_pattern,
                        partitions=partitions, verify_crc=verify_crc, on_corrupt_tail=on_corrupt_tail,
                        include_internal=include_internal)
    writer = BackupWriter(to_url, to_storage_options, compression=compression, mode=mode, **writer_options)
    try:
        for part in scan.fragments():
            stats = PartitionStats(part.topic, part.partition)
            scan.report.partitions.append(stats)
            for kc in scan.log.read_partition(part, verify_crc=verify_crc, on_corrupt_tail=on_corrupt_tail,
                                              stats=stats):
                writer.write_columns(part.topic, part.partition, kc.columns)
            if progress is not None:
                progress(stats)
        writer.commit(extra={"kafka_log_import": {
            "log_dir": log_dir,
            "partitions": [_manifest_stats(p) for p in scan.report.partitions],
        }})
    except BaseException:
        writer.abort()
        raise
    return scan.report


def _manifest_stats(p: PartitionStats) -> dict:
    d = p.to_dict()
    d["timestamp_type"] = (TIMESTAMP_TYPE_NAMES[next(iter(p.timestamp_types))] if len(p.timestamp_types) == 1
                           else "mixed" if p.timestamp_types else None)
    return d
