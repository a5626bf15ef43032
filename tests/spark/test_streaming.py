"""Structured Streaming on ``kbs``: the exactly-once sink and the growing-backup source, on a
real local[2] SparkSession (small data, ``Trigger.AvailableNow``: each query runs to the end)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.spark.stream_reader import parse_stream_options, rate_limit
from fsspec_kbs.store.commit import STREAMS_FIELD

pytestmark = pytest.mark.spark

HEADERS = ("case when offset % 3 = 0 then array(named_struct('key', 'h', 'value', cast(cast(offset as string) "
           "as binary))) end")


def _json_files(folder: Path, batches: list[range], partitions: int = 2, offsets: bool = True,
                first: int = 0) -> None:
    """One JSON file per range of record numbers: the file source reads one per micro-batch."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, rng in enumerate(batches):
        lines = []
        for n in rng:
            row = {"key": f"k{n}", "value": f"v{n}", "topic": "orders", "partition": n % partitions}
            if offsets:
                row["offset"] = n // partitions
            lines.append(json.dumps(row))
        path = folder / f"part-{first + i:04d}.json"
        path.write_text("\n".join(lines) + "\n")
        # The file source takes files oldest first: make the order the names' order.
        os.utime(path, (1_700_000_000 + first + i, 1_700_000_000 + first + i))


def _file_stream(spark, folder: Path, offsets: bool = True):  # type: ignore[no-untyped-def]
    schema = "key string, value string, topic string, partition int" + (", offset long" if offsets else "")
    df = spark.readStream.format("json").schema(schema).option("maxFilesPerTrigger", 1).load(str(folder))
    return df.selectExpr("*", f"{HEADERS} as headers") if offsets else df


def _to_kbs(df, url: str, checkpoint: Path):  # type: ignore[no-untyped-def]
    q = (df.writeStream.format("kbs").option("checkpointLocation", str(checkpoint))
         .option("segmentMaxRecords", "50").trigger(availableNow=True).start(url))
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    return q


def _backup_rows(spark, url: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    rows = spark.read.format("kbs").load(url).select("partition", "offset", "value", "headers").collect()
    return sorted((r.partition, r.offset, bytes(r.value).decode(),
                   None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers]) for r in rows)


def _forget_commit(checkpoint: Path, batch: int) -> None:
    """Spark's checkpoint forgets that ``batch`` was committed (a driver killed right after the
    sink's commit): the restart replays it with the same batch id."""
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)


def _manifest(url: str) -> dict:
    return json.loads((Path(url) / "manifest.json").read_text())


