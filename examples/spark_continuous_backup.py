"""Keep a KBS backup of Kafka topics up to date with Spark Structured Streaming, exactly once.

``readStream.format("kafka")`` -> ``writeStream.format("kbs")``: every micro-batch becomes one
commit of the backup, with the records' own offsets, timestamps and headers. Stop the query
(or kill the driver) at any time and start it again with the same checkpoint: the backup
ends up with every record exactly once.

Run::

    scripts/kafka.sh start        # or any broker
    python examples/spark_continuous_backup.py --bootstrap localhost:9092 --topic orders \\
        --backup /tmp/backups/orders-1 --checkpoint /tmp/checkpoints/orders-1

``--available-now`` backs up what the topics hold now and exits (a catch-up run, e.g. from
cron); otherwise the query runs until interrupted. Needs the ``spark`` extra, Java 17+ and
Spark's Kafka source (``spark.jars.packages`` below, or ``--jars``; see docs/spark.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

from fsspec_kbs.spark import register

#: Columns the kbs sink takes from Spark's Kafka source (``timestampType`` is not stored).
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


def build_session(jars: str | None) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master("local[2]").appName("kbs-continuous-backup")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "2"))
    if jars:
        builder = builder.config("spark.jars", jars)
    else:  # resolved from Maven Central on first use
        import pyspark

        builder = builder.config("spark.jars.packages",
                                 f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_backup(spark: SparkSession, bootstrap: str, topic: str, backup: str, checkpoint: str, *,
                 available_now: bool = False, trigger_seconds: float = 5.0,
                 max_offsets_per_trigger: int | None = None):  # type: ignore[no-untyped-def]
    """Start the continuous backup query; returns the ``StreamingQuery``."""
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest")  # only for a new checkpoint
              .option("includeHeaders", "true"))
    if max_offsets_per_trigger:
        source = source.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (source.load().select(*KAFKA_COLUMNS).writeStream.format("kbs")
              .option("checkpointLocation", checkpoint)
              .option("compression", "zstd"))
    writer = writer.trigger(availableNow=True) if available_now else \
        writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start(backup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True, help="topic(s), comma-separated")
    p.add_argument("--backup", required=True, help="backup directory (any fsspec URL)")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (keep it with the backup)")
    p.add_argument("--available-now", action="store_true", help="back up what is there now, then exit")
    p.add_argument("--trigger-seconds", type=float, default=5.0)
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--jars", default=os.environ.get("KBS_SPARK_KAFKA_JARS"),
                   help="Spark's Kafka source jars (default: resolved from Maven Central)")
    args = p.parse_args()
    spark = build_session(args.jars)
    q = start_backup(spark, args.bootstrap, args.topic, args.backup, args.checkpoint,
                     available_now=args.available_now, trigger_seconds=args.trigger_seconds,
                     max_offsets_per_trigger=args.max_offsets_per_trigger)
    print(f"query {q.id} backing up {args.topic} to {args.backup}", flush=True)
    try:
        q.awaitTermination()
    except KeyboardInterrupt:
        q.stop()
    if q.exception() is not None:
        raise SystemExit(f"backup query failed: {q.exception()}")
    spark.stop()


if __name__ == "__main__":
    main()
