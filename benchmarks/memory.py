"""Memory benchmark: peak RSS while streaming a >= 5 GB (uncompressed) backup.

Run ``python -m benchmarks.memory`` (``--gb 5``). Writes a zstd backup with the default
``BackupWriter`` settings (64 MB segments, 1 MiB batches) by writing the same generated
records into as many partitions as needed, then reads it in a fresh subprocess with
``KbsDataset.to_batches()`` (thread pool on, CRC checks on) and reports the subprocess's peak
RSS (``VmHWM`` from ``/proc/self/status``). The backup is deleted afterwards.
Results go to ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import MB, columns_for_bytes, report, save
from fsspec_kbs.store import BackupWriter

TARGET_RSS_MB = 300

_READER = r"""
import json, sys, time

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0

from fsspec_kbs.dataset import KbsDataset
base = status("VmRSS")
ds = KbsDataset.open(sys.argv[1])
t0 = time.perf_counter()
rows = 0
data = 0
for batch in ds.to_batches(use_threads=sys.argv[2] == "1", binary_view=sys.argv[3] == "1"):
    rows += batch.num_rows
    data += batch.column("value").nbytes if batch.num_rows else 0
elapsed = time.perf_counter() - t0
print(json.dumps({"rows": rows, "value_bytes": data, "seconds": elapsed,
                  "rss_after_import": base, "peak_rss": status("VmHWM")}))
"""


def build(root: Path, gb: float) -> tuple[Path, int]:
    """A backup of at least ``gb`` GB of record data; returns (path, record bytes)."""
    url = root / "backup-mem"
    cols = columns_for_bytes(256 * MB)
    per = int(sum(a.nbytes for a in (cols.key_data, cols.value_data, cols.header_key_data,
                                     cols.header_value_data)))
    parts = int(gb * 1e9 / per) + 1
    t0 = time.time()
    with BackupWriter(str(url)) as w:
        for p in range(parts):
            w.write_columns("memtest", p, cols)
    print(f"wrote {parts} partitions x {per / MB:.0f} MB of records in {time.time() - t0:.0f} s "
          f"({sum(f.stat().st_size for f in url.rglob('*.kbs')) / MB:.0f} MB on disk)", flush=True)
    return url, parts * per


def measure(url: Path, threads: bool, views: bool = False) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _READER, str(url), "1" if threads else "0", "1" if views else "0"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=5.0, help="GB of record data (keys+values+headers)")
    ap.add_argument("--dir", default=None, help="where to write the temporary backup")
    args = ap.parse_args(argv)
    free = shutil.disk_usage(args.dir or tempfile.gettempdir()).free
    if free < args.gb * 1e9:  # compressed it needs about a third of that
        raise SystemExit(f"not enough free disk ({free / 1e9:.1f} GB) for a {args.gb} GB backup")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kbs-mem-", dir=args.dir) as tmp:
        url, record_bytes = build(Path(tmp), args.gb)
        for threads, views in ((True, False), (False, False), (True, True)):
            r = measure(url, threads, views)
            label = ("thread pool" if threads else "1 thread") + (", binary_view" if views else "")
            print(f"[{label}] {r['rows']} rows, {record_bytes / 1e9:.2f} GB of records in {r['seconds']:.1f} s "
                  f"({record_bytes / r['seconds'] / MB:.0f} MB/s); RSS after imports "
                  f"{r['rss_after_import'] / MB:.0f} MB")
            row = report(f"peak RSS streaming {record_bytes / 1e9:.1f} GB ({label})", r["peak_rss"] / MB,
                         unit="MB")
            row.update(target=TARGET_RSS_MB, meets_target=r["peak_rss"] / MB < TARGET_RSS_MB,
                       threads=threads, binary_view=views, record_bytes=record_bytes, **r)
            print(f"{'':<58} target < {TARGET_RSS_MB} MB: "
                  f"{'ok' if row['meets_target'] else 'MISSED'}")
            rows.append(row)
    payload = {"results": rows}
    save("memory", payload)
    return payload


if __name__ == "__main__":
    main()
