"""Plain-object tests: option parsing, filter translation, planning, pickling (no SparkSession)."""

from __future__ import annotations

import datetime as dt
import json
import pickle

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import (  # noqa: E402
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from fsspec_kbs.spark import (  # noqa: E402
    KbsCommitMessage,
    KbsPushdownReader,
    KbsReader,
    KbsSegmentPartition,
    parse_options,
)
from fsspec_kbs.spark.filters import translate  # noqa: E402
from fsspec_kbs.spark.partition import SegmentPiece  # noqa: E402
from fsspec_kbs.spark.source import spark_schema  # noqa: E402
from fsspec_kbs.store import SegmentRef  # noqa: E402

pytestmark = pytest.mark.spark

COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def test_schema_is_kafka_source_schema() -> None:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kafka = StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                     StructField("value", BinaryType())]))),
    ])
    assert spark_schema() == kafka
    assert spark_schema(include_headers=False) == StructType(kafka.fields[:-1])


def test_parse_options() -> None:
    o = parse_options({
        "path": "s3://b/backups/backup-1", "topics": "orders, payments", "partitions": "0,2",
        "startingOffsets": json.dumps({"orders": {"0": 23, "1": -2}}),
        "endingOffsets": json.dumps({"orders": {"0": 50, "1": -1}}),
        "storage.endpoint_url": "http://127.0.0.1:9", "storage.anon": "false",
        "storage_options": json.dumps({"key": "AKIA", "secret": "s3cr3t"}),
        "verifyChecksums": "false", "onCorrupt": "skip", "failOnDataLoss": "false", "minPartitions": "7",
    })
    assert o.topics == ("orders", "payments") and o.partitions == (0, 2)
    assert o.storage_options == {"key": "AKIA", "secret": "s3cr3t", "endpoint_url": "http://127.0.0.1:9",
                                 "anon": False}
    assert not o.verify_checksums and o.on_corrupt == "skip" and not o.fail_on_data_loss and o.min_partitions == 7
    assert "s3cr3t" not in repr(o) and "AKIA" not in repr(o)
    sf = o.scan_filter()
    assert sf.bounds("orders", 0) == (23, 50)
    assert sf.bounds("orders", 1) == (None, None)
    assert sf.topics == frozenset({"orders", "payments"})
    t = parse_options({"path": "x", "subscribe": "orders", "startingTimestamp": "1000",
                       "endingTimestamp": "2026-01-01T00:00:00Z"})
    assert t.starting_timestamp == 1000 and t.ending_timestamp == 1767225600000 and t.time_lookups
    a = parse_options({"path": "x", "assign": '{"orders": [1, 0], "b": [3]}',
                       "startingOffsetsByTimestamp": '{"orders": {"0": 5}}',
                       "endingOffsetsByTimestamp": '{"orders": {"0": 9}}',
                       "startingOffsetsByTimestampStrategy": "LATEST"})
    assert a.assign == (("b", 3), ("orders", 0), ("orders", 1)) and a.wants("orders", 1) and not a.wants("b", 0)
    assert a.starting_offsets_by_timestamp == {"orders": {"0": 5}} and a.by_timestamp_strategy == "latest"
    # What Spark itself passes: .load([one]) arrives as "paths" (a JSON list); keys in lower case.
    assert parse_options({"paths": '["s3://b/x"]'}).path == "s3://b/x"
    assert parse_options({"subscribepattern": "o.*", "path": "p"}).topic_pattern == "o.*"
    w = parse_options({"path": "p", "topic": " t ", "compression": "lz4", "storage.anon": "true"}, "write")
    assert (w.topic, w.compression, w.storage_options) == ("t", "lz4", {"anon": True})


