"""Back up a Kafka topic with Spark and restore it into a new topic: the distributed way.

Spark's own Kafka source reads the topic over many tasks, ``format("kbs")`` writes the backup
(every field kept exactly); then ``format("kbs")`` reads it back and Spark's Kafka sink writes
it to ``<topic>-restored``. Run against any broker::

    python examples/spark_kafka_backup_restore.py --bootstrap 127.0.0.1:9092 --topic orders \\
        --backup /tmp/orders-backup

``--demo N`` first creates the topic and produces N records with headers (needs
confluent-kafka). Without a broker at hand: ``scripts/kafka.sh start`` prints one
(``KBS_KAFKA_BOOTSTRAP``); ``$KBS_KAFKA_BOOTSTRAP`` is the default of ``--bootstrap``.

Needs the ``spark`` extra, Java 17+, and Spark's Kafka source on the classpath: ``--jars``
(default: what ``scripts/spark_kafka_jars.sh`` resolves from Maven Central for this pyspark).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.spark import register

REPO = Path(__file__).resolve().parents[1]


def spark_kafka_jars() -> str:
    out = subprocess.run(["bash", str(REPO / "scripts" / "spark_kafka_jars.sh")], capture_output=True, text=True,
                         env={**os.environ, "KBS_PYTHON": sys.executable}, check=True)
    return out.stdout.strip()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` unless it exists (Spark's Kafka sink writes to existing partitions only)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result()


def produce_demo(bootstrap: str, topic: str, n: int, partitions: int = 4) -> None:
    from confluent_kafka import Producer

    create_topic(bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(n):
        headers = [("trace-id", f"{i:016x}".encode())] if i % 5 == 0 else None
        p.produce(topic, f'{{"order": {i}, "amount": {i % 97}.50}}'.encode(), f"customer-{i % 1000}".encode(),
                  i % partitions, headers=headers)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("KBS_KAFKA_BOOTSTRAP"),
                    help="Kafka bootstrap servers (default: $KBS_KAFKA_BOOTSTRAP)")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--backup", required=True, help="backup URL or directory (any fsspec URL)")
    ap.add_argument("--restore-to", help="target topic (default: <topic>-restored; must not hold records)")
    ap.add_argument("--min-partitions", type=int, default=8, help="tasks the Kafka source splits the topic into")
    ap.add_argument("--demo", type=int, default=0, metavar="N", help="first create the topic with N records")
    ap.add_argument("--jars", help="comma-separated jars of spark-sql-kafka-0-10 and its dependencies")
    args = ap.parse_args()
    if not args.bootstrap:
        ap.error("--bootstrap (or $KBS_KAFKA_BOOTSTRAP) is required")
    target = args.restore_to or f"{args.topic}-restored"
    if args.demo:
        produce_demo(args.bootstrap, args.topic, args.demo)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("kbs-backup-restore")
             .config("spark.jars", args.jars or spark_kafka_jars())
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        # Backup: the topic, split over --min-partitions tasks, into a KBS backup.
        source = (spark.read.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                  .option("subscribe", args.topic).option("includeHeaders", "true")
                  .option("minPartitions", str(args.min_partitions)).load())
        source.write.format("kbs").mode("overwrite").save(args.backup)
        report = validate_backup(args.backup, deep=True)
        backup = spark.read.format("kbs").load(args.backup)
        print(f"backup: {backup.count()} records, valid={report.ok}")
        backup.groupBy("partition").agg(F.count("*").alias("records"), F.min("offset").alias("first"),
                                        F.max("offset").alias("last")).orderBy("partition").show()

        # Restore: one task per Kafka partition, in offset order, into the target topic.
        create_topic(args.bootstrap, target, backup.agg(F.max("partition")).first()[0] + 1)
        (backup.repartition("partition").sortWithinPartitions("partition", "offset")
         .select(F.lit(target).alias("topic"), "partition", "key", "value", "headers")
         .write.format("kafka").option("kafka.bootstrap.servers", args.bootstrap).save())
        restored = (spark.read.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                    .option("subscribe", target).option("includeHeaders", "true").load())
        same = backup.select("partition", "key", "value", "headers").exceptAll(
            restored.select("partition", "key", "value", "headers")).count() == 0
        print(f"restored {restored.count()} records into {target}; same keys, values, headers: {same}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
