"""What a Spark input partition carries, and how the driver groups pieces of segments into them.

Pure data and arithmetic, no I/O. The driver plans :class:`SegmentPiece` s (a batch read in
:func:`fsspec_kbs.spark.planning.plan`, a micro-batch in the stream reader), groups them with
:func:`group_pieces`, and ships each group as a :class:`KbsSegmentPartition`; the executor
reads exactly those pieces. Everything here is a small frozen value that pickles cheaply: a
task's payload holds its own segments' refs and a few numbers, never the manifest.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields, replace

from pyspark.sql.datasource import InputPartition

from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.store import SegmentRef


@dataclass(frozen=True, slots=True)
class BatchRun:
    """A run of whole batches of a segment as its batch index placed them at planning."""

    #: Index entries ``(first, stop)`` (stop exclusive).
    batches: tuple[int, int]
    #: The stored bytes ``(start, end)`` of those batches in the segment file.
    byte_range: tuple[int, int]
    #: The offsets they hold ``(first, end)`` (end exclusive; None: to the segment's end).
    offsets: tuple[int, int | None]


@dataclass(frozen=True, slots=True)
class SegmentPiece:
    """A segment, or an offset range of one, that one task reads.

    ``start``/``end`` bound the offsets (end exclusive; None: open); ``run`` narrows the read
    to a run of batches through the segment's batch index; ``limit`` is an OSO segment's
    decompressed-size bound from its manifest (None for KBS).
    """

    ref: SegmentRef
    start: int | None = None
    end: int | None = None
    run: BatchRun | None = None
    limit: int | None = None

    def __reduce__(self) -> tuple:
        # The ref's values without its field names: a task's payload is refs and a few numbers.
        ref = tuple(getattr(self.ref, name) for name in _REF_FIELDS)
        return _piece, (ref, self.start, self.end, self.run, self.limit)

    def _lo_hi(self) -> tuple[int, int] | None:
        r = self.ref
        if r.first_offset is None or r.last_offset is None:
            return None
        lo, hi = r.first_offset, r.last_offset + 1
        if self.run is not None:
            first, end = self.run.offsets
            lo = max(lo, first)
            hi = hi if end is None else min(hi, end)
        lo = lo if self.start is None else max(self.start, lo)
        hi = hi if self.end is None else min(self.end, hi)
        return lo, hi

    def span(self) -> int | None:
        """Offsets the piece covers (None: unknown)."""
        lo_hi = self._lo_hi()
        return None if lo_hi is None else max(0, lo_hi[1] - lo_hi[0])

    def weight(self) -> float:
        """Stored bytes the piece stands for (its share of the segment or of its batch run),
        else its span."""
        span, r = self.span(), self.ref
        if self.run is not None and span is not None:
            first, end = self.run.offsets
            run_span = (r.last_offset + 1 if end is None else end) - first  # type: ignore[operator]
            start_byte, end_byte = self.run.byte_range
            return (end_byte - start_byte) * min(1.0, span / max(1, run_span))
        if span is not None and r.size_bytes is not None and r.last_offset is not None \
                and r.first_offset is not None:
            return r.size_bytes * span / max(1, r.last_offset - r.first_offset + 1)
        return float(r.size_bytes if r.size_bytes is not None else (span or 1))

    def split(self, parts: int) -> list[SegmentPiece]:
        """``parts`` pieces of about equal offset ranges (a batch run stays the run to read:
        the executor reads only its batches that the narrower offsets need)."""
        lo_hi = self._lo_hi()
        span = self.span()
        if parts <= 1 or lo_hi is None or span is None or span < 2:
            return [self]
        lo = lo_hi[0]
        bounds = [lo + (span * i) // parts for i in range(parts + 1)]
        out = [replace(self, start=a, end=b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        # The last piece keeps an open end: nothing past the segment is lost if it holds more.
        return [*out[:-1], replace(self, start=out[-1].start, end=self.end)] if out else [self]


_REF_FIELDS = tuple(f.name for f in fields(SegmentRef))


def _piece(ref: tuple, start: int | None, end: int | None, run: BatchRun | None, limit: int | None) -> SegmentPiece:
    """A :class:`SegmentPiece` unpickled (see ``SegmentPiece.__reduce__``)."""
    return SegmentPiece(SegmentRef(*ref), start, end, run, limit)


@dataclass(frozen=True)
class KbsSegmentPartition(InputPartition):
    """One Spark input partition: a segment, part of one, or several small ones in a row.

    ``start_time``/``end_time`` are row bounds (pushed filters, end exclusive);
    ``manifest_crc32`` pins the manifest the plan was made from (a segment that no longer
    matches its ref then fails as :class:`~fsspec_kbs.spark.reader.BackupChangedError`).
    """

    index: int
    segments: tuple[SegmentPiece, ...] = ()
    start_time: int | None = None
    end_time: int | None = None
    layout: str = "kbs"
    manifest_crc32: int | None = None


# -- grouping (driver) ---------------------------------------------------------------------------

def _pack(pieces: list[SegmentPiece], min_bytes: int, max_segments: int, max_records: int | None,
          max_bytes: int | None = None) -> list[list[SegmentPiece]]:
    """Consecutive pieces grouped until a group reaches ``min_bytes`` or holds ``max_segments``
    (or would pass ``max_records`` offsets or ``max_bytes``); a piece of unknown size gets a
    group of its own. A group that holds a quarter of ``min_bytes`` ends where the next piece
    is of another topic-partition: as with Kafka's source, a partition's range worth a task is
    one (a 10 % time window over 6 partitions packed into 3 tasks ran in two waves on two
    cores, 2x the time of 6 tasks)."""
    out: list[list[SegmentPiece]] = []
    group: list[SegmentPiece] = []
    size = records = 0
    for p in pieces:
        span = p.span() or 0
        weight = int(p.weight()) if p.ref.size_bytes is not None else min_bytes
        other = group and (group[-1].ref.topic, group[-1].ref.partition) != (p.ref.topic, p.ref.partition)
        if group and ((max_records is not None and records + span > max_records)
                      or (max_bytes is not None and size + weight > max_bytes)
                      or (other and size >= min_bytes // 4)):
            out.append(group)
            group, size, records = [], 0, 0
        group.append(p)
        records += span
        size += weight
        if size >= min_bytes or len(group) >= max_segments:
            out.append(group)
            group, size, records = [], 0, 0
    if group:
        out.append(group)
    return out


def _split_to(pieces: list[SegmentPiece], n: int) -> list[list[SegmentPiece]]:
    """At least ``n`` groups where the offsets allow: each piece alone, the heaviest split
    into offset ranges (as Kafka's ``KafkaOffsetRangeCalculator`` splits big ranges)."""
    parts = [1] * len(pieces)
    caps = [p.span() or 1 for p in pieces]
    heap = [(-p.weight(), i) for i, p in enumerate(pieces) if caps[i] > 1]
    heapq.heapify(heap)
    extra = n - len(pieces)
    while extra > 0 and heap:
        _, i = heapq.heappop(heap)
        parts[i] += 1
        extra -= 1
        if parts[i] < caps[i]:
            heapq.heappush(heap, (-pieces[i].weight() / parts[i], i))
    return [[q] for p, k in zip(pieces, parts, strict=True) for q in p.split(k)]


def group_pieces(pieces: list[SegmentPiece], o: KbsOptions) -> list[list[SegmentPiece]]:
    """Pieces into input partitions: packed by size, then ``maxRecordsPerPartition`` and
    ``minPartitions`` applied as the Kafka source does."""
    if o.max_records_per_partition is not None:
        pieces = [q for p in pieces
                  for q in p.split(math.ceil((p.span() or 0) / o.max_records_per_partition))]
    groups = _pack(pieces, o.min_partition_bytes, o.max_segments_per_partition, o.max_records_per_partition,
                   o.max_partition_bytes)
    n = o.min_partitions
    if n is None or len(groups) >= n:
        return groups
    if len(pieces) >= n:
        return [[p] for p in pieces]
    return _split_to(pieces, n)