@pytest.mark.parametrize("opts, match", [
    ({}, "needs a path"),
    ({"path": "x", "onCorrupt": "ignore"}, "onCorrupt"),
    ({"path": "x", "startingOffsets": "latest"}, "latest"),
    ({"path": "x", "endingOffsets": '{"t": {"0": -2}}'}, "earliest"),
    ({"path": "x", "startingOffsets": '{"t": [1]}'}, "startingOffsets"),
    ({"path": "x", "startingOffsets": '{"t": {"0": 9}}', "endingOffsets": '{"t": {"0": 3}}'}, "above"),
    ({"path": "x", "partitions": "a"}, "partitions"),
    ({"path": "x", "storage_options": '{"secret": "hunter2"'}, "not shown"),
    ({"path": "x", "topicPattern": "("}, "topicPattern"),
    ({"path": "x", "subscribe": " , "}, "names no topic"),
    ({"path": "x", "assign": "orders"}, "assign"),
    ({"path": "x", "assign": '{"orders": ["a"]}'}, "assign"),
    ({"path": "x", "startingOffsetsByTimestamp": '{"t": {"0": "x"}}'}, "startingOffsetsByTimestamp"),
    ({"path": "x", "startingOffsetsByTimestampStrategy": "earliest"}, "Strategy"),
    ({"path": "x", "minPartitions": "0"}, "minPartitions"),
    ({"paths": '["a", "b"]'}, "one backup at a time"),
    # unknown options, with the closest known one
    ({"path": "x", "subscirbe": "orders"}, "unknown option 'subscirbe'.*did you mean 'subscribe'"),
    ({"path": "x", "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
    ({"path": "x", "bogus": "1"}, "unknown option 'bogus'"),
    # conflicts, as validateBatchOptions (only one way to choose topics)
    ({"path": "x", "subscribe": "a", "subscribePattern": "b.*"}, "'subscribe' and 'subscribePattern' cannot"),
    ({"path": "x", "topics": "a", "assign": '{"a": [0]}'}, "cannot be used together"),
    ({"path": "x", "assign": '{"a": [0]}', "partitions": "0"}, "'assign' and 'partitions'"),
    ({"path": "x", "startingOffsets": "earliest", "startingTimestamp": "5"}, "cannot be used together"),
    ({"path": "x", "endingOffsetsByTimestamp": '{"a": {"0": 5}}', "endingTimestamp": "5"}, "cannot be used"),
    # Kafka options that make no sense for a backup
    ({"path": "x", "kafka.bootstrap.servers": "h:9092"}, "Kafka client setting.*not a Kafka cluster"),
    ({"path": "x", "maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger.*micro-batch of a streaming"),
    ({"path": "x", "groupIdPrefix": "g"}, "no Kafka consumer"),
    # write options on a read
    ({"path": "x", "compression": "zstd"}, "'compression' is a write option"),
])
def test_bad_options(opts: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_options(opts)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("opts, match", [
    ({"path": "x", "startingOffsets": "earliest"}, "'startingOffsets' is a read option"),
    ({"path": "x", "kafka.bootstrap.servers": "h:9092"}, "writes a backup to storage"),
    ({"path": "x", "compresion": "lz4"}, "did you mean 'compression'"),
    ({"path": "x", "compression": "gzip"}, "compression"),
    ({}, r"needs a path: \.save"),
])
def test_bad_write_options(opts: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_options(opts, "write")


def test_translate_filters() -> None:
    ts = dt.datetime(2026, 1, 1, 0, 0, 0, 500, tzinfo=dt.timezone.utc)  # 0.5 ms past a ms boundary
    ms = 1767225600000
    keep_not = Not(EqualTo(("topic",), "x"))
    keep_in = In(("offset",), (5, 9))
    keep_other = EqualTo(("value",), b"v")
    pushed = [EqualTo(("topic",), "orders"), In(("partition",), (0, 1)), GreaterThanOrEqual(("offset",), 3),
              LessThan(("offset",), 100), GreaterThan(("timestamp",), ts), LessThanOrEqual(("timestamp",), ts + dt.timedelta(seconds=1)),
              IsNotNull(("offset",)), StringStartsWith(("topic",), "ord")]
    sf, rest = translate([*pushed, keep_not, keep_in, keep_other])
    assert rest == [keep_not, keep_in, keep_other]
    assert all(r is o for r, o in zip(rest, [keep_not, keep_in, keep_other], strict=True))
    assert sf.topics == frozenset({"orders"}) and sf.partitions == frozenset({0, 1})
    assert (sf.start_offset, sf.end_offset) == (5, 10)  # offset IN narrows to 5..9 as well
    # ts > 0.5 ms past `ms` -> first whole ms above is ms + 1; ts + 1 s (inclusive) -> end ms + 1001
    assert (sf.start_time, sf.end_time) == (ms + 1, ms + 1001)
    assert sf.wants_partition("orders", 1) and not sf.wants_partition("orders", 2)
    # exact ms bounds
    sf2, _ = translate([GreaterThanOrEqual(("timestamp",), dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)),
                        LessThan(("timestamp",), dt.datetime(2026, 1, 1, 0, 0, 1))])  # naive = UTC
    assert (sf2.start_time, sf2.end_time) == (ms, ms + 1000)
    assert pickle.loads(pickle.dumps(sf)) == sf  # the reader ships it to executors


def test_reader_plans_and_pickles(conformance) -> None:  # type: ignore[no-untyped-def]
    url = str(conformance / "valid" / "zstd-v1.1" / "backup-1")
    every = KbsReader(parse_options({"path": url, "minPartitionBytes": "0"}), COLS).partitions()
    assert sum(len(p.segments) for p in every) == len(every) == 6  # one partition per segment
    grouped = KbsReader(parse_options({"path": url}), COLS).partitions()
    assert len(grouped) == 1 and len(grouped[0].segments) == 6  # small segments packed together

    reader = KbsPushdownReader(parse_options({"path": url, "minPartitionBytes": "0"}), COLS)
    f_part = EqualTo(("partition",), 1)
    f_value = EqualTo(("value",), b"x")
    rest = reader.pushFilters([EqualTo(("topic",), "orders"), f_part, f_value])
    assert list(rest) == [f_value]
    parts = reader.partitions()
    assert [(s.ref.topic, s.ref.partition) for p in parts for s in p.segments] == [("orders", 1)] * 2
    # Partitions and the reader after pushFilters hold small frozen values only.
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.pushed == reader.pushed and clone.partitions() == parts
    for p in parts:
        assert pickle.loads(pickle.dumps(p)) == p
        assert all(type(s) is SegmentPiece and type(s.ref) is SegmentRef for s in p.segments)
    # Nothing matches: one empty partition, read yields nothing.
    none = KbsPushdownReader(parse_options({"path": url}), COLS)
    none.pushFilters([EqualTo(("topic",), "nope")])
    assert none.partitions() == [KbsSegmentPartition(0)]
    assert list(none.read(none.partitions()[0])) == []


def test_read_in_process_matches_expected(conformance) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa

    from tests.conftest import load_expected, table_rows

    case = conformance / "valid" / "lz4-v1.1"
    reader = KbsReader(parse_options({"path": str(case / "backup-1")}), COLS)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    table = pa.Table.from_batches(batches)
    table = table.set_column(5, "timestamp", table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")))
    assert table_rows(table) == load_expected(case / "expected.jsonl")


def test_commit_message_pickles() -> None:
    m = KbsCommitMessage(3, "abc", [{"topic": "t", "partition": 0, "seq": 0, "path": "/x/y.kbs", "first_offset": 0,
                                     "last_offset": 9, "records": 10, "min_timestamp": 1, "max_timestamp": 2,
                                     "size_bytes": 100, "crc64": 7, "uncompressed_bytes": 200, "batches": 1}],
                         ["t/0"], 10)
    assert pickle.loads(pickle.dumps(m)) == m
