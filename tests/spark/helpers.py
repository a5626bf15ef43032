"""Helpers shared by the Spark tests."""

from __future__ import annotations

import pyarrow as pa

from tests.conftest import table_rows


def df_rows(df) -> list[dict]:  # type: ignore[no-untyped-def]
    """Rows of a Kafka-schema DataFrame in the form of ``load_expected`` (sorted)."""
    table = df.toArrow()
    i = table.schema.get_field_index("timestamp")
    table = table.set_column(i, "timestamp", table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")))
    return table_rows(table)


def add_batch_indexes(url: str) -> int:
    """Give every segment of the local backup at ``url`` its batch index (spec §7), listed in
    ``manifest.json`` (1.2): test helper until every writer writes indexes itself."""
    from benchmarks.spark_read import index_backup

    return index_backup(url)
