"""Benchmark: planning a Spark read of a backup of many segments on the driver (issue 22 item 3).

Builds a synthetic backup whose manifest lists ``--segments`` tiny segments over 10 partitions
(each file a copy of one real segment: planning never opens them), then times
``KbsReader.partitions()`` (read and parse ``manifest.json``, prune, group) — median of
``--repeat`` runs — and prints the size of the largest pickled input partition, which must
not grow with the manifest (executors never read it). Target: < 5 s for 100,000 segments.

Run::

    python benchmarks/spark_plan.py                  # 100,000 segments
    python benchmarks/spark_plan.py --segments 10000
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import save  # noqa: E402

COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def synthetic_backup(root: Path, n: int, partitions: int = 10) -> str:
    """A 1.1 backup whose manifest lists ``n`` one-record segments over ``partitions``
    partitions; every file is a copy of one real segment. Returns its path."""
    import fsspec_kbs

    one = root / "one"
    fsspec_kbs.write_table(str(one / "backup-1"), pa.table({"value": [b"x"]}), topic="t")
    m = json.loads((one / "backup-1" / "manifest.json").read_text())
    seg = m["topics"][0]["partitions"][0]["segment_index"][0]
    data = (one / "backup-1" / "topics" / "t" / "0" / "segment-00000000.kbs").read_bytes()
    url = root / "big" / "backup-1"
    per = n // partitions
    parts = []
    for p in range(partitions):
        d = url / "topics" / "t" / str(p)
        d.mkdir(parents=True)
        index = []
        for i in range(per):
            name = f"segment-{i:08d}.kbs"
            (d / name).write_bytes(data)
            index.append({**seg, "file": name, "first_offset": i, "last_offset": i,
                          "min_timestamp": 1000 + i, "max_timestamp": 1000 + i})
        parts.append({"partition": p, "first_offset": 0, "last_offset": per - 1, "records": per,
                      "segments": per, "segment_index": index})
    m["topics"] = [{"name": "t", "partitions": parts}]
    m["statistics"].update(partitions=partitions, segments=per * partitions, records=per * partitions,
                           uncompressed_bytes=per * partitions * seg["size_bytes"],
                           compressed_bytes=per * partitions * seg["size_bytes"])
    m["time_range"] = {"earliest_timestamp": 1000, "latest_timestamp": 1000 + per - 1}
    (url / "manifest.json").write_text(json.dumps(m))
    return str(url)


def plan(url: str, **opts: str) -> tuple[float, list]:
    from fsspec_kbs.spark import KbsReader, parse_options

    reader = KbsReader(parse_options({"path": url, **opts}), COLS)
    t0 = time.perf_counter()
    parts = reader.partitions()
    return time.perf_counter() - t0, parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbs-plan-") as tmp:
        url = synthetic_backup(Path(tmp), args.segments)
        manifest_mb = Path(url, "manifest.json").stat().st_size / 1e6
        out = {}
        # A full read: bounded reads also probe the headers of pruned neighbours, which the
        # synthetic copies (all starting at offset 0) would fail.
        for name, opts in (("full read", {}),):
            times, parts = [], []
            for _ in range(args.repeat):
                t, parts = plan(url, **opts)
                times.append(t)
            biggest = max(len(pickle.dumps(p)) for p in parts)
            out[name] = {"median_s": round(statistics.median(times), 3), "seconds": [round(t, 3) for t in times],
                         "input_partitions": len(parts), "largest_partition_pickle_bytes": biggest}
            print(f"{name:<34} {statistics.median(times):6.2f} s  {len(parts):>6} input partitions, "
                  f"largest pickled {biggest:,} B", flush=True)
    print(f"manifest.json: {manifest_mb:.1f} MB, {args.segments:,} segments (target < 5 s)")
    save("spark_plan", {"segments": args.segments, "manifest_mb": round(manifest_mb, 1), "cases": out})


if __name__ == "__main__":
    main()
