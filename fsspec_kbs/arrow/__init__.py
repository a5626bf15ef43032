"""Arrow side of fsspec-kbs: the Kafka-like schema and conversions to and from records."""

from fsspec_kbs.arrow.convert import columns_to_batch, split_table
from fsspec_kbs.arrow.schema import COLUMNS, KAFKA_SCHEMA

__all__ = ["COLUMNS", "KAFKA_SCHEMA", "columns_to_batch", "split_table"]
