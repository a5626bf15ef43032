"""Bytes read by a narrow query with and without batch indexes (kbs-format.md §7):
``python -m benchmarks.index_read [--mb 256] [--quick] [--no-s3]``.

One partition of realistic records (``benchmarks.common``: keys 8–40 B, JSON-like values
100 B–2 KB, 20 % with headers; monotonic timestamps) is written twice, with indexes (the
default) and without (``BackupWriter(index=False)``, as before KBS 1.2). Two queries: 1 % of
the partition's offsets and a 1 % time window, both in the middle. For each, on a local disk
and on a moto S3 server (a separate process, spoken to over HTTP):

* bytes read: on the local disk, what this process read from files while the query ran
  (``rchar`` of ``/proc/self/io``: every byte a ``read`` returned); on S3, the payload bytes
  of every GET (whole and ranged, counted in the s3fs filesystem the query uses);
* the target: stored bytes of the batches holding matching records, plus the manifest and
  the index files the query needs (every index of the partition for a time window: a
  segment's manifest time range alone never prunes it); target ratio ≤ 1.2;
* the reference: the same query on the backup without indexes (whole segments);
* wall time, median of 3.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import fsspec_kbs
from benchmarks.common import columns_for_bytes, save
from fsspec_kbs.store import BackupWriter, KbsBackup
from fsspec_kbs.store.batch_index import index_path

TARGET = 1.2


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def write(url: str, so: dict, cols: Any, index: bool) -> None:
    with BackupWriter(url, so, index=index) as w:
        w.write_columns("bench", 0, cols)


def needed(url: str, so: dict, bounds: tuple) -> int:
    """Stored bytes of the matching batches + the manifest + the index files the query reads."""
    b = KbsBackup.open(url, so)
    total = len(b.fs.cat_file(f"{b.path}/manifest.json"))
    for ref in b.segments():
        if bounds[2] is None and not ref.may_contain(*bounds):
            continue  # an offset query prunes by the manifest's offsets
        idx = b.batch_index(ref)
        assert idx is not None, ref.path
        runs = idx.select(*bounds)
        total += idx.stored_bytes(runs) + len(b.fs.cat_file(index_path(ref.path)))
    return total


_S3_READ = [0]


def counting_s3(so: dict) -> Any:
    """An s3fs filesystem counting the payload bytes of its GETs (cat, ranged cat, open)."""
    import s3fs

    class CountingS3(s3fs.S3FileSystem):
        async def _cat_file(self, path: str, *a: Any, **kw: Any) -> bytes:
            data = await super()._cat_file(path, *a, **kw)
            _S3_READ[0] += len(data)
            return data

        def _open(self, *a: Any, **kw: Any) -> Any:
            f = super()._open(*a, **kw)
            fetch = f.cache.fetcher  # the file's cache was given its bound _fetch_range

            def counted(start: int, end: int) -> bytes:
                data = fetch(start, end)
                _S3_READ[0] += len(data)
                return data

            f.cache.fetcher = counted
            return f

    return CountingS3(skip_instance_cache=True, **so)


def query(url: str, fs: Any, bounds: tuple) -> tuple[int, int, float]:
    """(rows, bytes read, seconds) of one bounded read (what read_table does: manifest, then
    a filtered dataset scan) on ``fs`` (None: the local disk)."""
    s0, s1, t0, t1 = bounds
    count = (lambda: _S3_READ[0]) if fs is not None else rchar
    before, start = count(), time.perf_counter()
    ds = fsspec_kbs.KbsDataset(KbsBackup.open(url, fs=fs)).filter(
        start_offset=s0, end_offset=s1, start_time=t0, end_time=t1)
    t = ds.to_table(columns=["offset", "value"])
    return t.num_rows, count() - before, time.perf_counter() - start


def measure(store: str, urls: dict[str, str], so: dict, q: dict[str, tuple]) -> list[dict]:
    out = []
    fs = counting_s3(so) if store == "s3" else None
    for name, bounds in q.items():
        need = needed(urls["indexed"], so, bounds)
        row: dict[str, Any] = {"store": store, "query": name, "needed_bytes": need}
        for kind, url in urls.items():
            query(url, fs, bounds)  # warm-up: imports, connections
            runs = [query(url, fs, bounds) for _ in range(3)]
            row[f"{kind}_rows"] = runs[0][0]
            row[f"{kind}_bytes"] = int(statistics.median(r[1] for r in runs))
            row[f"{kind}_s"] = round(statistics.median(r[2] for r in runs), 4)
        assert row["indexed_rows"] == row["no_index_rows"], row
        row["ratio_to_needed"] = round(row["indexed_bytes"] / need, 3)
        row["meets_target"] = row["ratio_to_needed"] <= TARGET
        row["no_index_over_indexed_bytes"] = round(row["no_index_bytes"] / max(1, row["indexed_bytes"]), 1)
        print(f"{store:<6} {name:<7} rows {row['indexed_rows']:>7,}  needed {need / 1e6:8.3f} MB  "
              f"indexed {row['indexed_bytes'] / 1e6:8.3f} MB ({row['ratio_to_needed']:.2f}x needed, target <= "
              f"{TARGET}: {'ok' if row['meets_target'] else 'MISSED'}) {row['indexed_s'] * 1e3:7.1f} ms  |  "
              f"no index {row['no_index_bytes'] / 1e6:8.2f} MB {row['no_index_s'] * 1e3:7.1f} ms", flush=True)
        out.append(row)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def moto() -> tuple[subprocess.Popen, dict]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    so = {"key": "testing", "secret": "testing", "endpoint_url": f"http://127.0.0.1:{port}"}
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, so


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="record data in the partition (MB)")
    ap.add_argument("--quick", action="store_true", help="32 MB")
    ap.add_argument("--no-s3", action="store_true")
    args = ap.parse_args(argv)
    mb = 32 if args.quick else args.mb
    cols = columns_for_bytes(mb * 1024 * 1024, 100, 2048)
    n = len(cols)
    ts = cols.timestamps
    lo, hi = n // 2, n // 2 + max(1, n // 100)
    q = {"offset": (int(cols.offsets[lo]), int(cols.offsets[hi]), None, None),
         "time": (None, None, int(ts[lo]), int(ts[hi]))}
    print(f"{n:,} records, {mb} MB of record data in one partition; 1 % queries: {q}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        urls = {k: f"{tmp}/{k}" for k in ("indexed", "no_index")}
        for k, url in urls.items():
            write(url, {}, cols, index=k == "indexed")
        rows += measure("local", urls, {}, q)
    if not args.no_s3:
        proc, so = moto()
        try:
            import s3fs

            fs = s3fs.S3FileSystem(**so)
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            fs.mkdir(bucket)
            urls = {k: f"s3://{bucket}/{k}" for k in ("indexed", "no_index")}
            for k, url in urls.items():
                write(url, so, cols, index=k == "indexed")
            rows += measure("s3", urls, so, q)
        finally:
            proc.terminate()
            proc.wait()
    save("index_read", {"mb": mb, "records": n, "queries": {k: list(v) for k, v in q.items()}, "rows": rows,
                        "load_avg_at_end": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
