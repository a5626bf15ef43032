"""The Spark data source's writes carry batch indexes (kbs-format.md §7): staged by each task
beside its segments, moved by the driver's commit, rebuilt when offsets are shifted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.test_index_writers import check_indexes

pytestmark = pytest.mark.spark


def test_spark_writes_indexes(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    url = str(tmp_path / "backup-1")
    # With offsets: each task's staged segments (and indexes) are adopted as they are.
    df = spark.range(0, 400, numPartitions=2).select(
        F.col("id").alias("offset"), F.col("id").cast("string").alias("value"), F.lit(0).alias("partition"))
    df.write.format("kbs").mode("overwrite").option("topic", "nums").option("segmentMaxRecords", "60").save(url)
    assert check_indexes(url) >= 7
    # Without offsets, across tasks: later tasks' segments are shifted and re-encoded (new indexes).
    df = spark.range(0, 300, numPartitions=3).select(
        F.col("id").cast("string").alias("value"), (F.col("id") % 2).cast("int").alias("partition"))
    df.write.format("kbs").mode("overwrite").option("topic", "nums").option("segmentMaxRecords", "25").save(url)
    assert check_indexes(url) >= 12
    assert not list((tmp_path / "backup-1").glob("_staging/*"))
