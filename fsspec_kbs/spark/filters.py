"""Spark pushed filters -> :class:`~fsspec_kbs.filters.ScanFilter` bounds that prune whole segments.

A filter is reported as handled only when the reader enforces it exactly (per segment for
topic/partition, per row for offset/timestamp bounds); anything else goes back to Spark, which
evaluates it again on the rows. Some unhandled filters still narrow the scan (``offset IN (...)``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from typing import Any

from fsspec_kbs.filters import ScanFilter

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_US = dt.timedelta(microseconds=1)


def scan_filter_to_dict(sf: ScanFilter) -> dict:
    """Plain JSON-able form (str/int/list/dict only) so readers and partitions pickle trivially."""
    return {
        "topics": None if sf.topics is None else sorted(sf.topics),
        "topic_pattern": sf.topic_pattern,
        "partitions": None if sf.partitions is None else sorted(sf.partitions),
        "start_offset": sf.start_offset,
        "end_offset": sf.end_offset,
        "start_time": sf.start_time,
        "end_time": sf.end_time,
        "offset_ranges": [[t, p, s, e] for (t, p), (s, e) in sorted(sf.offset_ranges.items())],
    }


def scan_filter_from_dict(d: dict | None) -> ScanFilter:
    if not d:
        return ScanFilter()
    return ScanFilter(
        topics=None if d.get("topics") is None else frozenset(d["topics"]),
        topic_pattern=d.get("topic_pattern"),
        partitions=None if d.get("partitions") is None else frozenset(d["partitions"]),
        start_offset=d.get("start_offset"),
        end_offset=d.get("end_offset"),
        start_time=d.get("start_time"),
        end_time=d.get("end_time"),
        offset_ranges={(t, int(p)): (s, e) for t, p, s, e in d.get("offset_ranges", [])},
    )


def _micros(value: Any) -> int | None:
    """Microseconds since the epoch of a pushed timestamp literal (naive = UTC, as TIMESTAMP_NTZ)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return (value - _EPOCH) // _US
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def translate(filters: Iterable[Any]) -> tuple[ScanFilter, list[Any]]:
    """Split Spark filters into bounds this source enforces and the ones Spark must keep.

    Parameters
    ----------
    filters : iterable of pyspark.sql.datasource.Filter
        ANDed filters as Spark pushes them.

    Returns
    -------
    (ScanFilter, list)
        The bounds, and the filters not fully handled (the same objects, as Spark requires).
    """
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        IsNull,
        LessThan,
        LessThanOrEqual,
        StringContains,
        StringEndsWith,
        StringStartsWith,
    )

    sf = ScanFilter()
    rest: list[Any] = []
    for f in filters:
        attr = getattr(f, "attribute", None)
        col = attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None
        value = getattr(f, "value", None)
        more: ScanFilter | None = None
        exact = True
        if col in ("topic", "partition", "offset", "timestamp") and isinstance(f, IsNotNull):
            more = ScanFilter()  # these columns are never null
        elif col in ("topic", "partition", "offset", "timestamp") and isinstance(f, IsNull):
            more = ScanFilter(topics=frozenset())  # matches nothing
        elif col == "topic":
            if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(value, str):
                more = ScanFilter(topics=frozenset([value]))
            elif isinstance(f, In) and all(isinstance(v, str) or v is None for v in value):
                more = ScanFilter(topics=frozenset(v for v in value if v is not None))
            elif isinstance(f, StringStartsWith) and isinstance(value, str):
                more = ScanFilter(topic_pattern=re.escape(value) + ".*")
            elif isinstance(f, StringEndsWith) and isinstance(value, str):
                more = ScanFilter(topic_pattern=".*" + re.escape(value))
            elif isinstance(f, StringContains) and isinstance(value, str):
                more = ScanFilter(topic_pattern=".*" + re.escape(value) + ".*")
        elif col == "partition":
            if isinstance(f, (EqualTo, EqualNullSafe)) and _is_int(value):
                more = ScanFilter(partitions=frozenset([value]))
            elif isinstance(f, In) and all(_is_int(v) or v is None for v in value):
                more = ScanFilter(partitions=frozenset(v for v in value if v is not None))
        elif col == "offset":
            if isinstance(f, In) and value and all(_is_int(v) for v in value):
                # Prunes to the span of the values; Spark still picks the exact rows.
                more, exact = ScanFilter(start_offset=min(value), end_offset=max(value) + 1), False
            elif _is_int(value):
                if isinstance(f, (EqualTo, EqualNullSafe)):
                    more = ScanFilter(start_offset=value, end_offset=value + 1)
                elif isinstance(f, GreaterThan):
                    more = ScanFilter(start_offset=value + 1)
                elif isinstance(f, GreaterThanOrEqual):
                    more = ScanFilter(start_offset=value)
                elif isinstance(f, LessThan):
                    more = ScanFilter(end_offset=value)
                elif isinstance(f, LessThanOrEqual):
                    more = ScanFilter(end_offset=value + 1)
        elif col == "timestamp":
            # Records hold milliseconds; literals are microseconds. Bounds are rounded so that
            # "ms * 1000 <op> literal" holds exactly for the rows kept.
            if isinstance(f, In) and value and all(_micros(v) is not None for v in value):
                us = [_micros(v) for v in value]
                more = ScanFilter(start_time=_ceil_div(min(us), 1000), end_time=max(us) // 1000 + 1)  # type: ignore[arg-type]
                exact = False
            else:
                us = _micros(value)
                if us is not None:
                    if isinstance(f, (EqualTo, EqualNullSafe)):
                        more = ScanFilter(start_time=_ceil_div(us, 1000), end_time=us // 1000 + 1)
                    elif isinstance(f, GreaterThan):
                        more = ScanFilter(start_time=us // 1000 + 1)
                    elif isinstance(f, GreaterThanOrEqual):
                        more = ScanFilter(start_time=_ceil_div(us, 1000))
                    elif isinstance(f, LessThan):
                        more = ScanFilter(end_time=_ceil_div(us, 1000))
                    elif isinstance(f, LessThanOrEqual):
                        more = ScanFilter(end_time=us // 1000 + 1)
        if more is None:
            rest.append(f)
            continue
        sf = sf.and_(more)
        if not exact:
            rest.append(f)
    return sf, rest
