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
