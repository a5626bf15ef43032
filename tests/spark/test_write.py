"""Writing DataFrames as KBS backups through a real local[2] SparkSession."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from fsspec_kbs.maintenance.validate import validate_backup
from tests.conftest import load_expected
from tests.spark.helpers import df_rows

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc


def _rows(n: int, topic: str = "t", partitions: int = 2, start: int = 0) -> list[tuple]:
    base = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return [(f"k{i}".encode(), f"v{i}".encode() if i % 7 else None, topic, i % partitions, start + i,
             base + dt.timedelta(milliseconds=i), [("h", f"{i}".encode())] if i % 3 == 0 else [])
            for i in range(n)]


SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          "headers array<struct<key:string,value:binary>>")


def _expected(rows: list[tuple]) -> list[dict]:
    out = [{"topic": t, "partition": p, "offset": o, "timestamp": int(ts.timestamp() * 1000), "key": k,
            "value": v, "headers": list(h)} for k, v, t, p, o, ts, h in rows]
    return sorted(out, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _check_valid(url: str, storage_options: dict | None = None) -> None:
    report = validate_backup(url, storage_options, deep=True)
    assert report.ok, report.defects


def test_round_trip_with_offsets(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(500)
    url = str(tmp_path / "backup-1")
    (spark.createDataFrame(rows, SCHEMA).repartition(3, "topic", "partition")
     .sortWithinPartitions("topic", "partition", "offset")
     .write.format("kbs").mode("overwrite").option("compression", "lz4").option("segmentMaxRecords", "40")
     .save(url))
    _check_valid(url)
    assert not (tmp_path / "backup-1" / "_staging").exists()
    df = spark.read.format("kbs").load(url)
    assert df_rows(df) == _expected(rows)
    assert json.loads((tmp_path / "backup-1" / "manifest.json").read_text())["compression"]["algorithm"] == "lz4"
    # Given offsets of one partition interleaved across tasks cannot be published segment by
    # segment: a clear error, and the backup stays as it was.
    with pytest.raises(Exception, match="overlap between tasks"):
        spark.createDataFrame(rows, SCHEMA).repartition(3).write.format("kbs").mode("overwrite").save(url)
    assert df_rows(spark.read.format("kbs").load(url)) == _expected(rows)


def test_conformance_rewrite(spark, conformance: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Read a conformance backup with Spark, write it back, read it again: same records."""
    case = conformance / "valid" / "zstd-v1.1"
    url = f"file://{tmp_path}/backup-2"
    spark.read.format("kbs").load(str(case / "backup-1")).write.format("kbs").mode("overwrite").save(url)
    _check_valid(url)
    assert df_rows(spark.read.format("kbs").load(url)) == load_expected(case / "expected.jsonl")


