"""The Arrow schema of a backup's records: the same columns as Spark's Kafka source."""

from __future__ import annotations

import functools

import pyarrow as pa

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])

#: Column names and types are a documented contract (docs/api.md).
KAFKA_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", pa.list_(HEADER_TYPE)),
])
COLUMNS = tuple(KAFKA_SCHEMA.names)

VIEW_HEADER_TYPE = pa.struct([pa.field("key", pa.string_view()), pa.field("value", pa.binary_view())])
#: The same columns with the zero-copy view types (``binary_view=True`` reads).
KAFKA_VIEW_SCHEMA = pa.schema([
    KAFKA_SCHEMA.field("key").with_type(pa.binary_view()),
    KAFKA_SCHEMA.field("value").with_type(pa.binary_view()),
    *(KAFKA_SCHEMA.field(c) for c in COLUMNS[2:7]),
    pa.field("headers", pa.list_(VIEW_HEADER_TYPE)),
])


def project(columns: list[str] | tuple[str, ...] | None, views: bool = False) -> pa.Schema:
    """Schema restricted to ``columns`` (in the caller's order); ``views``: the view types."""
    if columns is None:
        return KAFKA_VIEW_SCHEMA if views else KAFKA_SCHEMA
    return _project(tuple(columns), views)


@functools.lru_cache(maxsize=64)  # once per scan, not once per decoded chunk
def _project(columns: tuple[str, ...], views: bool) -> pa.Schema:
    schema = KAFKA_VIEW_SCHEMA if views else KAFKA_SCHEMA
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; a backup has {list(COLUMNS)}")
    return pa.schema([schema.field(c) for c in columns])
