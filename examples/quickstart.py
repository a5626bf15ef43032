"""The main job, on embedded defaults: a local directory and a local Spark session.

1. writes a demo backup (100k records, zstd) to ./kbs-demo/backups/demo-1,
2. validates it deeply and prints `kbs describe`,
3. explores it with pandas (only the segments a filter needs are opened),
4. reads it with Spark (`spark.read.format("kbs")`), aggregates, and writes a filtered copy
   back as a new backup with `df.write.format("kbs")`, which is validated too.

    python examples/quickstart.py [--records N] [--no-spark]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_data import demo_table  # noqa: E402

import fsspec_kbs  # noqa: E402
from fsspec_kbs.maintenance.validate import validate_backup  # noqa: E402


def kbs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fsspec_kbs.cli.main", *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--root", default="kbs-demo/backups", help="storage root (any fsspec URL)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark part")
    args = parser.parse_args()
    root = args.root if "://" in args.root else str(Path(args.root).resolve())
    url = f"{root}/demo-1"

    t = time.perf_counter()
    table = demo_table(args.records)
    manifest = fsspec_kbs.write_table(url, table, mode="overwrite", compression="zstd",
                                      segment_max_records=5_000)
    s = manifest.statistics
    print(f"[1] wrote {s['records']:,} records in {s['segments']} segments to {url} "
          f"({s['uncompressed_bytes'] / 2**20:.1f} MiB of records -> {s['compressed_bytes'] / 2**20:.1f} MiB) "
          f"in {time.perf_counter() - t:.1f}s")

    report = validate_backup(url, deep=True)
    print(f"[2] validate --deep: {'OK' if report.ok else report.defects} ({report.records_checked:,} records)")
    kbs("describe", url)

    ds = fsspec_kbs.KbsDataset.open(url)
    orders = ds.filter(topics="orders", partitions=[1])
    df = orders.to_pandas(columns=["offset", "timestamp", "key", "value"])
    print(f"[3] pandas: orders/1 has {len(df):,} records, opened {len(orders.fragments())} of "
          f"{len(ds.fragments())} segments; first rows:\n{df.head(3).to_string()}")

    if args.no_spark:
        return
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from fsspec_kbs.spark import register

    # Spark's Python workers must use this interpreter (the one with fsspec-kbs installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("kbs-quickstart")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    sdf = spark.read.format("kbs").load(url)
    print("[4] Spark schema (same as Spark's Kafka source):")
    sdf.printSchema()
    sdf.groupBy("topic", "partition").agg(F.count("*").alias("records"), F.min("offset"), F.max("offset"),
                                          F.sum(F.col("value").isNull().cast("int")).alias("tombstones")) \
        .orderBy("topic", "partition").show()
    copy = f"{root}/orders-with-keys"
    (sdf.where((F.col("topic") == "orders") & F.col("key").isNotNull())
        .write.format("kbs").mode("overwrite").option("compression", "zstd").save(copy))
    back = fsspec_kbs.read_table(copy)
    print(f"[4] Spark wrote {back.num_rows:,} records to {copy}; "
          f"validate --deep: {'OK' if validate_backup(copy, deep=True).ok else 'FAILED'}")
    spark.stop()


if __name__ == "__main__":
    main()
