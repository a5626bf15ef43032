"""Run every codec benchmark and draw the throughput plot: ``python -m benchmarks.run_all``.

``--quick`` shrinks the data (a smoke run); ``--no-memory`` skips the 5 GB streaming test;
``--plot-only`` redraws ``docs/performance-throughput.png`` from the JSON results.
Results: ``benchmarks/results/{read,write,pure_python,index_read,memory}.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import index_read, memory, pure_python, read, write
from benchmarks.common import RESULTS

PLOT = Path(__file__).resolve().parents[1] / "docs" / "performance-throughput.png"


def plot(path: Path = PLOT) -> Path | None:
    """Throughput vs. mean record size (zstd) from the read and write sweeps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    rd = json.loads((RESULTS / "read.json").read_text()).get("sweep", [])
    wr = json.loads((RESULTS / "write.json").read_text()).get("sweep", []) if (RESULTS / "write.json").exists() else []
    fig, ax = plt.subplots(figsize=(8, 5))
    if rd:
        x = [r["mean_record_bytes"] for r in rd]
        ax.plot(x, [r["zstd_MBps"] for r in rd], "k--o", label="raw zstd decompression (1 thread)")
        ax.plot(x, [r["decode_MBps"] for r in rd], "b-o", label="decode -> Arrow, CRC on (1 thread)")
        ax.plot(x, [r["scan_threads_MBps"] for r in rd], "g-o", label="dataset scan, thread pool (2 cores)")
        if all("decode_view_MBps" in r for r in rd):
            ax.plot(x, [r["decode_view_MBps"] for r in rd], "c-^", label="decode -> binary_view, CRC on (1 thread)")
    if wr:
        x = [r["mean_record_bytes"] for r in wr]
        ax.plot(x, [r["zstd3_MBps"] for r in wr], "k:s", label="raw zstd-3 compression (1 thread)")
        ax.plot(x, [r["encode_MBps"] for r in wr], "r-s", label="encode Arrow -> zstd-3 segments (1 thread)")
    ax.set_xscale("log")
    ax.set_xlabel("mean record size (bytes; keys 8-40 B, 20 % with headers)")
    ax.set_ylabel("MB/s of uncompressed record data")
    ax.set_title("fsspec-kbs codec throughput vs. record size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"-> {path}")
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args(argv)
    if not args.plot_only:
        read.main(["--quick"] if args.quick else [])
        write.main(["--quick"] if args.quick else [])
        pure_python.main(["--mb", "2"] if args.quick else [])
        index_read.main(["--quick"] if args.quick else [])
        if not args.no_memory:
            memory.main(["--gb", "1"] if args.quick else [])
    plot()


if __name__ == "__main__":
    main()
