"""Benchmark: read a >= 1 GB (uncompressed) zstd backup with the ``kbs`` Spark source.

Writes a backup into a temporary directory, reads it with ``local[1]`` and ``local[2]``
SparkSessions (best of ``--repeat`` runs after a warm-up), and reports rows/s, MB/s of
uncompressed record data and the local[2]/local[1] scaling ratio. Results go to
``benchmarks/results/spark_read.json``.

Run::

    python benchmarks/spark_read.py            # ~1.1 GB, a few minutes on 2 cores
    python benchmarks/spark_read.py --gib 0.1  # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fsspec_kbs.format import RecordColumns
from fsspec_kbs.store import BackupWriter, open_backup

RESULTS = Path(__file__).resolve().parent / "results" / "spark_read.json"


def make_columns(first: int, n: int, value_size: int, rng: np.random.Generator) -> RecordColumns:
    """``n`` records with ~``value_size``-byte values that compress about 3x (like JSON events)."""
    words = rng.integers(0, 64, size=(n, value_size // 8), dtype=np.uint8)
    # Printable text from a small alphabet, in runs: compressible but not trivially so.
    vocab = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}:,", dtype=np.uint8)
    values = np.repeat(vocab[words], 8, axis=1).reshape(-1)
    keys = np.frombuffer(b"".join(b"user-%06d" % (i % 100000) for i in range(first, first + n)), dtype=np.uint8)
    v_off = (np.arange(n + 1, dtype=np.int64) * value_size).astype(np.int32)
    k_off = (np.arange(n + 1, dtype=np.int64) * 11).astype(np.int32)
    return RecordColumns(
        offsets=np.arange(first, first + n, dtype=np.int64),
        timestamps=1_767_225_600_000 + np.arange(first, first + n, dtype=np.int64),
        key_offsets=k_off, key_data=keys.copy(), key_valid=np.ones(n, np.bool_),
        value_offsets=v_off, value_data=values, value_valid=np.ones(n, np.bool_),
        header_offsets=np.zeros(n + 1, np.int32), header_key_offsets=np.zeros(1, np.int32),
        header_key_data=np.zeros(0, np.uint8), header_value_offsets=np.zeros(1, np.int32),
        header_value_data=np.zeros(0, np.uint8), header_value_valid=np.zeros(0, np.bool_),
    )


def write_backup(url: str, gib: float, partitions: int = 4, value_size: int = 1024) -> dict:
    rng = np.random.default_rng(7)
    total = int(gib * 1024**3 / (value_size + 11 + 16))  # record bytes incl. key and framing
    per_part = total // partitions
    chunk = 50_000
    t0 = time.perf_counter()
    w = BackupWriter(url, compression="zstd", segment_max_bytes=16 * 1024 * 1024, mode="overwrite")
    for p in range(partitions):
        for first in range(0, per_part, chunk):
            w.write_columns("bench", p, make_columns(first, min(chunk, per_part - first), value_size, rng))
    m = w.commit()
    return {"records": m.statistics["records"], "uncompressed_bytes": m.statistics["uncompressed_bytes"],
            "compressed_bytes": m.statistics["compressed_bytes"], "segments": m.statistics["segments"],
            "write_seconds": round(time.perf_counter() - t0, 2)}


def spark_read(url: str, cores: int, repeat: int) -> dict:
    from pyspark.sql import SparkSession

    from fsspec_kbs.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{cores}]").appName(f"kbs-bench-{cores}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        def run() -> tuple[float, object]:
            # A new DataFrame each time: re-collecting the same one may reuse its result.
            # Sum of value lengths: every record's value crosses from Python to the JVM.
            t0 = time.perf_counter()
            df = spark.read.format("kbs").load(url)
            row = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
            return time.perf_counter() - t0, row

        run()  # warm-up: Python workers, numba kernels
        times = []
        for _ in range(repeat):
            t, row = run()
            times.append(t)
        df = spark.read.format("kbs").load(url)
        return {"cores": cores, "seconds": [round(t, 3) for t in times], "best_seconds": round(min(times), 3),
                "rows": int(row["n"]), "input_partitions": df.rdd.getNumPartitions()}
    finally:
        spark.stop()


def in_process_read(url: str) -> dict:
    """Baseline without Spark: decode every segment in one thread (what one Spark task does)."""
    from fsspec_kbs.arrow import columns_to_batch

    backup = open_backup(url)
    t0 = time.perf_counter()
    rows = 0
    for ref in backup.segments():
        for cols in backup.iter_columns(ref):
            rows += columns_to_batch(cols, ref.topic, ref.partition).num_rows
    return {"rows": rows, "seconds": round(time.perf_counter() - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.1, help="uncompressed size of the backup (GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kbs-bench-") as tmp:
        url = f"{tmp}/backup-1"
        data = write_backup(url, args.gib)
        print(f"backup: {data}", flush=True)
        base = in_process_read(url)
        print(f"in-process, 1 thread: {base}", flush=True)
        runs = {}
        for cores in (1, 2):
            runs[cores] = spark_read(url, cores, args.repeat)
            print(f"local[{cores}]: {runs[cores]}", flush=True)
    mb = data["uncompressed_bytes"] / 1e6
    out = {
        "benchmark": "spark_read", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    # Other processes on the machine skew the numbers: look at these first.
                    "loadavg_1m_before": round(load_before[0], 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        "backup": data,
        "in_process_1_thread": {**base, "rows_per_s": round(base["rows"] / base["seconds"]),
                                "mb_per_s": round(mb / base["seconds"], 1)},
    }
    for cores, r in runs.items():
        assert r["rows"] == data["records"], (r["rows"], data["records"])
        out[f"local[{cores}]"] = {**r, "rows_per_s": round(r["rows"] / r["best_seconds"]),
                                  "mb_per_s": round(mb / r["best_seconds"], 1)}
    out["scaling_local2_vs_local1"] = round(runs[1]["best_seconds"] / runs[2]["best_seconds"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("local[1]", "local[2]", "scaling_local2_vs_local1")}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
