"""Write a small backup with Spark, read it back, and filter it (segments are pruned).

Run::

    python examples/spark_read_write.py

Needs the ``spark`` extra (PySpark >= 4.1) and Java 17+.
"""

from __future__ import annotations

import os
import sys
import tempfile

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.spark import register


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Lets the kbs reader take filters on topic/partition/offset/timestamp (PySpark >= 4.1).
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # picks the pushdown reader because the setting above is on

    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/backup-1"

        # Kafka-sink columns: value is required; key/partition/timestamp/headers are optional.
        # No offset column: offsets are assigned densely per partition (0, 1, 2, ...).
        events = spark.range(0, 10_000, numPartitions=4).select(
            F.format_string("user-%d", F.col("id") % 100).alias("key"),
            F.to_json(F.struct("id", (F.col("id") * 3).alias("amount"))).alias("value"),
            (F.col("id") % 3).cast("int").alias("partition"),
            (F.lit("2026-01-01").cast("timestamp") + F.make_interval(secs=F.col("id"))).alias("timestamp"),
        )
        (events.write.format("kbs").mode("overwrite")
         .option("topic", "orders")
         .option("compression", "zstd")
         .option("segmentMaxRecords", "1000")  # small segments, so that pruning shows
         .save(url))
        print("validate --deep:", "ok" if validate_backup(url, deep=True).ok else "DEFECTS")

        df = spark.read.format("kbs").option("minPartitionBytes", "0").load(url)
        df.printSchema()
        print("records:", df.count(), "input partitions (one per segment):", df.rdd.getNumPartitions())

        # Pushed down: only the segments of partition 1 holding offsets >= 3000 are opened.
        recent = df.where((F.col("partition") == 1) & (F.col("offset") >= 3000))
        print("after the filter, input partitions:", recent.rdd.getNumPartitions())
        recent.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"), "offset", "timestamp").show(5, False)

        # Options work like the Kafka source's.
        window = (spark.read.format("kbs")
                  .option("startingOffsets", '{"orders": {"0": 100}}')
                  .option("endingOffsets", '{"orders": {"0": 105}}')
                  .option("partitions", "0")
                  .load(url))
        print("offsets 100..104 of orders/0:", [r.offset for r in window.orderBy("offset").collect()])
    spark.stop()


if __name__ == "__main__":
    main()
