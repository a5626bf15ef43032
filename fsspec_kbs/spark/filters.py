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

from pyspark.sql import datasource as ds

from fsspec_kbs.filters import ScanFilter

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_US = dt.timedelta(microseconds=1)


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


#: Columns that are never null: ``IS NOT NULL`` on them is always true, ``IS NULL`` never.
_NEVER_NULL = ("topic", "partition", "offset", "timestamp")


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
    sf = ScanFilter()
    rest: list[Any] = []
    for f in filters:
        bound = _bound(f)
        if bound is None:
            rest.append(f)
            continue
        more, exact = bound
        sf = sf.and_(more)
        if not exact:
            rest.append(f)
    return sf, rest


def _bound(f: Any) -> tuple[ScanFilter, bool] | None:
    """The bounds one filter puts on the scan and whether they are exact (Spark need not check
    the rows again), or None: this source does not handle it."""
    attr = getattr(f, "attribute", None)
    col = attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None
    value = getattr(f, "value", None)
    if col in _NEVER_NULL and isinstance(f, ds.IsNotNull):
        return ScanFilter(), True
    if col in _NEVER_NULL and isinstance(f, ds.IsNull):
        return ScanFilter(topics=frozenset()), True  # matches nothing
    if col == "topic":
        return _exact(_topic_bound(f, value))
    if col == "partition":
        return _exact(_partition_bound(f, value))
    if col == "offset":
        return _offset_bound(f, value)
    if col == "timestamp":
        return _timestamp_bound(f, value)
    return None


def _exact(sf: ScanFilter | None) -> tuple[ScanFilter, bool] | None:
    return None if sf is None else (sf, True)


def _topic_bound(f: Any, value: Any) -> ScanFilter | None:
    if isinstance(f, (ds.EqualTo, ds.EqualNullSafe)) and isinstance(value, str):
        return ScanFilter(topics=frozenset([value]))
    if isinstance(f, ds.In) and all(isinstance(v, str) or v is None for v in value):
        return ScanFilter(topics=frozenset(v for v in value if v is not None))
    if not isinstance(value, str):
        return None
    if isinstance(f, ds.StringStartsWith):
        return ScanFilter(topic_pattern=re.escape(value) + ".*")
    if isinstance(f, ds.StringEndsWith):
        return ScanFilter(topic_pattern=".*" + re.escape(value))
    if isinstance(f, ds.StringContains):
        return ScanFilter(topic_pattern=".*" + re.escape(value) + ".*")
    return None


def _partition_bound(f: Any, value: Any) -> ScanFilter | None:
    if isinstance(f, (ds.EqualTo, ds.EqualNullSafe)) and _is_int(value):
        return ScanFilter(partitions=frozenset([value]))
    if isinstance(f, ds.In) and all(_is_int(v) or v is None for v in value):
        return ScanFilter(partitions=frozenset(v for v in value if v is not None))
    return None


def _offset_bound(f: Any, value: Any) -> tuple[ScanFilter, bool] | None:
    if isinstance(f, ds.In) and value and all(_is_int(v) for v in value):
        # Prunes to the span of the values; Spark still picks the exact rows.
        return ScanFilter(start_offset=min(value), end_offset=max(value) + 1), False
    if not _is_int(value):
        return None
    return _exact(_comparison(f, value, value + 1, "start_offset", "end_offset"))


def _timestamp_bound(f: Any, value: Any) -> tuple[ScanFilter, bool] | None:
    # Records hold milliseconds; literals are microseconds. Bounds are rounded so that
    # "ms * 1000 <op> literal" holds exactly for the rows kept.
    if isinstance(f, ds.In) and value and all(_micros(v) is not None for v in value):
        us = [_micros(v) for v in value]
        return ScanFilter(start_time=_ceil_div(min(us), 1000), end_time=max(us) // 1000 + 1), False  # type: ignore[arg-type]
    us1 = _micros(value)
    if us1 is None:
        return None
    return _exact(_comparison(f, _ceil_div(us1, 1000), us1 // 1000 + 1, "start_time", "end_time"))


def _comparison(f: Any, first_at: int, first_above: int, start: str, end: str) -> ScanFilter | None:
    """A comparison with a literal as ``ScanFilter`` bounds ``start``/``end`` (inclusive,
    exclusive): ``first_at`` is the first value (offset or ms) not below the literal,
    ``first_above`` the first above it."""
    if isinstance(f, (ds.EqualTo, ds.EqualNullSafe)):
        return ScanFilter(**{start: first_at, end: first_above})
    if isinstance(f, ds.GreaterThan):
        return ScanFilter(**{start: first_above})
    if isinstance(f, ds.GreaterThanOrEqual):
        return ScanFilter(**{start: first_at})
    if isinstance(f, ds.LessThan):
        return ScanFilter(**{end: first_at})
    if isinstance(f, ds.LessThanOrEqual):
        return ScanFilter(**{end: first_above})
    return None
