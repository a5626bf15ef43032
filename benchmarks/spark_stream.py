"""Continuous backup on Spark: ``readStream.format("kafka")`` -> ``writeStream.format("kbs")``
against a real broker, relative to the same query writing to Spark's Parquet and ``noop`` sinks.

In one run, on the same realistic records (``benchmarks/common.py``: keys 8-40 B, JSON-like
values 100 B-2 KB, 20 % with headers):

* **throughput (catch-up)**: the topic is filled first, then a ``Trigger.AvailableNow`` query
  with ``maxOffsetsPerTrigger`` drains it into each sink: records/s (wall time from start to
  termination) and, per micro-batch, ``addBatch`` (the sink's write job and its commit on the
  driver) and ``triggerExecution`` from Spark's progress reports;
* **latency (steady state)**: records are produced at a fixed rate while a query with a
  processing-time trigger runs; each time the sink publishes new data (the kbs manifest, the
  Parquet sink's ``_spark_metadata`` log), latency = now - the newest record's produce time.

Median of ``--repeat`` (3) runs per sink. Usage::

    python benchmarks/spark_stream.py [--records 300000] [--partitions 3] [--rate 5000] [--seconds 20]

Uses ``$KBS_KAFKA_BOOTSTRAP`` when set, else starts a broker with scripts/kafka.sh (own
``KBS_KAFKA_DIR``, stopped at the end). Results: ``benchmarks/results/spark_stream.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import make_columns, report, save  # noqa: E402
from benchmarks.kafka_bench import PRODUCER_CONF, create, start_broker  # noqa: E402

SINKS = ("kbs", "parquet", "noop")
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


def realistic(n: int, seed: int = 1) -> list[tuple[bytes, bytes, list | None]]:
    """``n`` (key, value, headers) from :func:`benchmarks.common.make_columns`."""
    c = make_columns(n, value_min=100, value_max=2048, seed=seed)
    out = []
    for i in range(n):
        k = bytes(c.key_data[c.key_offsets[i]:c.key_offsets[i + 1]])
        v = bytes(c.value_data[c.value_offsets[i]:c.value_offsets[i + 1]])
        hs = []
        for j in range(c.header_offsets[i], c.header_offsets[i + 1]):
            hs.append((bytes(c.header_key_data[c.header_key_offsets[j]:c.header_key_offsets[j + 1]]).decode(),
                       bytes(c.header_value_data[c.header_value_offsets[j]:c.header_value_offsets[j + 1]])))
        out.append((k, v, hs or None))
    return out


def produce(conf: dict, topic: str, records: list[tuple], partitions: int, rate: float | None = None,
            first: int = 0) -> None:
    """Produce ``records`` round-robin over partitions, timestamped now; at ``rate`` records/s if given."""
    p = Producer({**conf, **PRODUCER_CONF})
    t0 = time.perf_counter()
    for i, (k, v, h) in enumerate(records):
        if rate is not None and i % 100 == 0:
            ahead = t0 + i / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        while True:
            try:
                p.produce(topic, v, k, (first + i) % partitions, timestamp=int(time.time() * 1000), headers=h)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def session(jars: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    from fsspec_kbs.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("kbs-stream-bench")
             .config("spark.jars", jars).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start(spark, bootstrap: str, topic: str, sink: str, out: Path, *, available_now: bool,  # type: ignore[no-untyped-def]
          max_offsets: int | None = None, trigger_s: float = 1.0):
    src = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true"))
    if max_offsets:
        src = src.option("maxOffsetsPerTrigger", str(max_offsets))
    w = src.load().select(*COLUMNS).writeStream.format(sink).option("checkpointLocation", str(out / "ckpt"))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime=f"{trigger_s} seconds")
    return w.start(str(out / "data")) if sink != "noop" else w.start()


def catch_up(spark, bootstrap: str, topic: str, sink: str, tmp: Path, records: int, max_offsets: int) -> dict:  # type: ignore[no-untyped-def]
    out = tmp / f"{sink}-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    q = start(spark, bootstrap, topic, sink, out, available_now=True, max_offsets=max_offsets)
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    assert q.exception() is None, q.exception()
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == records, f"{sink}: {rows} rows read, {records} produced"
    return {"seconds": elapsed, "records_per_s": records / elapsed, "batches": len(progress),
            "add_batch_ms": statistics.median(p["durationMs"].get("addBatch", 0) for p in progress),
            "trigger_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in progress)}


def _newest_kbs(data: Path) -> tuple[int, int | None]:
    try:
        doc = json.loads((data / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return -1, None
    return doc["commit"]["version"], doc["time_range"]["latest_timestamp"]


def _newest_parquet(data: Path, seen: dict) -> tuple[int, int | None]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    log = data / "_spark_metadata"
    batches = sorted(int(p.name) for p in log.glob("[0-9]*") if p.name.isdigit()) if log.exists() else []
    if not batches:
        return -1, None
    last = batches[-1]
    if last not in seen:
        newest = None
        for line in (log / str(last)).read_text().splitlines()[1:]:
            path = json.loads(line)["path"].removeprefix("file://")
            t = pq.read_table(path, columns=["timestamp"]).column("timestamp")
            m = pc.max(t).as_py()
            if m is not None:
                ms = int(m.timestamp() * 1000)
                newest = ms if newest is None else max(newest, ms)
        seen[last] = newest
    return last, seen[last]


def steady(spark, bootstrap: str, conf: dict, sink: str, tmp: Path, partitions: int, rate: float,  # type: ignore[no-untyped-def]
           seconds: float, pool: list[tuple]) -> dict:
    topic = f"lat-{sink}-{uuid.uuid4().hex[:8]}"
    create(AdminClient(conf), topic, partitions)
    out = tmp / f"lat-{sink}-{uuid.uuid4().hex[:6]}"
    q = start(spark, bootstrap, topic, sink, out, available_now=False)
    n = int(rate * seconds)
    records = (pool * (n // len(pool) + 1))[:n]
    # Warm up (first micro-batches start Python workers), then produce at the rate.
    produce(conf, topic, records[:100], partitions)
    time.sleep(8)
    producer = threading.Thread(target=produce, args=(conf, topic, records[100:], partitions, rate, 100))
    producer.start()
    samples, seen, last = [], {}, None
    data = out / "data"
    while producer.is_alive():
        version, newest = _newest_kbs(data) if sink == "kbs" else _newest_parquet(data, seen)
        if version != last and newest is not None and last is not None:
            samples.append(time.time() * 1000 - newest)
        last = version
        time.sleep(0.02)
    producer.join()
    q.stop()
    return {"latency_ms_median": statistics.median(samples) if samples else float("nan"),
            "latency_ms_p90": statistics.quantiles(samples, n=10)[-1] if len(samples) > 2 else float("nan"),
            "publishes": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=25_000)
    ap.add_argument("--rate", type=float, default=2_000, help="records/s produced in the latency runs")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from tests.fixtures.spark import spark_kafka_jars

    jars = spark_kafka_jars()
    if not jars:
        raise SystemExit("Spark's Kafka source jars could not be resolved (scripts/spark_kafka_jars.sh)")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        env = None
        bootstrap = os.environ.get("KBS_KAFKA_BOOTSTRAP")
        if not bootstrap:
            bootstrap, env = start_broker(tmp / "kafka")
        conf = {"bootstrap.servers": bootstrap}
        try:
            pool = realistic(min(args.records, 20_000))
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            create(AdminClient(conf), topic, args.partitions)
            records = (pool * (args.records // len(pool) + 1))[:args.records]
            produce(conf, topic, records, args.partitions)
            payload = sum(len(k) + len(v) + sum(len(hk) + len(hv) for hk, hv in (h or ())) for k, v, h in records)
            spark = session(jars)
            runs: dict[str, list[dict]] = {s: [] for s in SINKS}
            catch_up(spark, bootstrap, topic, "noop", tmp, args.records, args.max_offsets_per_trigger)  # warm-up
            for _ in range(args.repeat):
                for sink in SINKS:
                    runs[sink].append(catch_up(spark, bootstrap, topic, sink, tmp, args.records,
                                               args.max_offsets_per_trigger))
            med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in runs[s][0]} for s in SINKS}
            rows = [report(f"catch-up {s}: records/s", med[s]["records_per_s"], "rec/s",
                           ref=med["parquet"]["records_per_s"]) for s in SINKS]
            rows += [report(f"catch-up {s}: addBatch per micro-batch", med[s]["add_batch_ms"], "ms",
                            ref=med["parquet"]["add_batch_ms"]) for s in SINKS]
            lat: dict[str, list[dict]] = {"kbs": [], "parquet": []}
            for _ in range(args.repeat):
                for sink in lat:
                    lat[sink].append(steady(spark, bootstrap, conf, sink, tmp, args.partitions, args.rate,
                                            args.seconds, pool))
            lmed = {s: {k: statistics.median(r[k] for r in lat[s]) for k in lat[s][0]} for s in lat}
            rows += [report(f"steady {args.rate:.0f} rec/s, 1 s trigger, {s}: latency median", lmed[s]["latency_ms_median"],
                            "ms", ref=lmed["parquet"]["latency_ms_median"]) for s in lat]
            rows += [report(f"steady {args.rate:.0f} rec/s, 1 s trigger, {s}: latency p90", lmed[s]["latency_ms_p90"],
                            "ms", ref=lmed["parquet"]["latency_ms_p90"]) for s in lat]
            spark.stop()
            save("spark_stream", {"args": vars(args), "payload_bytes": payload, "catch_up": runs, "catch_up_median": med,
                                  "steady": lat, "steady_median": lmed, "rows": rows,
                                  "note": "ratios are against the same query writing to Spark's Parquet sink"})
        finally:
            if env is not None:
                subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True)


if __name__ == "__main__":
    main()
