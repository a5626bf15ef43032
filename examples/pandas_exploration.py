"""Explore a Kafka backup with pandas: what is in it, per-key activity, a time window.

    python examples/pandas_exploration.py                    # builds a demo backup in ./kbs-demo
    python examples/pandas_exploration.py s3://bucket/backups/backup-1 -S endpoint_url=http://...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402

import fsspec_kbs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="backup URL (default: a demo backup in ./kbs-demo)")
    parser.add_argument("-S", "--storage-option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    opts = dict(kv.split("=", 1) for kv in args.storage_option)
    url = args.url
    if url is None:
        from demo_data import demo_table

        url = str(Path("kbs-demo/backups/pandas-demo").resolve())
        fsspec_kbs.write_table(url, demo_table(50_000), mode="overwrite", segment_max_records=5_000)
        print(f"wrote a demo backup to {url}")

    ds = fsspec_kbs.KbsDataset.open(url, storage_options=opts)
    print(f"\n{len(ds.fragments())} segments in {ds.backup.backup_id}")

    # 1. What is in the backup: records and offset ranges per partition (no key/value decoding).
    meta = ds.to_pandas(columns=["topic", "partition", "offset", "timestamp"])
    summary = meta.groupby(["topic", "partition"]).agg(
        records=("offset", "size"), first_offset=("offset", "min"), last_offset=("offset", "max"),
        earliest=("timestamp", "min"), latest=("timestamp", "max"))
    print("\nper partition:\n", summary.to_string())

    # 2. Only one topic, decoded as JSON: top customers by amount (segments of other topics are never opened).
    orders = ds.filter(topics="orders").to_pandas(columns=["key", "value", "timestamp", "headers"])
    live = orders[orders["value"].notna()]
    docs = live["value"].map(json.loads)
    live = live.assign(customer=docs.map(lambda d: d.get("customer")), amount=docs.map(lambda d: d.get("amount")))
    print("\ntop customers by amount:\n", live.groupby("customer")["amount"].sum().nlargest(5).to_string())
    print(f"\ntombstones (null values): {orders['value'].isna().sum()}, "
          f"records with headers: {(orders['headers'].map(len) > 0).sum()}")

    # 3. A time window, pruned by each segment's min/max timestamp.
    start = meta["timestamp"].min() + (meta["timestamp"].max() - meta["timestamp"].min()) / 2
    window = ds.filter(start_time=start.to_pydatetime(), end_time=(start + pd.Timedelta("5s")).to_pydatetime())
    print(f"\n5 s window from {start}: {window.count_rows()} records from {len(window.fragments())} segment(s)")


if __name__ == "__main__":
    main()
