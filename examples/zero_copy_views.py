"""Stream a backup as zero-copy ``binary_view`` batches and compare with the default copies.

    python examples/zero_copy_views.py                    # builds a demo backup in ./kbs-demo
    python examples/zero_copy_views.py s3://bucket/backups/backup-1 -S endpoint_url=http://...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import fsspec_kbs  # noqa: E402


def scan(url: str, opts: dict, binary_view: bool) -> tuple[int, int, float]:
    """Rows and tombstones (null values) of the whole backup, and the seconds it took."""
    t0 = time.perf_counter()
    rows = tombstones = 0
    for batch in fsspec_kbs.open_reader(url, storage_options=opts, binary_view=binary_view,
                                        columns=["value", "offset"]):
        rows += batch.num_rows
        tombstones += batch.column("value").null_count
    return rows, tombstones, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="backup URL (default: a demo backup in ./kbs-demo)")
    parser.add_argument("-S", "--storage-option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    opts = dict(kv.split("=", 1) for kv in args.storage_option)
    url = args.url
    if url is None:
        from demo_data import demo_table

        url = str(Path("kbs-demo/backups/views-demo").resolve())
        fsspec_kbs.write_table(url, demo_table(200_000), mode="overwrite")
        print(f"wrote a demo backup to {url}")

    for binary_view in (False, True):
        scan(url, opts, binary_view)  # warm-up: file cache and compiled kernels
        rows, tombstones, secs = scan(url, opts, binary_view)
        print(f"binary_view={binary_view!s:<5}  {rows} rows ({tombstones} tombstones) in {secs:.3f} s")

    # The same rows either way; a cast gives compact copies with the default types.
    views = fsspec_kbs.read_table(url, storage_options=opts, binary_view=True, end_offset=1000)
    print(views.schema.field("value"), "->", views.cast(fsspec_kbs.KAFKA_SCHEMA).schema.field("value"))
    assert views.cast(fsspec_kbs.KAFKA_SCHEMA).equals(fsspec_kbs.read_table(url, storage_options=opts, end_offset=1000))
    print("first value:", views.column("value")[0].as_py()[:60], "...")
    # Many compute functions (pyarrow 26: filter, take, comparisons, binary_length) need the
    # default types: cast the columns you compute on.
    lengths = pc.binary_length(views.column("value").cast(pa.binary()))
    print("mean value length of the first 1000 records:", pc.mean(lengths).as_py())


if __name__ == "__main__":
    main()
