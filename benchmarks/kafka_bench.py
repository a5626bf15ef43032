"""``kbs backup`` and ``kbs restore`` against a real broker, with their limits measured in the same run.

One command::

    python benchmarks/kafka_bench.py [--records 400000] [--partitions 3] [--repeat 3]

Records are realistic (:func:`benchmarks.common.make_columns`: keys 8–40 B, JSON-like values
100 B–2 KB, 20 % with headers). The source topic is loaded once; then, ``--repeat`` times,
interleaved so that load from elsewhere hits all alike:

* **plain consume**: a confluent-kafka consume loop (``consume(num_messages=…)``) reading every
  partition to its end and touching key, value, headers and timestamp, with the backup's own
  consumer settings (:data:`CONSUMER_CONF`): the consuming core;
* **zstd-3**: one thread compressing the same records, encoded as the backup encodes them, in
  1 MiB batches: the compressing core;
* **backup**: ``run_backup`` (zstd-3) into a local directory, in a subprocess whose peak RSS is
  read from ``getrusage(RUSAGE_CHILDREN)``; the plain consume loop runs the same way, so the
  two RSS figures compare;
* **plain produce**: an idempotent Producer with the restore's settings sending the records from
  Python lists — the reference for restore;
* **restore**: ``run_restore`` of the backup into a new topic.

Medians of the runs; ratios: backup wall time / ``max(plain consume, zstd-3)`` (the two-core
limit: target ≤ 1.25) and plain produce / restore (target ≥ 0.9). Uses ``$KBS_KAFKA_BOOTSTRAP``
when set, else starts a broker with ``scripts/kafka.sh`` in ``$KBS_KAFKA_DIR`` (default a
temporary directory) and stops it after. Writes ``benchmarks/results/kafka_bench.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fsspec_kbs.kafka.backup import consumer_tuning  # noqa: E402
from fsspec_kbs.kafka.consume import BackupMemory  # noqa: E402

#: The OSO kafka-backup tool (Rust) on the same kind of records, same machine (issue 24).
OSO_RECORDS_PER_S = (380_000, 420_000)
BACKUP_TARGET = 1.25  # backup wall time / two-core limit, at most
RESTORE_TARGET = 0.9  # plain produce time / restore time, at least
#: The consumer settings ``run_backup`` uses (its fetch tuning with the default memory bounds, and
#: ``check.crcs``), so that the loop is its fair reference.
CONSUMER_CONF = {**consumer_tuning(BackupMemory()), "check.crcs": True, "enable.auto.commit": False,
                 "enable.partition.eof": True}


def start_broker(state: Path) -> tuple[str, dict]:
    env = {**os.environ, "KBS_KAFKA_DIR": str(state), "KBS_PYTHON": sys.executable}
    out = subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "start"], env=env, check=True,
                         capture_output=True, text=True).stdout
    info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return info["KBS_KAFKA_BOOTSTRAP"], env


def create(admin: object, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result()
    while True:
        t = admin.list_topics(topic, timeout=10).topics[topic]
        if t.error is None and len(t.partitions) == partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)


def plain_produce(conf: dict, topic: str, records: list[tuple], partitions: int) -> float:
    """Seconds to produce ``records`` with the restore's producer settings (delivery reports of
    failures only, as a restore asks); every one acknowledged."""
    from confluent_kafka import Producer

    failed: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    from fsspec_kbs.kafka.produce import PRODUCER_DEFAULTS  # loads pyarrow: not in the children

    p = Producer({**PRODUCER_DEFAULTS, "delivery.report.only.error": True, **conf, "enable.idempotence": True,
                  "on_delivery": on_delivery})
    produce, poll = p.produce, p.poll
    t0 = time.perf_counter()
    for i, (k, v, h, ts) in enumerate(records):
        while True:
            try:
                produce(topic, v, k, i % partitions, timestamp=ts, headers=h)
                break
            except BufferError:
                poll(0.05)
    left = p.flush(120)
    elapsed = time.perf_counter() - t0
    assert left == 0 and not failed, (left, failed[:3])
    return elapsed


# -- children: one measurement each, in its own process (peak RSS of that work alone) ---------------
def child_consume(conf: dict, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    parts = sorted(AdminClient(conf).list_topics(topic, timeout=10).topics[topic].partitions)
    c = Consumer({**conf, **CONSUMER_CONF, "group.id": f"bench-{uuid.uuid4().hex}"})
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    todo, n, sink = set(parts), 0, 0
    while todo:
        for m in c.consume(10000, timeout=0.5):
            if m.error() is not None:
                if m.offset() >= ends[m.partition()]:
                    todo.discard(m.partition())
                continue
            k, v, h, ts = m.key(), m.value(), m.headers(), m.timestamp()
            sink += len(v) + (len(k) if k else 0) + (len(h) if h else 0) + ts[1]
            n += 1
            if m.offset() >= ends[m.partition()] - 1:
                todo.discard(m.partition())
    c.close()
    return n


def child_backup(conf: dict, topic: str, url: str) -> int:
    from fsspec_kbs.kafka import run_backup

    return run_backup(conf, [topic], url, compression="zstd", level=3, consumer_groups=False).records


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM): unlike ``ru_maxrss`` it is not inherited from the parent
    across fork + exec (the parent holds the records, ~2 GB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(kind: str, conf: dict, topic: str, url: str = "") -> dict:
    """Run one measurement in a fresh interpreter: its wall time and peak RSS."""
    code = (f"import json, sys, time, resource; sys.path.insert(0, {str(REPO)!r}); "
            f"from benchmarks.kafka_bench import peak_rss_mb, child_{kind} as f; t0 = time.perf_counter(); "
            "n = f(*json.loads(sys.argv[1])); el = time.perf_counter() - t0; "
            "print(json.dumps({'seconds': el, 'records': n, "
            "'maxrss_mb': peak_rss_mb()}))")
    args = [conf, topic] + ([url] if url else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], check=True, capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return row


def cpu_seconds() -> float:
    """CPU time of this process, all threads (librdkafka's included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def zstd_seconds(cols: object) -> tuple[float, float]:
    """One thread compressing the records as the backup encodes them (1 MiB batches, zstd-3):
    (wall, CPU) seconds."""
    import zstandard

    from fsspec_kbs.format import plan_encode

    encoded = [enc().data for enc in plan_encode(cols, 1024 * 1024)]
    z = zstandard.ZstdCompressor(level=3)
    t0, c0 = time.perf_counter(), time.thread_time()
    for data in encoded:
        z.compress(data)
    return time.perf_counter() - t0, time.thread_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="median of N for each measurement")
    args = ap.parse_args()

    # Here, not at the top: the children import this module, and a backup loads no pyarrow.
    from confluent_kafka.admin import AdminClient

    from benchmarks.common import make_columns, records_from_columns, save
    from fsspec_kbs.kafka import run_restore

    tmp = Path(tempfile.mkdtemp(prefix="kbs-kafka-bench-"))
    env = None
    admin = None
    try:
        if os.environ.get("KBS_KAFKA_BOOTSTRAP"):
            bootstrap = os.environ["KBS_KAFKA_BOOTSTRAP"]
        else:
            bootstrap, env = start_broker(Path(os.environ.get("KBS_KAFKA_DIR") or tmp / "broker"))
        conf = {"bootstrap.servers": bootstrap}
        admin = AdminClient(conf)
        n, parts = args.records, args.partitions
        cols = make_columns(n, value_min=100, value_max=2048, seed=24)
        records = records_from_columns(cols)
        payload = int(len(cols.key_data) + len(cols.value_data) + len(cols.header_key_data)
                      + len(cols.header_value_data))
        print(f"{n:,} records, {payload / 1e6:.0f} MB of keys, values and headers, {parts} partitions", flush=True)
        src = f"bench-src-{uuid.uuid4().hex[:8]}"
        create(admin, src, parts)
        plain_produce(conf, src, records, parts)

        runs: dict[str, list[float]] = {}
        rss: dict[str, list[float]] = {}

        def keep(name: str, seconds: float, maxrss: float | None = None) -> None:
            runs.setdefault(name, []).append(seconds)
            if maxrss is not None:
                rss.setdefault(name, []).append(maxrss)

        for rep in range(args.repeat):
            row = run_child("consume", conf, src)
            assert row["records"] == n, row
            keep("plain_consume", row["seconds"], row["maxrss_mb"])
            keep("plain_consume_cpu", row["cpu_seconds"])
            wall, cpu = zstd_seconds(cols)
            keep("zstd3_one_thread", wall)
            keep("zstd3_cpu", cpu)
            url = str(tmp / "backups" / f"b-{rep}")
            row = run_child("backup", conf, src, url)
            assert row["records"] == n, row
            keep("backup", row["seconds"], row["maxrss_mb"])
            keep("backup_cpu", row["cpu_seconds"])
            dst = f"bench-produce-{uuid.uuid4().hex[:8]}"
            create(admin, dst, parts)
            c0 = cpu_seconds()
            keep("plain_produce", plain_produce(conf, dst, records, parts))
            keep("plain_produce_cpu", cpu_seconds() - c0)
            dst2 = f"bench-restore-{uuid.uuid4().hex[:8]}"
            create(admin, dst2, parts)
            t0, c0 = time.perf_counter(), cpu_seconds()
            res = run_restore(url, conf, mapping={src: dst2})
            keep("restore", time.perf_counter() - t0)
            keep("restore_cpu", cpu_seconds() - c0)
            assert res.records == n, res.records
            admin.delete_topics([dst, dst2])
            print(f"run {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items()), flush=True)

        med = {k: statistics.median(v) for k, v in runs.items()}
        limit = max(med["plain_consume"], med["zstd3_one_thread"])
        backup_ratio = med["backup"] / limit
        restore_ratio = med["plain_produce"] / med["restore"]
        peak = {k: max(v) for k, v in rss.items()}
        print()
        for name in ("plain_consume", "zstd3_one_thread", "backup", "plain_produce", "restore"):
            print(f"{name:<18} {med[name]:7.2f} s  {n / med[name]:>10,.0f} records/s  {payload / med[name] / 1e6:7.1f} MB/s"
                  + (f"  peak RSS {peak[name]:6.0f} MB" if name in peak else ""))
        cpu_ratio = med["backup_cpu"] / (med["plain_consume_cpu"] + med["zstd3_cpu"])
        print(f"CPU time: backup {med['backup_cpu']:.2f} s, plain consume {med['plain_consume_cpu']:.2f} s + zstd-3 "
              f"{med['zstd3_cpu']:.2f} s: {cpu_ratio:.2f}x of the work of the two cores")
        print(f"CPU time: restore {med['restore_cpu']:.2f} s, plain produce {med['plain_produce_cpu']:.2f} s: "
              f"{med['restore_cpu'] / med['plain_produce_cpu']:.2f}x")
        print(f"backup / two-core limit max(consume, zstd-3): {backup_ratio:.2f}x  (target <= {BACKUP_TARGET}: "
              f"{'ok' if backup_ratio <= BACKUP_TARGET else 'MISSED'})")
        print(f"restore speed / plain produce loop:           {restore_ratio:.2f}x  (target >= {RESTORE_TARGET}: "
              f"{'ok' if restore_ratio >= RESTORE_TARGET else 'MISSED'})")
        print(f"backup peak RSS: {peak['backup']:.0f} MB (target <= 400 MB)")
        lo, hi = OSO_RECORDS_PER_S
        print(f"kbs backup {n / med['backup']:,.0f} records/s; the OSO tool: {lo:,}-{hi:,} records/s "
              "(issue 24, 1.5 M records of the same kind, same machine)")
        save("kafka_bench", {
            "records": n, "partitions": parts, "payload_bytes": payload, "repeat": args.repeat,
            "median_seconds": {k: round(v, 3) for k, v in med.items()},
            "runs_seconds": {k: [round(x, 3) for x in v] for k, v in runs.items()},
            "peak_rss_mb": {k: round(v) for k, v in peak.items()},
            "records_per_s": {k: round(n / v) for k, v in med.items() if not k.endswith("_cpu")},
            "backup_cpu_vs_consume_cpu_plus_zstd": round(cpu_ratio, 3),
            "restore_cpu_vs_plain_produce_cpu": round(med["restore_cpu"] / med["plain_produce_cpu"], 3),
            "backup_vs_two_core_limit": round(backup_ratio, 3),
            "restore_vs_plain_produce": round(restore_ratio, 3),
            "oso_records_per_s": list(OSO_RECORDS_PER_S),
        })
    finally:
        admin = None  # drop librdkafka clients before their broker goes away (no reconnect noise)
        gc.collect()
        if env is not None:
            subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
