"""Benchmark: ``format("kbs")`` against Spark's Kafka source and Parquet, same records, same run.

One command builds everything from the same realistic records (``benchmarks/common.py``: keys
8–40 B, JSON-like values 50 B–2 KB, 20 % with headers; monotonic timestamps):

* a zstd KBS backup with batch indexes (6 partitions, 64 MiB segments);
* a topic on a real broker (``scripts/kafka.sh start`` in its own ``KBS_KAFKA_DIR``, stopped at
  the end) loaded from the backup with ``run_restore`` (same partitions, timestamps, headers);
* Parquet written by Spark from the backup.

Then, in one ``local[2]`` SparkSession, the median of ``--repeat`` (3) timed rounds after a
warm-up run of every case (each round runs every case in turn), each ``count(*)`` and
``sum(length(value))`` (every value crosses into the JVM):

* full scan: kbs vs the Kafka source vs Parquet (issue 22 target: kbs <= 1.5 x Parquet), and the
  floor of any Python data source: the same Arrow batches, already decoded, from memory-mapped
  files through a trivial Python source (what the Python -> JVM path alone costs);
* one partition's 10 % offset range (``assign`` + ``startingOffsets``/``endingOffsets``) and a
  10 % time window (``startingTimestamp``/``endingTimestamp``): kbs vs the Kafka source
  (issue 21 target: kbs no slower).

Run::

    python benchmarks/spark_read.py             # 1 GiB of records, ~10 minutes on 2 cores
    python benchmarks/spark_read.py --gib 0.1   # quick check

Results go to ``benchmarks/results/spark_read.json``. Needs java and mvn (the broker and
Spark's Kafka source jars, resolved from Maven Central); ``--no-kafka`` leaves the broker out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import make_columns, save  # noqa: E402
from fsspec_kbs.store import BackupWriter  # noqa: E402

TOPIC = "events"
PARTITIONS = 6
BASE_TS = 1_767_225_600_000
CHUNK = 50_000


def write_backup(url: str, gib: float) -> dict:
    """About ``gib`` GiB of record data over :data:`PARTITIONS` partitions, one record every
    ~10 ms per partition (timestamps increase with offsets)."""
    per_record = (50 + 2048) / 2 + 24 + 0.2 * 2 * 45 + 8
    per_part = int(gib * 1024**3 / per_record) // PARTITIONS
    w = BackupWriter(url, compression="zstd", mode="overwrite")
    t0 = time.perf_counter()
    for p in range(PARTITIONS):
        for first in range(0, per_part, CHUNK):
            n = min(CHUNK, per_part - first)
            cols = make_columns(n, seed=p * 1000 + first // CHUNK + 1, first_offset=first)
            w.write_columns(TOPIC, p, replace(cols, timestamps=BASE_TS + 10 * cols.offsets + p))
    m = w.commit()
    indexed = sum(1 for t in m.topics for p in t.partitions for e in p.segment_index or [] if e.index_crc32 is not None)
    return {"records": m.statistics["records"], "uncompressed_bytes": m.statistics["uncompressed_bytes"],
            "compressed_bytes": m.statistics["compressed_bytes"], "segments": m.statistics["segments"],
            "indexed_segments": indexed, "records_per_partition": per_part,
            "write_seconds": round(time.perf_counter() - t0, 1)}


# -- the broker --------------------------------------------------------------------------------

def start_broker(state: Path) -> tuple[str, dict]:
    env = {**os.environ, "KBS_KAFKA_DIR": str(state), "KBS_PYTHON": sys.executable,
           "KBS_KAFKA_HEAP": os.environ.get("KBS_KAFKA_HEAP", "-Xms512m -Xmx1g")}
    out = subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "start"], env=env, check=True,
                         capture_output=True, text=True).stdout
    info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return info["KBS_KAFKA_BOOTSTRAP"], env


def stop_broker(env: dict) -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True, timeout=120)


def load_topic(url: str, bootstrap: str) -> dict:
    """The backup's records into :data:`TOPIC` (same partitions, timestamps, headers)."""
    from fsspec_kbs.kafka import run_restore

    t0 = time.perf_counter()
    res = run_restore(url, {"bootstrap.servers": bootstrap}, create_topics=True, replication_factor=1,
                      topic_config={"retention.ms": "-1", "retention.bytes": "-1"})
    return {"records": getattr(res, "records", None), "seconds": round(time.perf_counter() - t0, 1)}


