"""Read benchmark: decode segments -> Arrow vs. raw decompression of the same segments.

Run ``python -m benchmarks.read`` (``--quick`` for a smaller run). For each codec it prints

* the reference: the codec's own decompression of every batch frame of the segments
  (``none``: reading the segment files), single-threaded, in uncompressed MB/s; for zstd and
  lz4 the faster of the codec's Python package and Arrow's build of it (which the decoder
  uses), each measured here;
* two ceilings: the reference's work plus the checks no decoder may skip (every batch CRC-32
  and the segment CRC-64), and plus one copy of the record bytes into new memory (what
  ``binary`` columns need at the least): no decoder can reach a higher ratio;
* our decode of the same segments into Arrow record batches (CRC-64 + CRC-32 checks on,
  decompression, record decoding, Arrow construction) single-threaded, and its ratio;
* the same with checks off, giving the cost of the checks;
* both again with zero-copy ``binary_view`` output (``binary_view=True``);
* the whole dataset scan (``KbsDataset.to_batches``) with one thread and with the thread
  pool, giving the multi-core speed-up;
* the one-thread decode and the reference again in a new process that only loaded the
  segments: the rest of the run measures in a process whose heap generating the data warmed
  up, and how an allocator reuses memory changes the figures by up to 2x (see
  ``docs/performance.md``);

then a sweep over record sizes (zstd) for the plot. Results go to ``benchmarks/results/read.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import lz4.frame
import numpy as np
import pyarrow as pa
import zstandard

from benchmarks.common import MB, best_time, columns_for_bytes, report, save
from fsspec_kbs.arrow.convert import columns_to_batch
from fsspec_kbs.dataset import CHUNK_BYTES, KbsDataset
from fsspec_kbs.format.checksums import crc32, crc64_xz
from fsspec_kbs.format.codecs import payload_pool
from fsspec_kbs.format.segment import FOOTER_SIZE, HEADER_SIZE, SegmentReader
from fsspec_kbs.store import BackupWriter

TARGET_DECODE = 0.80
TARGET_CRC_COST = 0.05
TARGET_SPEEDUP = 1.7


def write_backup(root: Path, codec: str, data_bytes: int, segments: int, value_min: int = 50,
                 value_max: int = 2048) -> tuple[Path, list[Path]]:
    """A backup of ``segments`` segments (4 partitions) holding ``data_bytes`` of records."""
    url = root / f"bench-{codec}-{value_min}-{value_max}-{segments}"
    cols = columns_for_bytes(data_bytes, value_min, value_max)
    per_part = max(1, segments // 4)
    with BackupWriter(str(url), compression=codec, segment_max_bytes=1 << 40,
                      segment_max_records=max(1, len(cols) // (4 * per_part))) as w:
        n = len(cols)
        for p in range(4):
            part = cols.slice(p * n // 4, (p + 1) * n // 4)
            w.write_columns("bench", p, part)
    return url, sorted(url.rglob("*.kbs"))


def frames_of(files: list[Path]) -> tuple[list[bytes], list[memoryview], int]:
    """Segment bytes, each batch's frame and the total uncompressed size."""
    datas, frames, total = [], [], 0
    for f in files:
        data = f.read_bytes()
        datas.append(data)
        for info in SegmentReader(data, str(f)).batches():
            frames.append(memoryview(data)[info.data_position : info.end])
            total += info.uncompressed_size
    return datas, frames, total


def reference(codec: str, files: list[Path], frames: list[memoryview]) -> None:
    if codec == "zstd":
        d = zstandard.ZstdDecompressor()
        for fr in frames:
            d.decompress(fr)
    elif codec == "lz4":
        for fr in frames:
            lz4.frame.decompress(fr)
    else:
        for f in files:
            with open(f, "rb") as fh:
                fh.read()


def _arrow_codec(codec: str, frames: list[memoryview], sizes: list[int]) -> None:
    arrow = pa.Codec(codec)
    for fr, n in zip(frames, sizes, strict=True):
        arrow.decompress(fr, decompressed_size=n, memory_pool=payload_pool())


def reference_time(codec: str, files: list[Path], frames: list[memoryview], repeat: int) -> float:
    """Best time of the reference; for zstd and lz4, of whichever library is faster now: the
    codec's Python package or Arrow's build of it (which the decoder uses)."""
    t = best_time(lambda: reference(codec, files, frames), repeat)
    if codec == "zstd":
        sizes = [zstandard.frame_content_size(fr) for fr in frames]
    elif codec == "lz4":
        sizes = [lz4.frame.get_frame_info(fr)["content_size"] for fr in frames]
    else:
        return t
    return min(t, best_time(lambda: _arrow_codec(codec, frames, sizes), repeat))


def checks(datas: list[bytes], frames: list[memoryview]) -> None:
    """The checks every decode must make, alone: each batch's CRC-32 and the segment CRC-64."""
    for fr in frames:
        crc32(fr)
    for data in datas:
        crc64_xz(memoryview(data)[HEADER_SIZE : len(data) - FOOTER_SIZE])


