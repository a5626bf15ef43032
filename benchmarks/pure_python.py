"""Throughput of the interpreted fallback (``FSSPEC_KBS_NO_JIT=1``): ``python -m benchmarks.pure_python``.

Runs itself in a subprocess with the variable set, so nothing is compiled; reads and writes
zstd segments of generated records (8 MB by default) and prints MB/s of uncompressed record
data. Results go to ``benchmarks/results/pure_python.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import MB, report, save

_CHILD = r"""
import json, sys, time
from fsspec_kbs.format import kernels
assert not kernels.JIT_ENABLED, "FSSPEC_KBS_NO_JIT did not take"
from benchmarks.common import columns_for_bytes
from fsspec_kbs.arrow.convert import columns_to_batch
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.records import encode_batches
from fsspec_kbs.format.segment import SegmentReader, encode_segment
cols = columns_for_bytes(int(sys.argv[1]))
t0 = time.process_time()
batches = encode_batches(cols, 1 << 20)
data, stats = encode_segment(batches, Codec.ZSTD, 3)
t_write = time.process_time() - t0
t0 = time.process_time()
rows = sum(columns_to_batch(c, "t", 0).num_rows for c in SegmentReader(data).iter_columns(4 << 20))
t_read = time.process_time() - t0
print(json.dumps({"bytes": stats.uncompressed_bytes, "records": rows, "write_s": t_write, "read_s": t_read}))
"""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=8)
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, FSSPEC_KBS_NO_JIT="1", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(int(args.mb * MB))], env=env, cwd=root,
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n[pure Python, FSSPEC_KBS_NO_JIT=1] {r['records']} records, {r['bytes'] / MB:.1f} MB, zstd-3")
    rows = [report("pure Python: read zstd segment -> Arrow (CPU time)", r["bytes"] / r["read_s"] / MB),
            report("pure Python: encode -> zstd-3 segment (CPU time)", r["bytes"] / r["write_s"] / MB)]
    payload = {"results": rows, **r}
    save("pure_python", payload)
    return payload


if __name__ == "__main__":
    main()
