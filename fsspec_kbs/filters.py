"""Record filters shared by the Arrow API, the CLI and Spark: bounds used to prune segments."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from typing import Any

import numpy as np

from fsspec_kbs.store.segment_ref import Bounds, SegmentRef
from fsspec_kbs.times import parse_time

#: A time bound: Unix ms, a string (ISO 8601, Unix ms, relative), a datetime or date (pandas
#: Timestamps are datetimes), a numpy datetime64 or integer.
TimeLike = int | float | str | datetime | date | np.datetime64 | np.integer


def to_millis(value: TimeLike | None) -> int | None:
    """Unix ms from an int (ms), a datetime/pandas Timestamp (naive = UTC) or a string: Unix ms,
    ISO 8601 or a relative form (:func:`fsspec_kbs.times.parse_time`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("a time bound cannot be a bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return parse_time(text)  # ISO 8601 and the relative forms (-2h, yesterday, ...)
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[ms]").astype(np.int64))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp() * 1000)
    if isinstance(value, date):
        return int(datetime(value.year, value.month, value.day, tzinfo=timezone.utc).timestamp() * 1000)
    raise TypeError(f"cannot read {value!r} as a time")


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class ScanFilter:
    """What records to read. Start bounds are inclusive, end bounds exclusive.

    ``offset_ranges`` bounds single partitions: ``{(topic, partition): (start, end)}`` with
    either end None for open.
    """

    topics: frozenset[str] | None = None
    topic_pattern: str | None = None
    partitions: frozenset[int] | None = None
    start_offset: int | None = None
    end_offset: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    offset_ranges: dict[tuple[str, int], tuple[int | None, int | None]] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        topics: str | Iterable[str] | None = None,
        partitions: int | Iterable[int] | None = None,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: TimeLike | None = None,
        end_time: TimeLike | None = None,
        topic_pattern: str | None = None,
    ) -> ScanFilter:
        if isinstance(topics, str):
            topics = [topics]
        if isinstance(partitions, (int, np.integer)):
            partitions = [int(partitions)]
        if topic_pattern is not None:
            re.compile(topic_pattern)
        return cls(
            topics=None if topics is None else frozenset(topics),
            topic_pattern=topic_pattern,
            partitions=None if partitions is None else frozenset(int(p) for p in partitions),
            start_offset=start_offset,
            end_offset=end_offset,
            start_time=to_millis(start_time),
            end_time=to_millis(end_time),
        )

    def and_(self, other: ScanFilter) -> ScanFilter:
        topics = self.topics if other.topics is None else (
            other.topics if self.topics is None else self.topics & other.topics)
        parts = self.partitions if other.partitions is None else (
            other.partitions if self.partitions is None else self.partitions & other.partitions)
        ranges = dict(self.offset_ranges)
        for key, (s, e) in other.offset_ranges.items():
            s0, e0 = ranges.get(key, (None, None))
            ranges[key] = (_max(s0, s), _min(e0, e))
        if self.topic_pattern and other.topic_pattern and self.topic_pattern != other.topic_pattern:
            pattern = f"(?=(?:{self.topic_pattern})$)(?:{other.topic_pattern})"
        else:
            pattern = self.topic_pattern or other.topic_pattern
        return replace(
            self, topics=topics, partitions=parts, topic_pattern=pattern,
            start_offset=_max(self.start_offset, other.start_offset),
            end_offset=_min(self.end_offset, other.end_offset),
            start_time=_max(self.start_time, other.start_time),
            end_time=_min(self.end_time, other.end_time),
            offset_ranges=ranges,
        )

    def bounds(self, topic: str, partition: int) -> tuple[int | None, int | None]:
        s, e = self.offset_ranges.get((topic, partition), (None, None))
        return _max(self.start_offset, s), _min(self.end_offset, e)

    def segment_bounds(self, ref: SegmentRef) -> Bounds:
        """Start and end offset, start and end time a read of ``ref`` needs (end exclusive):
        what :meth:`KbsBackup.open_chunks` takes to read only those batches (batch index)."""
        return (*self.bounds(ref.topic, ref.partition), self.start_time, self.end_time)

    def wants_partition(self, topic: str, partition: int) -> bool:
        if self.topics is not None and topic not in self.topics:
            return False
        if self.topic_pattern is not None and not re.fullmatch(self.topic_pattern, topic):
            return False
        return self.partitions is None or partition in self.partitions

    def keeps(self, ref: SegmentRef) -> bool:
        """False when no record of the segment can pass (metadata only)."""
        if not self.wants_partition(ref.topic, ref.partition):
            return False
        s, e = self.bounds(ref.topic, ref.partition)
        if s is not None and e is not None and s >= e:
            return False
        return ref.may_contain(s, e, self.start_time, self.end_time)

    def row_mask(self, topic: str, partition: int, offsets: np.ndarray, timestamps: np.ndarray) -> np.ndarray | None:
        """Boolean mask of rows inside the bounds, or None when every row is."""
        s, e = self.bounds(topic, partition)
        mask = None

        def both(m: np.ndarray) -> np.ndarray:
            return m if mask is None else mask & m

        if s is not None and len(offsets) and offsets[0] < s:
            mask = both(offsets >= s)
        if e is not None and len(offsets) and offsets[-1] >= e:
            mask = both(offsets < e)
        if self.start_time is not None:
            mask = both(timestamps >= self.start_time)
        if self.end_time is not None:
            mask = both(timestamps < self.end_time)
        if mask is not None and bool(mask.all()):
            return None
        return mask


_OPS = {"=", "==", "!=", "<", "<=", ">", ">=", "in", "not in"}


def dnf_to_scan_filter(dnf: list) -> ScanFilter:
    """Bounds implied by a conjunction of ``(column, op, value)`` tuples (others ignored).

    Only a flat list (an AND) is used for pruning; a list of lists (an OR) prunes nothing.
    The tuples are always applied to rows as well, so ignoring one is safe.
    """
    sf = ScanFilter()
    if not dnf or isinstance(dnf[0], list):
        return sf
    for col, op, value in dnf:
        if op not in _OPS:
            raise ValueError(f"unknown filter operator {op!r}")
        if col == "topic":
            if op in ("=", "=="):
                sf = sf.and_(ScanFilter(topics=frozenset([value])))
            elif op == "in":
                sf = sf.and_(ScanFilter(topics=frozenset(value)))
        elif col == "partition":
            if op in ("=", "=="):
                sf = sf.and_(ScanFilter(partitions=frozenset([int(value)])))
            elif op == "in":
                sf = sf.and_(ScanFilter(partitions=frozenset(int(v) for v in value)))
        elif col in ("offset", "timestamp"):
            v = int(value) if col == "offset" else to_millis(value)
            lo_key, hi_key = ("start_offset", "end_offset") if col == "offset" else ("start_time", "end_time")
            if op in (">=",):
                sf = sf.and_(ScanFilter(**{lo_key: v}))
            elif op == ">":
                sf = sf.and_(ScanFilter(**{lo_key: v + 1}))
            elif op == "<":
                sf = sf.and_(ScanFilter(**{hi_key: v}))
            elif op == "<=":
                sf = sf.and_(ScanFilter(**{hi_key: v + 1}))
            elif op in ("=", "=="):
                sf = sf.and_(ScanFilter(**{lo_key: v, hi_key: v + 1}))
    return sf


def dnf_to_expression(dnf: list) -> Any:
    """A pyarrow compute Expression for DNF tuples (list = AND, list of lists = OR of ANDs)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def term(col: str, op: str, value: Any) -> Any:
        f = pc.field(col)
        if col == "timestamp" and not isinstance(value, (list, tuple, set)):
            value = pa.scalar(to_millis(value), pa.timestamp("ms", tz="UTC"))
        if op in ("=", "=="):
            return f == value
        if op == "!=":
            return f != value
        if op == "<":
            return f < value
        if op == "<=":
            return f <= value
        if op == ">":
            return f > value
        if op == ">=":
            return f >= value
        if op == "in":
            return f.isin(list(value))
        if op == "not in":
            return ~f.isin(list(value))
        raise ValueError(f"unknown filter operator {op!r}")

    def conj(terms: list) -> Any:
        expr = None
        for t in terms:
            e = term(*t)
            expr = e if expr is None else expr & e
        return expr

    if not dnf:
        return None
    if isinstance(dnf[0], list):
        expr = None
        for group in dnf:
            e = conj(group)
            expr = e if expr is None else expr | e
        return expr
    return conj(dnf)
