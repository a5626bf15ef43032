"""The ``kbs`` PySpark data source: Kafka-source schema over KBS backups on any fsspec URL."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from fsspec_kbs.arrow import KAFKA_SCHEMA
from fsspec_kbs.spark.options import parse_options
from fsspec_kbs.spark.reader import KbsPushdownReader, KbsReader
from fsspec_kbs.spark.stream_reader import KbsStreamReader, parse_stream_options
from fsspec_kbs.spark.stream_writer import KbsStreamWriter, parse_stream_write_options
from fsspec_kbs.spark.writer import KbsWriter

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def spark_schema(include_headers: bool = True) -> StructType:
    """The Spark schema of a backup: Spark's Kafka source columns (headers optional, as there)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = KAFKA_SCHEMA if include_headers else KAFKA_SCHEMA.remove(KAFKA_SCHEMA.get_field_index("headers"))
    return from_arrow_schema(schema)


class KbsDataSource(DataSource):
    """Read KBS backups as DataFrames and write DataFrames as KBS backups.

    Options are listed in docs/spark.md. This class does not push filters down (so it works
    whatever ``spark.sql.python.filterPushdown.enabled`` says); :func:`fsspec_kbs.spark.register`
    picks :class:`KbsPushdownDataSource` when the setting is on.

    Examples
    --------
    >>> spark.dataSource.register(KbsDataSource)  # doctest: +SKIP
    >>> spark.read.format("kbs").option("topics", "orders").load("s3://bucket/backups/backup-1")  # doctest: +SKIP

    .. versionadded:: 0.1.0
    """

    @classmethod
    def name(cls) -> str:
        return "kbs"

    def schema(self) -> StructType:
        # Fixed: never reads the backup.
        # Parsing here checks the options when the DataFrame is defined, as the Kafka source does
        # Spark does not say whether a read or a stream is defined: options valid for either pass.
        options = {"path": "-", **self.options}
        try:
            include = parse_options(options, "read").include_headers
        except ValueError as batch_error:
            try:
                include = parse_stream_options(options).read.include_headers
            except ValueError:
                raise batch_error from None
        return spark_schema(include)

    def reader(self, schema: StructType) -> KbsReader:
        return KbsReader(parse_options(self.options, "read"), schema.fieldNames())

    def writer(self, schema: StructType, overwrite: bool) -> KbsWriter:
        if "value" not in schema.fieldNames():
            raise ValueError("writing to kbs needs a 'value' column (binary or string), "
                             "like Spark's Kafka sink")
        return KbsWriter(parse_options(self.options, "write"), overwrite)

    def streamReader(self, schema: StructType) -> KbsStreamReader:  # noqa: N802 - Spark's hook name
        return KbsStreamReader(parse_stream_options(self.options), schema.fieldNames())

    def streamWriter(self, schema: StructType, overwrite: bool) -> KbsStreamWriter:  # noqa: N802
        if overwrite:
            raise ValueError("the kbs sink supports the 'append' output mode only: a backup, like a Kafka "
                             "topic, is never truncated by a stream")
        if "value" not in schema.fieldNames():
            raise ValueError("writing to kbs needs a 'value' column (binary or string), "
                             "like Spark's Kafka sink")
        return KbsStreamWriter(parse_stream_write_options(self.options))


class KbsPushdownDataSource(KbsDataSource):
    """:class:`KbsDataSource` whose reader prunes segments by Spark's pushed filters (PySpark >= 4.1)."""

    def reader(self, schema: StructType) -> KbsPushdownReader:
        return KbsPushdownReader(parse_options(self.options, "read"), schema.fieldNames())