def test_offsets_assigned_densely_across_tasks(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    url = str(tmp_path / "backup-1")
    df = spark.range(0, 300, numPartitions=4).select(
        F.col("id").cast("string").alias("value"), (F.col("id") % 2).cast("int").alias("partition"))
    df.write.format("kbs").mode("overwrite").option("topic", "nums").option("segmentMaxRecords", "25").save(url)
    _check_valid(url)
    out = spark.read.format("kbs").load(url).toArrow().to_pylist()
    for p in (0, 1):
        got = sorted((r["offset"], int(r["value"])) for r in out if r["partition"] == p)
        assert [o for o, _ in got] == list(range(150))  # dense, from 0
        # Offsets follow task order (spark.range partitions are id-ordered): value order kept.
        assert [v for _, v in got] == sorted(v for _, v in got)
    # Append without offsets continues each partition.
    df.limit(10).write.format("kbs").mode("append").option("topic", "nums").save(url)
    _check_valid(url)
    out = spark.read.format("kbs").where("partition = 0").toArrow() if False else \
        spark.read.format("kbs").load(url).where("partition = 0").toArrow()
    assert sorted(out.column("offset").to_pylist()) == list(range(155))


def test_append_refuses_offsets_going_backwards(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = str(tmp_path / "backup-1")
    spark.createDataFrame(_rows(50), SCHEMA).coalesce(1).write.format("kbs").mode("overwrite").save(url)
    spark.createDataFrame(_rows(20, start=50), SCHEMA).coalesce(1).write.format("kbs").mode("append").save(url)
    assert spark.read.format("kbs").load(url).count() == 70
    with pytest.raises(Exception, match="OffsetOrderError"):
        spark.createDataFrame(_rows(20, start=10), SCHEMA).coalesce(1).write.format("kbs").mode("append").save(url)
    # The committed backup is untouched and no staging is left behind.
    _check_valid(url)
    assert spark.read.format("kbs").load(url).count() == 70
    assert not list((tmp_path / "backup-1").rglob("_staging/*/*"))  # at most an abort marker


def test_string_values_and_default_topic(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = str(tmp_path / "backup-1")
    spark.createDataFrame([("a", "x"), (None, "y")], "key string, value string").coalesce(1) \
        .write.format("kbs").mode("overwrite").option("topic", "s").save(url)
    rows = spark.read.format("kbs").load(url).orderBy("offset").collect()
    assert [(r.key, r.value, r.topic, r.partition, r.offset) for r in rows] == \
        [(b"a", b"x", "s", 0, 0), (None, b"y", "s", 0, 1)]
    with pytest.raises(Exception, match="topic"):
        spark.createDataFrame([("x",)], "value string").write.format("kbs").mode("overwrite") \
            .save(str(tmp_path / "backup-2"))
    with pytest.raises(Exception, match="value"):
        spark.createDataFrame([("x",)], "key string").write.format("kbs").mode("overwrite") \
            .option("topic", "s").save(str(tmp_path / "backup-3"))


def test_failing_task_leaves_no_manifest(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    url = str(tmp_path / "backup-1")
    # One row has an illegal topic name: its task fails after the other task staged segments.
    df = spark.range(0, 200, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        F.when(F.col("id") == 199, F.lit("bad/topic")).otherwise(F.lit("ok")).alias("topic"))
    with pytest.raises(Exception, match="InvalidNameError|illegal topic"):
        df.write.format("kbs").mode("overwrite").save(url)
    assert not (tmp_path / "backup-1" / "manifest.json").exists()
    assert not list((tmp_path / "backup-1").rglob("*.kbs"))

    # A failed overwrite keeps the backup that was there.
    spark.createDataFrame(_rows(30), SCHEMA).write.format("kbs").mode("overwrite").save(url)
    with pytest.raises(Exception, match="InvalidNameError|illegal topic"):
        df.write.format("kbs").mode("overwrite").save(url)
    _check_valid(url)
    assert df_rows(spark.read.format("kbs").load(url)) == _expected(_rows(30))
    # A task still running when the job aborted removes its own files when it notices the abort
    # marker; one that Spark killed mid-write cannot, so anything left must sit under a job
    # marked aborted, which the next successful write removes.
    staging = tmp_path / "backup-1" / "_staging"
    markers = {p.name for p in staging.glob("*.aborted")}
    leftovers = [p for p in staging.glob("*/*")]
    assert all(f"{p.parent.name}.aborted" in markers for p in leftovers), (leftovers, markers)
    # The next successful write removes what aborted jobs left; their markers stay for a day so
    # a straggling task of an aborted job still learns that it must clean up.
    spark.createDataFrame(_rows(30), SCHEMA).write.format("kbs").mode("overwrite").save(url)
    assert not [p for p in staging.glob("*/*") if f"{p.parent.name}.aborted" not in markers]


def test_abort_markers_expire(tmp_path: Path) -> None:
    import fsspec

    from fsspec_kbs.spark.writer import MARKER_TTL_S, remove_aborted_leftovers

    fs = fsspec.filesystem("file")
    root = tmp_path / "_staging"
    for job, age in (("old", MARKER_TTL_S + 60), ("new", 60)):
        (root / job / "task").mkdir(parents=True)
        (root / job / "task" / "segment-00000000.kbs").write_bytes(b"x")
        (root / f"{job}.aborted").write_text(json.dumps({"aborted_at": 1e9 - age}))
    (root / "live" / "task").mkdir(parents=True)  # a job still running: not touched
    remove_aborted_leftovers(fs, str(root), now=1e9)
    assert sorted(p.name for p in root.iterdir()) == ["live", "new.aborted"]


@pytest.mark.s3
def test_write_read_s3(spark, s3_root: str, s3_storage_options: dict) -> None:  # type: ignore[no-untyped-def]
    url = f"{s3_root}/backup-1"
    so = json.dumps(s3_storage_options)
    rows = _rows(200, partitions=3)
    spark.createDataFrame(rows, SCHEMA).repartition(2, "partition").sortWithinPartitions("partition", "offset") \
        .write.format("kbs").mode("overwrite").option("storage_options", so).save(url)
    _check_valid(url, s3_storage_options)
    df = spark.read.format("kbs").option("storage_options", so).load(url)
    assert df_rows(df) == _expected(rows)
    assert df_rows(df.where("partition = 2 and offset >= 100")) == [
        r for r in _expected(rows) if r["partition"] == 2 and r["offset"] >= 100]
