"""Batch reader of the ``kbs`` data source: plan segments on the driver, decode them on executors."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from fsspec_kbs.arrow import COLUMNS, columns_to_batch
from fsspec_kbs.arrow.convert import bool_mask
from fsspec_kbs.arrow.schema import HEADER_TYPE, project
from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import KbsError
from fsspec_kbs.filters import ScanFilter
from fsspec_kbs.spark.filters import scan_filter_from_dict, scan_filter_to_dict, translate
from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.store import KbsBackup, SegmentRef, open_backup

log = logging.getLogger("fsspec_kbs.spark")

#: Corrupt segments skipped by ``onCorrupt=skip`` in this process, as ``{path: error}``.
#: Executors are separate processes: there the count goes to the executor log.
SKIPPED_SEGMENTS: dict[str, str] = {}


class KbsCorruptSegmentWarning(UserWarning):
    """A corrupt segment was skipped because the read used ``onCorrupt=skip``."""


@dataclass
class KbsSegmentPartition(InputPartition):
    """One Spark input partition: one segment, or several small ones read in a row.

    Holds only plain data: each entry of ``segments`` is a :class:`SegmentRef` as a dict
    (the path on the backup's filesystem, offsets, sizes, checksum) plus the offset bounds
    ``start`` (inclusive) and ``end`` (exclusive, None = open) of its partition.
    """

    index: int
    segments: list[dict] = field(default_factory=list)
    start_time: int | None = None
    end_time: int | None = None

    @property
    def num_bytes(self) -> int:
        return sum(s["ref"].get("size_bytes") or 0 for s in self.segments)


def plan_partitions(backup: KbsBackup, sf: ScanFilter, min_partition_bytes: int,
                    max_segments: int) -> list[KbsSegmentPartition]:
    """Segments that may match ``sf`` (manifest only), packed into partitions.

    Consecutive segments are grouped until a group reaches ``min_partition_bytes`` or holds
    ``max_segments``; a segment of unknown size gets a partition of its own.
    """
    refs = KbsDataset(backup, sf).fragments()
    if sf.start_time is not None and sf.end_time is not None and sf.start_time >= sf.end_time:
        refs = []
    out: list[KbsSegmentPartition] = []
    group: list[dict] = []
    size = 0
    for ref in refs:
        s, e = sf.bounds(ref.topic, ref.partition)
        group.append({"ref": asdict(ref), "start": s, "end": e})
        size += ref.size_bytes if ref.size_bytes is not None else min_partition_bytes
        if size >= min_partition_bytes or len(group) >= max_segments:
            out.append(KbsSegmentPartition(len(out), group, sf.start_time, sf.end_time))
            group, size = [], 0
    if group:
        out.append(KbsSegmentPartition(len(out), group, sf.start_time, sf.end_time))
    return out


class KbsReader(DataSourceReader):
    """Reads a backup as DataFrame rows with the schema of Spark's Kafka source.

    Picklable: holds the parsed options, the output column names and the pushed bounds as a
    plain dict, never a filesystem object.
    """

    def __init__(self, options: KbsOptions, columns: list[str]) -> None:
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"the kbs source has no column(s) {unknown}; it has {list(COLUMNS)}")
        self.options = options
        self.columns = list(columns)
        self.pushed: dict = {}

    def scan_filter(self) -> ScanFilter:
        return self.options.scan_filter().and_(scan_filter_from_dict(self.pushed))

    def partitions(self) -> list[KbsSegmentPartition]:
        o = self.options
        backup = open_backup(o.path, o.storage_options, allow_incomplete=o.allow_incomplete)
        parts = plan_partitions(backup, self.scan_filter(), o.min_partition_bytes, o.max_segments_per_partition)
        # An empty list would make Spark call read(None); an empty partition is clearer.
        return parts or [KbsSegmentPartition(0, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None or not getattr(partition, "segments", None):
            return iter(())
        return self._read(partition)  # type: ignore[arg-type]

    def _read(self, partition: KbsSegmentPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        # Opened here, on the executor, from the URL: nothing unpicklable crosses the wire.
        backup = open_backup(o.path, o.storage_options, allow_incomplete=o.allow_incomplete)
        for seg in partition.segments:
            ref = SegmentRef(**seg["ref"])
            sf = ScanFilter(start_offset=seg["start"], end_offset=seg["end"],
                            start_time=partition.start_time, end_time=partition.end_time)
            if o.on_corrupt == "fail":
                yield from self._segment(backup, ref, sf)
                continue
            # Skipping must drop the whole segment, so decode it fully before yielding any of it.
            try:
                batches = list(self._segment(backup, ref, sf))
            except KbsError as e:
                SKIPPED_SEGMENTS[ref.path] = f"{type(e).__name__}: {e}"
                msg = (f"kbs: skipped corrupt segment {ref.path} ({type(e).__name__}: {e}); "
                       f"{len(SKIPPED_SEGMENTS)} segment(s) skipped in this process")
                log.warning(msg)
                warnings.warn(msg, KbsCorruptSegmentWarning, stacklevel=2)
                continue
            yield from batches

    def _segment(self, backup: KbsBackup, ref: SegmentRef, sf: ScanFilter) -> Iterator[pa.RecordBatch]:
        target = spark_arrow_schema(tuple(self.columns))
        bounds = (*sf.bounds(ref.topic, ref.partition), sf.start_time, sf.end_time)
        for cols in backup.iter_columns(ref, verify_checksums=self.options.verify_checksums, bounds=bounds):
            mask = sf.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
            batch = columns_to_batch(cols, ref.topic, ref.partition, self.columns, ref.path)
            if mask is not None:
                batch = batch.filter(bool_mask(mask))
            if batch.num_rows:
                yield batch.cast(target)


@functools.lru_cache(maxsize=8)
def spark_arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema Spark expects back from ``read``: timestamps in µs, list items named
    ``element``. Same columns and values as :data:`KAFKA_SCHEMA`."""
    fields = []
    for f in project(list(columns)):
        if f.name == "timestamp":
            f = f.with_type(pa.timestamp("us", tz="UTC"))
        elif f.name == "headers":
            f = f.with_type(pa.list_(pa.field("element", HEADER_TYPE)))
        fields.append(f)
    return pa.schema(fields)


class KbsPushdownReader(KbsReader):
    """:class:`KbsReader` that also takes Spark's filters on topic, partition, offset, timestamp.

    Only used when ``spark.sql.python.filterPushdown.enabled`` is true: Spark refuses a
    reader that implements ``pushFilters`` while the setting is off.
    """

    def pushFilters(self, filters: list) -> list:  # noqa: N802 - Spark's hook name
        sf, rest = translate(filters)
        self.pushed = scan_filter_to_dict(scan_filter_from_dict(self.pushed).and_(sf))
        return rest