def test_sink_exactly_once_across_a_replayed_batch(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, ckpt, url = tmp_path / "in", tmp_path / "ckpt", str(tmp_path / "backup-1")
    _json_files(src, [range(0, 60), range(60, 120), range(120, 200)])
    q = _to_kbs(_file_stream(spark, src), url, ckpt)
    expected = sorted((n % 2, n // 2, f"v{n}", [("h", str(n // 2).encode())] if (n // 2) % 3 == 0 else None)
                      for n in range(200))
    assert _backup_rows(spark, url) == expected
    record = _manifest(url)[STREAMS_FIELD]
    assert record == {q.id: {"batch": 2, "txn": record[q.id]["txn"], "committed_at": record[q.id]["committed_at"]}}
    commits = sorted(p.name for p in (Path(url) / "_commits").iterdir())
    # The driver died after publishing batch 2 and before Spark's checkpoint recorded it:
    # the restart replays batch 2 with the same id, and the sink recognises it.
    _forget_commit(ckpt, 2)
    q2 = _to_kbs(_file_stream(spark, src), url, ckpt)
    assert q2.id == q.id
    assert _backup_rows(spark, url) == expected
    assert sorted(p.name for p in (Path(url) / "_commits").iterdir()) == commits  # nothing committed again
    assert not list((Path(url) / "_staging").glob("*/*"))
    # A new file: the next batch (3) is committed on top.
    _json_files(src, [range(200, 240)], first=3)
    _to_kbs(_file_stream(spark, src), url, ckpt)
    assert len(_backup_rows(spark, url)) == 240
    assert _manifest(url)[STREAMS_FIELD][q.id]["batch"] == 3
    report = validate_backup(url, deep=True)
    assert report.ok, report.defects
    # Every micro-batch's segments carry their batch index (kbs-format.md §7).
    entries = [e for t in _manifest(url)["topics"] for p in t["partitions"] for e in p["segment_index"]]
    assert entries and all(e.get("index_crc32") is not None for e in entries)
    assert all((Path(url) / "topics" / t["name"] / str(p["partition"]) / e["file"].replace(".kbs", ".index")).exists()
               for t in _manifest(url)["topics"] for p in t["partitions"] for e in p["segment_index"])
    assert not list((Path(url) / "_staging").rglob("*.index"))


def test_sink_dense_offsets_and_failed_batch(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, ckpt, url = tmp_path / "in", tmp_path / "ckpt", str(tmp_path / "backup-2")
    _json_files(src, [range(0, 30), range(30, 50)], partitions=1, offsets=False)
    _to_kbs(_file_stream(spark, src, offsets=False), url, ckpt)
    rows = _backup_rows(spark, url)
    assert [r[1] for r in rows] == list(range(50))  # numbered densely, batch after batch
    assert sorted(r[2] for r in rows) == sorted(f"v{n}" for n in range(50))
    _forget_commit(ckpt, 1)  # replay of batch 1: not numbered a second time
    _to_kbs(_file_stream(spark, src, offsets=False), url, ckpt)
    assert len(_backup_rows(spark, url)) == 50
    # A micro-batch that cannot be committed (offsets going backwards) fails the query and
    # leaves the backup exactly as it was.
    before = (Path(url) / "manifest.json").read_bytes()
    bad = tmp_path / "bad"
    _json_files(bad, [range(0, 10)], partitions=1)
    q = (_file_stream(spark, bad).writeStream.format("kbs").option("checkpointLocation", str(tmp_path / "c2"))
         .trigger(availableNow=True).start(url))
    with pytest.raises(Exception, match="offset"):
        q.awaitTermination(180)
    assert (Path(url) / "manifest.json").read_bytes() == before
    assert not list((Path(url) / "_staging").glob("*/*/*"))


def test_sink_refuses_complete_mode_and_unknown_options(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "in"
    _json_files(src, [range(0, 5)])
    df = _file_stream(spark, src)
    with pytest.raises(Exception, match="segmentMaxRecord"):
        q = (df.writeStream.format("kbs").option("checkpointLocation", str(tmp_path / "c"))
             .option("segmentMaxRecord", "5").trigger(availableNow=True).start(str(tmp_path / "b")))
        q.awaitTermination(120)
        raise AssertionError(str(q.exception()))
    counts = df.groupBy("topic").agg(F.count("*").cast("string").alias("value"))
    with pytest.raises(Exception, match="'append' output mode only"):
        q = (counts.writeStream.format("kbs").outputMode("complete").option("checkpointLocation", str(tmp_path / "c3"))
             .trigger(availableNow=True).start(str(tmp_path / "b")))
        q.awaitTermination(120)
        raise AssertionError(str(q.exception()))


def _write_backup(spark, url: str, start: int, n: int, mode: str = "append") -> None:  # type: ignore[no-untyped-def]
    (spark.range(start, start + n).selectExpr("cast(id as string) as value", "'t' as topic",
                                              "cast(id % 2 as int) as partition", "id div 2 as offset")
     .repartition(2, "partition").sortWithinPartitions("partition", "offset")
     .write.format("kbs").mode(mode).option("segmentMaxRecords", "20").save(url))


def _run(spark, url: str, ckpt: Path, **options: str) -> tuple[list[tuple], object]:  # type: ignore[no-untyped-def]
    """Run a ``kbs`` stream to the end into a Parquet sink (which, unlike ``memory``, restarts
    from its checkpoint); returns every row the sink holds."""
    reader = spark.readStream.format("kbs")
    for k, v in options.items():
        reader = reader.option(k, v)
    out = ckpt.parent / f"{ckpt.name}-out"
    q = (reader.load(url).select("partition", "offset", "value").writeStream.format("parquet")
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(str(out)))
    q.awaitTermination(180)
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    rows = sorted((r.partition, r.offset, bytes(r.value).decode()) for r in spark.read.parquet(str(out)).collect()) \
        if out.exists() and list(out.glob("*.parquet")) else []
    return rows, q


def test_source_reads_appended_segments(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, ckpt = str(tmp_path / "src-1"), tmp_path / "ckpt"
    _write_backup(spark, url, 0, 100, "overwrite")
    rows, _ = _run(spark, url, ckpt, startingOffsets="earliest")
    assert rows == sorted((n % 2, n // 2, str(n)) for n in range(100))
    # Another writer appends: the same query (checkpoint) reads only the new records.
    _write_backup(spark, url, 100, 60)
    rows, q = _run(spark, url, ckpt, startingOffsets="earliest")
    assert rows == sorted((n % 2, n // 2, str(n)) for n in range(160))  # each record once
    assert json.loads(q.lastProgress["sources"][0]["endOffset"]) == {"t": {"0": 80, "1": 80}}
    # Default startingOffsets is latest (as with the Kafka source): a new query reads nothing old.
    rows, _ = _run(spark, url, tmp_path / "ckpt-latest")
    assert rows == []


def test_source_max_offsets_per_trigger(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = str(tmp_path / "src-2")
    _write_backup(spark, url, 0, 200, "overwrite")
    rows, q = _run(spark, url, tmp_path / "ckpt", startingOffsets="earliest", maxOffsetsPerTrigger="60")
    assert rows == sorted((n % 2, n // 2, str(n)) for n in range(200))
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 60 and sum(sizes) == 200 and len(sizes) >= 4
    # Starting offsets as JSON, per partition (-2: earliest).
    rows, _ = _run(spark, url, tmp_path / "ckpt-json", startingOffsets='{"t": {"0": 95, "1": -2}}')
    assert rows == sorted([(0, 95, "190"), (0, 96, "192"), (0, 97, "194"), (0, 98, "196"), (0, 99, "198")]
                          + [(1, n // 2, str(n)) for n in range(1, 200, 2)])


def test_source_fail_on_data_loss(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, ckpt = str(tmp_path / "src-3"), tmp_path / "ckpt"
    _write_backup(spark, url, 0, 40, "overwrite")  # offsets 0..19 per partition
    _run(spark, url, ckpt, startingOffsets="earliest")
    # The backup is replaced by one starting later: offsets 20..29 of each partition are gone.
    _write_backup(spark, url, 60, 40, "overwrite")  # offsets 30..49
    with pytest.raises(Exception, match="no longer in the backup"):
        _run(spark, url, ckpt, startingOffsets="earliest")
    rows, _ = _run(spark, url, ckpt, startingOffsets="earliest", failOnDataLoss="false")
    assert rows == sorted((n % 2, n // 2, str(n)) for n in [*range(40), *range(60, 100)])
    # A starting offset below what the backup holds is data loss as well.
    with pytest.raises(Exception, match="no longer in the backup"):
        _run(spark, url, tmp_path / "ckpt-2", startingOffsets='{"t": {"0": 3, "1": 30}}')
    # A partition the stream was reading that vanished (the backup replaced by one without it).
    (spark.range(100, 120).selectExpr("cast(id as string) as value", "'t' as topic", "0 as partition", "id as offset")
     .coalesce(1).write.format("kbs").mode("overwrite").save(url))
    with pytest.raises(Exception, match="partition t/1 is no longer in the backup"):
        _run(spark, url, ckpt, startingOffsets="earliest")


def test_stream_options() -> None:
    o = parse_stream_options({"path": "/x", "startingOffsets": "latest", "maxOffsetsPerTrigger": "10"})
    assert o.starting == "latest" and o.max_offsets_per_trigger == 10
    assert parse_stream_options({"path": "/x"}).starting == "latest"
    for bad, match in (({"endingOffsets": "latest"}, "not valid in a streaming query"),
                       ({"minOffsetsPerTrigger": "5"}, "not supported"),
                       ({"maxOffsetsPerTrigger": "0"}, ">= 1"),
                       ({"startingOffsets": "{\"t\": {\"0\": -3}}"}, "offset -3 of t/0"),
                       ({"subscirbe": "t"}, "did you mean")):
        with pytest.raises(ValueError, match=match):
            parse_stream_options({"path": "/x", **bad})
    # Kafka's rateLimit: shares in proportion, small partitions not starved.
    assert rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 1000, ("t", 1): 1}, 10) == {("t", 0): 9, ("t", 1): 1}
    assert rate_limit({("t", 0): 5}, {("t", 0): 8}, 10) == {("t", 0): 8}


# -- the sink's commit, driven directly (no Spark job): crashes at chosen steps ----------------------
def _stage(url: str, start: int, n: int, query: str, batch: int):  # type: ignore[no-untyped-def]
    """One task's staged write of offsets ``start`` .. ``start + n - 1`` of t/0, as Spark would run it."""
    import pyarrow as pa

    from fsspec_kbs.spark.stream_writer import KbsStreamWriter, parse_stream_write_options

    writer = KbsStreamWriter(parse_stream_write_options({"path": url, "checkpointLocation": "/x"}))
    table = pa.table({"key": [b"k"] * n, "value": [f"v{i}".encode() for i in range(start, start + n)], "topic": ["t"] * n,
                      "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(start, start + n), pa.int64())})
    msg = writer.write(iter(table.to_batches()))
    msg.query_id, msg.batch_id = query, batch
    return writer, msg


def test_sink_commit_replays_and_crashes(tmp_path: Path) -> None:
    from fsspec_kbs.dataset import KbsDataset
    from fsspec_kbs.maintenance.compact import compact_backup
    from fsspec_kbs.maintenance.retain import retain_backup

    url = str(tmp_path / "backup-9")

    def offsets() -> list[int]:
        return KbsDataset.open(url).to_table().column("offset").to_pylist()

    w, m = _stage(url, 0, 10, "q1", 0)
    w.commit([m], 0)
    w, m = _stage(url, 0, 10, "q1", 0)  # batch 0 replayed: skipped, its staging removed
    w.commit([m], 0)
    assert offsets() == list(range(10))
    assert not list((tmp_path / "backup-9" / "_staging").glob("*/*"))

    # The driver dies right after claiming commit of batch 1 (before publishing it)…
    w, m = _stage(url, 10, 5, "q1", 1)

    def die(step: str) -> None:
        if step == "claimed":
            raise KeyboardInterrupt("driver killed")

    w.fault = die
    with pytest.raises(KeyboardInterrupt):
        w.commit([m], 1)
    # …and the restart replays batch 1: the claimed commit is finished, not written twice.
    w, m = _stage(url, 10, 5, "q1", 1)
    w.commit([m], 1)
    assert offsets() == list(range(15))
    # Another query writing to the same backup keeps its own record; both survive rewrites.
    w, m = _stage(url, 100, 3, "q2", 7)
    w.commit([m], 7)
    streams = _manifest(url)[STREAMS_FIELD]
    assert {k: v["batch"] for k, v in streams.items()} == {"q1": 1, "q2": 7}
    compact_backup(url, str(tmp_path / "backup-c"))
    retain_backup(url, str(tmp_path / "backup-r"), max_bytes="1GB")
    for to in ("backup-c", "backup-r"):
        assert {k: v["batch"] for k, v in _manifest(str(tmp_path / to))[STREAMS_FIELD].items()} == {"q1": 1, "q2": 7}
    # A task's message without Spark's query id cannot be committed exactly once: refused.
    w, m = _stage(url, 200, 1, "q1", 2)
    m.query_id = None
    with pytest.raises(Exception, match="query id"):
        w.commit([m], 2)