def copy_records(sizes: list[int]) -> None:
    """One copy of every decompressed batch (here: of as many bytes, from a cached source)
    into new pool memory: what filling ``binary`` columns costs at the least."""
    source = np.zeros(max(sizes), np.uint8)
    for n in sizes:
        out = np.frombuffer(pa.allocate_buffer(n), np.uint8)
        out[:] = source[:n]


def _two_threads(fn: Any, *args: Any) -> None:
    """``fn(*args)`` twice at once on two threads."""
    ts = [threading.Thread(target=fn, args=args) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def decode(codec: str, files: list[Path], datas: list[bytes], verify: bool, views: bool = False) -> int:
    rows = 0
    for f, data in zip(files, datas, strict=True):
        if codec == "none":  # compared with reading the files, so read them here too
            with open(f, "rb") as fh:
                data = fh.read()
        reader = SegmentReader(data, str(f), verify, crc64_last=True)  # as scans read (KbsBackup.open_chunks)
        for cols in reader.iter_columns(CHUNK_BYTES, threads=1, views=views):
            rows += columns_to_batch(cols, "bench", 0).num_rows
    return rows


_NEW_PROCESS = """
import json, sys
from pathlib import Path
from benchmarks.common import best_time
from benchmarks.read import decode, frames_of, reference_time
codec, repeat, files = sys.argv[1], int(sys.argv[2]), [Path(f) for f in sys.argv[3:]]
datas, frames, total = frames_of(files)
decode(codec, files, datas, True)  # loads the cached kernels
t = best_time(lambda: decode(codec, files, datas, True), repeat)
print(json.dumps({"decode": t, "reference": reference_time(codec, files, frames, repeat), "total": total}))
"""


def new_process(codec: str, files: list[Path], repeat: int) -> dict[str, float]:
    """Best one-thread decode and reference times in a new process (see the module docstring)."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _NEW_PROCESS, codec, str(repeat), *map(str, files)],
                         check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def scan(url: Path, threads: bool, views: bool = False) -> int:
    batches = KbsDataset.open(str(url)).to_batches(use_threads=threads, binary_view=views)
    return sum(b.num_rows for b in batches)


def bench_codec(root: Path, codec: str, data_bytes: int, segments: int, repeat: int) -> list[dict[str, Any]]:
    url, files = write_backup(root, codec, data_bytes, segments)
    datas, frames, total = frames_of(files)
    comp = sum(len(d) for d in datas)
    print(f"\n[{codec}] {len(files)} segments, {total / MB:.1f} MB of record data, "
          f"{comp / MB:.1f} MB on disk, {len(frames)} batches")
    ref_name = "read segment files" if codec == "none" else f"raw {codec} decompression"
    t_ref = reference_time(codec, files, frames, repeat)
    t_on = best_time(lambda: decode(codec, files, datas, True), repeat)
    t_off = best_time(lambda: decode(codec, files, datas, False), repeat)
    t_st = best_time(lambda: scan(url, False), repeat, cpu=False)
    t_st_cpu = best_time(lambda: scan(url, False), repeat)
    t_mt = best_time(lambda: scan(url, True), repeat, cpu=False)
    t_von = best_time(lambda: decode(codec, files, datas, True, views=True), repeat)
    t_voff = best_time(lambda: decode(codec, files, datas, False, views=True), repeat)
    t_vst = best_time(lambda: scan(url, False, views=True), repeat, cpu=False)
    t_vmt = best_time(lambda: scan(url, True, views=True), repeat, cpu=False)
    # How close any decoder can come to the reference: it does the reference's work plus at
    # least the mandatory checks (and, for binary columns, one copy of the record bytes).
    t_checks = best_time(lambda: checks(datas, frames), repeat)
    sizes = [info.uncompressed_size for d in datas for info in SegmentReader(d, verify_checksums=False).batches()]
    t_copy = best_time(lambda: copy_records(sizes), repeat)
    ref = total / t_ref / MB
    rows = [
        report(f"{codec}: reference ({ref_name}, 1 thread)", ref),
        report(f"{codec}: ceiling: reference + the CRC checks", total / (t_ref + t_checks) / MB, ref=ref),
        report(f"{codec}: ceiling: reference + CRC checks + one copy", total / (t_ref + t_checks + t_copy) / MB,
               ref=ref),
        report(f"{codec}: decode -> Arrow, CRC on, 1 thread", total / t_on / MB, ref=ref, target=TARGET_DECODE),
        report(f"{codec}: decode -> Arrow, CRC off, 1 thread", total / t_off / MB, ref=ref),
    ]
    crc_cost = t_on / t_off - 1
    rows.append({"name": f"{codec}: CRC cost (time with / without - 1)", "value": round(crc_cost, 4),
                 "unit": "fraction", "target": TARGET_CRC_COST, "meets_target": crc_cost <= TARGET_CRC_COST})
    print(f"{codec + ': CRC cost':<58} {crc_cost * 100:10.1f} %   (target <= {TARGET_CRC_COST * 100:.0f} %: "
          f"{'ok' if crc_cost <= TARGET_CRC_COST else 'MISSED'})")
    rows.append(report(f"{codec}: dataset scan, 1 thread (CPU time)", total / t_st_cpu / MB, ref=ref))
    rows.append(report(f"{codec}: dataset scan, 1 thread (wall time)", total / t_st / MB, ref=ref))
    rows.append(report(f"{codec}: dataset scan, thread pool", total / t_mt / MB, ref=ref, target=TARGET_DECODE))
    rows.append(report(f"{codec}: binary_view decode, CRC on, 1 thread", total / t_von / MB, ref=ref,
                       target=TARGET_DECODE))
    rows.append(report(f"{codec}: binary_view decode, CRC off, 1 thread", total / t_voff / MB, ref=ref))
    vcost = t_von / t_voff - 1
    rows.append({"name": f"{codec}: binary_view CRC cost", "value": round(vcost, 4), "unit": "fraction",
                 "target": TARGET_CRC_COST, "meets_target": vcost <= TARGET_CRC_COST})
    print(f"{codec + ': binary_view CRC cost':<58} {vcost * 100:10.1f} %")
    rows.append(report(f"{codec}: binary_view dataset scan, 1 thread (wall time)", total / t_vst / MB, ref=ref))
    rows.append(report(f"{codec}: binary_view dataset scan, thread pool", total / t_vmt / MB, ref=ref,
                       target=TARGET_DECODE))
    rows.append(report(f"{codec}: binary_view thread pool speed-up over 1 thread", t_vst / t_vmt, unit="x"))
    if codec != "none":
        # What the machine gives right now: the codec alone on two threads (other load counts).
        t_ref2 = best_time(lambda: _two_threads(reference, codec, files, frames), repeat, cpu=False)
        t_ref1 = best_time(lambda: reference(codec, files, frames), repeat, cpu=False)
        rows.append(report(f"{codec}: raw {codec} on 2 threads, speed-up (machine headroom)",
                           2 * t_ref1 / t_ref2, unit="x"))
    rows.append(report(f"{codec}: thread pool speed-up over 1 thread", t_st / t_mt, unit="x"))
    rows[-1]["target"] = TARGET_SPEEDUP
    rows[-1]["meets_target"] = t_st / t_mt >= TARGET_SPEEDUP
    fresh = new_process(codec, files, repeat)
    fresh_ref = total / fresh["reference"] / MB
    rows.append(report(f"{codec}: new process: reference", fresh_ref))
    rows.append(report(f"{codec}: new process: decode -> Arrow, CRC on, 1 thread", total / fresh["decode"] / MB,
                       ref=fresh_ref))
    for r in rows:
        r["codec"] = codec
    return rows


def sweep(root: Path, data_bytes: int, repeat: int) -> list[dict[str, Any]]:
    """zstd decode and raw decompression throughput vs. mean value size."""
    print("\n[record-size sweep, zstd]")
    out = []
    for lo, hi in ((16, 48), (50, 200), (200, 800), (50, 2048), (1024, 4096), (4096, 16384)):
        url, files = write_backup(root, "zstd", data_bytes, 2, lo, hi)
        datas, frames, total = frames_of(files)
        nrec = sum(SegmentReader(d).header.record_count for d in datas)
        t_ref = reference_time("zstd", files, frames, repeat)
        t_on = best_time(partial(decode, "zstd", files, datas, True), repeat)
        t_mt = best_time(partial(scan, url, True), repeat, cpu=False)
        t_view = best_time(partial(decode, "zstd", files, datas, True, True), repeat)
        row = {"value_bytes": [lo, hi], "mean_record_bytes": round(total / nrec, 1),
               "zstd_MBps": round(total / t_ref / MB, 1), "decode_MBps": round(total / t_on / MB, 1),
               "scan_threads_MBps": round(total / t_mt / MB, 1),
               "decode_view_MBps": round(total / t_view / MB, 1)}
        print(f"values {lo:>5}-{hi:<5} B (record ~{row['mean_record_bytes']:>7} B): zstd {row['zstd_MBps']:7.1f}"
              f"  decode {row['decode_MBps']:7.1f} ({row['decode_MBps'] / row['zstd_MBps']:.2f})"
              f"  binary_view {row['decode_view_MBps']:7.1f} ({row['decode_view_MBps'] / row['zstd_MBps']:.2f})"
              f"  scan(threads) {row['scan_threads_MBps']:7.1f} MB/s")
        out.append(row)
        shutil.rmtree(url)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller data, fewer repeats")
    ap.add_argument("--mb", type=int, default=None, help="MB of record data per codec")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args(argv)
    data_bytes = int((args.mb or (48 if args.quick else 128)) * MB)
    repeat = 2 if args.quick else 3
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    sweep_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kbs-bench-") as tmp:
        root = Path(tmp)
        for codec in ("zstd", "lz4", "none"):
            rows += bench_codec(root, codec, data_bytes, 8, repeat)
        if not args.no_sweep:
            sweep_rows = sweep(root, data_bytes // 3, repeat)
    payload = {"data_bytes_per_codec": data_bytes, "repeat": repeat, "results": rows, "sweep": sweep_rows,
               "seconds": round(time.time() - t0, 1)}
    save("read", payload)
    return payload


if __name__ == "__main__":
    main()
