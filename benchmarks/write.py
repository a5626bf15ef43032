"""Write benchmark: Arrow -> zstd-3 segments vs. raw zstd-3 compression of the same record bytes.

Run ``python -m benchmarks.write`` (``--quick`` for a smaller run). Prints

* the reference: ``zstandard`` level 3 compressing every batch's encoded records (exactly the
  bytes the encoder produces), single-threaded, in uncompressed MB/s;
* our encode of an Arrow table into complete segments in memory (Arrow -> columns, record
  encoding into 1 MiB batches, zstd-3, CRC-32 per batch, CRC-64 per segment, segment
  assembly), single-threaded, and its ratio;
* ``BackupWriter`` writing the same table to a local directory (files and manifest included);

then the same for a sweep of record sizes. Results go to ``benchmarks/results/write.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from benchmarks.common import MB, best_time, columns_for_bytes, report, save
from fsspec_kbs.arrow.convert import batch_to_columns, columns_to_batch
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.records import encode_batches, plan_encode
from fsspec_kbs.format.segment import assemble_segment, compress_batch
from fsspec_kbs.store import BackupWriter

TARGET_ENCODE = 0.80
BATCH = 1024 * 1024
SEGMENT = 64 * 1024 * 1024


def make_table(data_bytes: int, value_min: int = 50, value_max: int = 2048) -> tuple[pa.RecordBatch, int]:
    cols = columns_for_bytes(data_bytes, value_min, value_max)
    batch = columns_to_batch(cols, "bench", 0)
    raw = sum(len(b.data) for b in encode_batches(cols, BATCH))
    return batch, raw


def reference(payloads: list[np.ndarray]) -> None:
    zc = zstandard.ZstdCompressor(level=3, write_content_size=True)
    for p in payloads:
        zc.compress(p)


def encode(batch: pa.RecordBatch) -> int:
    """Arrow batch -> complete zstd-3 segments (in memory); returns bytes produced."""
    offsets = batch.column("offset").to_numpy()
    ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
    cols = batch_to_columns(batch, offsets, ts)
    out, pending, size = 0, [], 0
    for encode_one in plan_encode(cols, BATCH):  # as BackupWriter does: each batch just in time
        cb = compress_batch(encode_one(), Codec.ZSTD, 3)
        pending.append(cb)
        size += cb.size
        if size >= SEGMENT:
            out += len(assemble_segment(pending, Codec.ZSTD)[0])
            pending, size = [], 0
    if pending:
        out += len(assemble_segment(pending, Codec.ZSTD)[0])
    return out


def write_dir(batch: pa.RecordBatch, root: Path, i: list[int]) -> None:
    i[0] += 1
    cols = batch_to_columns(batch, batch.column("offset").to_numpy(),
                            batch.column("timestamp").cast(pa.int64()).to_numpy())
    with BackupWriter(str(root / f"backup-w{i[0]}")) as w:
        w.write_columns("bench", 0, cols)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args(argv)
    data_bytes = int((32 if args.quick else 128) * MB)
    repeat = 2 if args.quick else 3
    t0 = time.time()
    batch, raw = make_table(data_bytes)
    offsets = batch.column("offset").to_numpy()
    ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
    payloads = [b.data for b in encode_batches(batch_to_columns(batch, offsets, ts), BATCH)]
    print(f"\n[zstd-3] {batch.num_rows} records, {raw / MB:.1f} MB encoded, {len(payloads)} batches")
    t_ref = best_time(lambda: reference(payloads), repeat)
    t_enc = best_time(lambda: encode(batch), repeat)
    ref = raw / t_ref / MB
    rows = [report("zstd-3: reference (raw zstd-3 compression, 1 thread)", ref),
            report("zstd-3: encode Arrow -> segments, 1 thread", raw / t_enc / MB, ref=ref, target=TARGET_ENCODE)]
    with tempfile.TemporaryDirectory(prefix="kbs-wbench-") as tmp:
        counter = [0]
        t_w = best_time(lambda: write_dir(batch, Path(tmp), counter), repeat)
    rows.append(report("zstd-3: BackupWriter to local files, 1 thread", raw / t_w / MB, ref=ref))
    sweep = []
    if not args.no_sweep:
        print("\n[record-size sweep, zstd-3]")
        for lo, hi in ((16, 48), (50, 200), (200, 800), (50, 2048), (1024, 4096), (4096, 16384)):
            b, r = make_table(data_bytes // 3, lo, hi)
            o = b.column("offset").to_numpy()
            t = b.column("timestamp").cast(pa.int64()).to_numpy()
            pl = [x.data for x in encode_batches(batch_to_columns(b, o, t), BATCH)]
            tr = best_time(lambda pl=pl: reference(pl), repeat)
            te = best_time(lambda b=b: encode(b), repeat)
            row = {"value_bytes": [lo, hi], "mean_record_bytes": round(r / b.num_rows, 1),
                   "zstd3_MBps": round(r / tr / MB, 1), "encode_MBps": round(r / te / MB, 1)}
            print(f"values {lo:>5}-{hi:<5} B (record ~{row['mean_record_bytes']:>7} B): zstd-3 "
                  f"{row['zstd3_MBps']:7.1f}  encode {row['encode_MBps']:7.1f} "
                  f"({row['encode_MBps'] / row['zstd3_MBps']:.2f}) MB/s")
            sweep.append(row)
    payload = {"data_bytes": raw, "repeat": repeat, "results": rows, "sweep": sweep,
               "seconds": round(time.time() - t0, 1)}
    save("write", payload)
    return payload


if __name__ == "__main__":
    main()
