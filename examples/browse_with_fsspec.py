"""Browse a Kafka backup as a read-only filesystem with the ``kbs`` fsspec protocol.

Run it as is to browse a small demo backup written to a temporary directory::

    python examples/browse_with_fsspec.py

or point it at a backup of yours (any fsspec URL; storage options as ``-S key=value``)::

    python examples/browse_with_fsspec.py s3://bucket/backups/backup-1 -S endpoint_url=http://localhost:9000
"""

from __future__ import annotations

import argparse
import json
import tempfile

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds

import fsspec_kbs


def demo_backup(root: str) -> str:
    """Write a small backup (two topics, a few partitions and segments) and return its URL."""
    n = 600
    table = pa.table({
        "topic": ["orders" if i % 3 else "payments" for i in range(n)],
        "partition": pa.array([i % 2 for i in range(n)], pa.int32()),
        "key": [f"customer-{i % 17}".encode() for i in range(n)],
        "value": [json.dumps({"order": i, "amount": i * 3 % 101}).encode() for i in range(n)],
        "timestamp": pa.array([1_767_225_600_000 + i * 1000 for i in range(n)], pa.timestamp("ms", tz="UTC")),
    })
    url = f"{root}/backup-1"
    fsspec_kbs.write_table(url, table, segment_max_records=80)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="backup directory (default: write a demo backup)")
    parser.add_argument("-S", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option of the target filesystem (repeatable)")
    args = parser.parse_args()
    options = dict(o.split("=", 1) for o in args.storage_option)
    url = args.url or demo_backup(tempfile.mkdtemp(prefix="kbs-demo-"))

    # 1. A filesystem over the backup: fo is the backup, target_options go to its storage.
    fs = fsspec.filesystem("kbs", fo=url, target_options=options)
    root = fs.info("")
    print(f"backup {root['backup_id']} at {root['url']}: {root['topics']} topics, "
          f"{root['partitions']} partitions, {root['segments']} segments, {root['records']} records")
    print("ls('')              ", fs.ls("", detail=False))
    topic = fs.ls("", detail=False)[-1]
    print(f"ls({topic!r})".ljust(21), fs.ls(topic, detail=False))

    partition = fs.ls(topic, detail=False)[0]
    print(f"\nls({partition!r}, detail=True):")
    for e in fs.ls(partition, detail=True):
        if e["kind"] == "segment":
            crc = "-" if e["crc64"] is None else f"{e['crc64']:#018x}"  # the OSO layout has none
            print(f"  {e['name']:<40} {e['size']:>8} B  offsets {e['first_offset']}-{e['last_offset']}  "
                  f"{e['records']} records  codec {e['codec']}  crc64 {crc}")
        else:
            print(f"  {e['name']:<40} (decoded view, {e['records']} records)")

    # 2. Raw segment bytes, straight from the storage (range reads work).
    segment = fs.ls(partition, detail=False)[0]
    print(f"\ncat_file({segment!r}, 0, 8) ->", fs.cat_file(segment, 0, 8))

    # 3. Decoded records through a chained URL: the path goes on into the backup.
    chained = f"kbs::{url}/{partition}/records.jsonl"
    with fsspec.open(chained, "rt", **({fsspec.core.split_protocol(url)[0] or 'file': options} if options else {})) as f:
        print(f"\nfirst line of {chained}:\n  {f.readline().strip()}")

    # 4. Tools that only speak files: pandas and pyarrow.dataset.
    try:
        import pandas as pd

        with fs.open(f"{partition}/records.jsonl") as f:
            df = pd.read_json(f, lines=True, dtype=False)
        print(f"\npandas.read_json: {len(df)} rows, columns {list(df.columns)}")
    except ImportError:
        print("\n(pandas not installed: skipping pandas.read_json)")
    dataset = ds.dataset(fs.glob("*/*/records.parquet"), filesystem=fs, format="parquet")
    counts = dataset.to_table(columns=["topic"]).group_by("topic").aggregate([("topic", "count")])
    print("pyarrow.dataset over */*/records.parquet:", counts.to_pylist())

    # 5. It is read-only.
    try:
        fs.pipe(f"{partition}/new.kbs", b"data")
    except PermissionError as e:
        print(f"\nwrite refused: {e}")


if __name__ == "__main__":
    main()