def spark_kafka_jars() -> str:
    out = subprocess.run(["bash", str(REPO / "scripts" / "spark_kafka_jars.sh")], capture_output=True, text=True,
                         env={**os.environ, "KBS_PYTHON": sys.executable}, timeout=900)
    return out.stdout.strip() if out.returncode == 0 else ""


# -- Spark -------------------------------------------------------------------------------------

def session(jars: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    from fsspec_kbs.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder.master("local[2]").appName("kbs-spark-read")
    if jars:
        b = b.config("spark.jars", jars)
    spark = (b.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def once(make_df: Callable[[], object]) -> tuple[float, tuple[int, int]]:
    """Wall time and result of ``count(*)`` + ``sum(length(value))`` on a fresh DataFrame."""
    t0 = time.perf_counter()
    row = make_df().selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]  # type: ignore[attr-defined]
    return time.perf_counter() - t0, (int(row["n"]), int(row["b"] or 0))


def timed(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, dict]:
    """Median wall time of each case over ``repeat`` rounds, after one warm-up run of every
    case. Rounds run every case in turn, so a change of the machine's load (or the JVM still
    compiling the Python source path) weighs on all cases alike rather than on whichever ran
    first or last."""
    results = {name: once(make)[1] for name, make in cases.items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, make in cases.items():
            t, got = once(make)
            assert got == results[name], (name, got, results[name])
            times[name].append(t)
    return {name: {"median_s": round(statistics.median(ts), 3), "seconds": [round(t, 3) for t in ts],
                   "rows": results[name][0], "value_bytes": results[name][1]} for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="record data to generate (GiB; >= 1 for the targets)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-kafka", action="store_true", help="leave the broker and the Kafka source out")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="kbs-spark-bench-") as tmp:
        url = f"file://{tmp}/backup"
        data = write_backup(url, args.gib)
        print(f"backup: {data}", flush=True)
        bootstrap = env = None
        jars = "" if args.no_kafka else spark_kafka_jars()
        if jars:
            bootstrap, env = start_broker(Path(tmp) / "kafka")
        try:
            if bootstrap:
                print(f"topic: {load_topic(url, bootstrap)}", flush=True)
            spark = session(jars)
            try:
                results = run_all(spark, url, f"{tmp}/parquet", bootstrap, data, args.repeat)
            finally:
                spark.stop()
        finally:
            if env is not None:
                stop_broker(env)
    results["backup"] = data
    results["load_avg_at_end"] = os.getloadavg()[0]
    save("spark_read", results)


def arrow_floor(spark, url: str, out_dir: str) -> str:  # type: ignore[no-untyped-def]
    """Register the ``arrow_floor`` source: the batches ``format("kbs")`` yields, decoded once
    and stored as uncompressed Arrow IPC files (one per kbs input partition), handed to Spark
    from memory-mapped files through a trivial Python data source. Its scan time is what the
    Python Data Source path itself costs (Python -> JVM transfer, Arrow -> rows): the floor of
    any Python source. Returns the name to load it with."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from fsspec_kbs.spark import KbsReader, parse_options, spark_schema

    cols = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    reader = KbsReader(parse_options({"path": url}), cols)
    files = []
    for i, part in enumerate(reader.partitions()):
        path = f"{out_dir}/part-{i}.arrow"
        batches = iter(reader.read(part))
        first = next(batches)
        with pa.ipc.new_file(path, first.schema) as w:
            w.write_batch(first)
            for b in batches:
                w.write_batch(b)
        files.append(path)

    class FloorPartition(InputPartition):
        def __init__(self, path: str) -> None:
            self.path = path

    class FloorReader(DataSourceReader):
        def partitions(self) -> list:
            return [FloorPartition(f) for f in files]

        def read(self, partition):  # type: ignore[no-untyped-def]
            f = pa.ipc.open_file(pa.memory_map(partition.path))
            for k in range(f.num_record_batches):
                yield f.get_batch(k)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_floor"

        def schema(self):  # type: ignore[no-untyped-def]
            return spark_schema()

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return FloorReader()

    spark.dataSource.register(FloorSource)
    return "arrow_floor"


def run_all(spark, url: str, parquet: str, bootstrap: str | None, data: dict, repeat: int) -> dict:  # type: ignore[no-untyped-def]
    spark.read.format("kbs").load(url).write.mode("overwrite").parquet(parquet)
    floor_dir = f"{parquet}-arrow"
    os.makedirs(floor_dir)
    floor = arrow_floor(spark, url, floor_dir)

    def kbs(**opts: str):  # type: ignore[no-untyped-def]
        return lambda: spark.read.format("kbs").options(**opts).load(url)

    def kafka(**opts: str):  # type: ignore[no-untyped-def]
        opts = opts if "assign" in opts else {"subscribe": TOPIC, **opts}
        return lambda: (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                        .option("includeHeaders", "true").options(**opts).load())

    n = data["records_per_partition"]
    lo, hi = int(n * 0.45), int(n * 0.55)
    offsets = {"assign": json.dumps({TOPIC: [2]}), "startingOffsets": json.dumps({TOPIC: {"2": lo}}),
               "endingOffsets": json.dumps({TOPIC: {"2": hi}})}
    t_lo, t_hi = BASE_TS + 10 * lo, BASE_TS + 10 * hi
    window = {"startingTimestamp": str(t_lo), "endingTimestamp": str(t_hi)}
    cases: dict[str, Callable[[], object]] = {
        "full scan: kbs": kbs(),
        "full scan: parquet": lambda: spark.read.parquet(parquet),
        "full scan: arrow from memory, python source (floor)": lambda: spark.read.format(floor).load(),
    }
    if bootstrap:
        cases["full scan: kafka source"] = kafka()
    cases["10% offsets of one partition: kbs"] = kbs(**offsets)
    if bootstrap:
        cases["10% offsets of one partition: kafka source"] = kafka(**offsets)
    cases["10% time window: kbs"] = kbs(**window)
    cases["10% time window: kbs, pushed filter"] = lambda: spark.read.format("kbs").load(url).where(
        f"timestamp >= timestamp_millis({t_lo}) AND timestamp < timestamp_millis({t_hi})")
    if bootstrap:
        cases["10% time window: kafka source"] = kafka(**window)
    out: dict = {"cases": timed(cases, repeat)}
    for name, r in out["cases"].items():
        print(f"{name:<52} {r['median_s']:8.2f} s  {r['rows']:>10,} rows  {r['seconds']}", flush=True)
    c = out["cases"]
    assert c["full scan: kbs"]["rows"] == c["full scan: parquet"]["rows"] == data["records"]
    ratios = {"full scan kbs / parquet (target <= 1.5)":
              c["full scan: kbs"]["median_s"] / c["full scan: parquet"]["median_s"],
              "full scan floor / parquet":
              c["full scan: arrow from memory, python source (floor)"]["median_s"] / c["full scan: parquet"]["median_s"],
              "full scan kbs / floor":
              c["full scan: kbs"]["median_s"] / c["full scan: arrow from memory, python source (floor)"]["median_s"]}
    if bootstrap:
        for what in ("full scan", "10% offsets of one partition", "10% time window"):
            a, b = c[f"{what}: kbs"], c[f"{what}: kafka source"]
            assert a["rows"] == b["rows"] and a["value_bytes"] == b["value_bytes"], (what, a, b)
            ratios[f"{what} kbs / kafka source" + ("" if what == "full scan" else " (target <= 1)")] = \
                a["median_s"] / b["median_s"]
    out["ratios"] = {k: round(v, 3) for k, v in ratios.items()}
    for k, v in out["ratios"].items():
        print(f"{k:<60} {v:6.2f}")
    return out


if __name__ == "__main__":
    main()
