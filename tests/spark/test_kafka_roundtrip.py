"""Distributed backup and restore on Spark against a real broker (issue 22 item 4).

``spark.read.format("kafka")`` → ``write.format("kbs")`` must keep every field exactly, also
when the Kafka source splits each partition over several tasks (``minPartitions``) so that
several writer tasks hold pieces of one partition; ``spark.read.format("kbs")`` →
``write.format("kafka")`` restores the records to a new topic.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("confluent_kafka")

from pyspark.sql import functions as F  # noqa: E402

from fsspec_kbs.maintenance.validate import validate_backup  # noqa: E402
from tests.fixtures.spark import require_spark_kafka  # noqa: E402
from tests.kafka.helpers import consume_all, create_topic, make_records, produce  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N_RECORDS = 30_000
PARTITIONS = 4
COLS = ["topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers"]


def _rows(table: pa.Table) -> list[tuple]:
    """Rows as comparable tuples, sorted by (topic, partition, offset); timestamps in ms."""
    d = table.select(COLS).to_pydict()
    out = []
    for i in range(table.num_rows):
        ts = d["timestamp"][i]
        hs = d["headers"][i]
        out.append((d["topic"][i], d["partition"][i], d["offset"][i],
                    None if ts is None else int(ts.timestamp() * 1000) if hasattr(ts, "timestamp") else ts,
                    d["timestampType"][i], d["key"][i], d["value"][i],
                    None if hs is None else [(h["key"], h["value"]) for h in hs]))
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def _produced_rows(produced: list[dict]) -> list[tuple]:
    return sorted(((r["topic"], r["partition"], r["offset"], r["timestamp"], 0, r["key"], r["value"],
                    None if not r["headers"] else [tuple(h) for h in r["headers"]]) for r in produced),
                  key=lambda r: (r[0], r[1], r[2]))


@pytest.fixture(scope="module")
def topic(kafka_broker) -> tuple[str, list[tuple]]:  # type: ignore[no-untyped-def]
    conf = kafka_broker.config()
    name = kafka_broker.new_topic("spark-src")
    create_topic(conf, name, PARTITIONS)
    return name, _produced_rows(produce(conf, name, make_records(N_RECORDS, PARTITIONS, seed=22)))


def _kafka_df(spark, bootstrap: str, topic: str, **opts: str):  # type: ignore[no-untyped-def]
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("includeHeaders", "true"))
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.mark.parametrize("min_partitions", [None, 12])
def test_kafka_to_kbs_keeps_every_field(spark, kafka_broker, topic, tmp_path, min_partitions) -> None:  # type: ignore[no-untyped-def]
    require_spark_kafka(spark)
    name, produced = topic
    opts = {} if min_partitions is None else {"minPartitions": str(min_partitions)}
    src = _kafka_df(spark, kafka_broker.bootstrap, name, **opts)
    if min_partitions is not None:
        assert src.rdd.getNumPartitions() >= min_partitions  # several writer tasks per partition
    url = f"file://{tmp_path}/backup"
    src.write.format("kbs").mode("overwrite").save(url)
    assert validate_backup(url, deep=True).ok

    # What Spark's own Kafka source reads is what was produced ...
    assert _rows(src.toArrow()) == produced
    # ... and the backup read back holds exactly those records, also split into many tasks.
    back = spark.read.format("kbs").load(url)
    assert _rows(back.toArrow()) == produced
    split = spark.read.format("kbs").option("minPartitions", "16").option("minPartitionBytes", "0").load(url)
    assert split.rdd.getNumPartitions() >= 16
    assert _rows(split.toArrow()) == produced
    # Headers are NULL for records without any, exactly as the Kafka source gives them.
    assert back.where(F.col("headers").isNull()).count() == src.where(F.col("headers").isNull()).count()


def test_kbs_to_kafka_restores(spark, kafka_broker, topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    require_spark_kafka(spark)
    name, produced = topic
    url = f"file://{tmp_path}/backup"
    _kafka_df(spark, kafka_broker.bootstrap, name).write.format("kbs").mode("overwrite").save(url)

    dst = kafka_broker.new_topic("spark-restored")
    create_topic(kafka_broker.config(), dst, PARTITIONS)
    (spark.read.format("kbs").option("minPartitions", "8").option("minPartitionBytes", "0").load(url)
     # One Spark task per Kafka partition, in offset order: the sink then writes each partition in order.
     .repartition(PARTITIONS, "partition").sortWithinPartitions("partition", "offset")
     .select(F.lit(dst).alias("topic"), "partition", "key", "value", "headers")
     .write.format("kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap).save())

    restored = consume_all(kafka_broker.config(), dst)
    # Spark's Kafka sink does not set record timestamps (the producer stamps the time of writing),
    # so the restore keeps partition, order, key, value and headers; offsets start at 0 here too.
    got = [(r["partition"], r["offset"], r["key"], r["value"], r["headers"]) for r in restored]
    want = [(p, off, k, v, h) for _, p, off, _, _, k, v, h in produced]
    assert got == want
