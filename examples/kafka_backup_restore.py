"""Back up a Kafka topic and restore it elsewhere, end to end, on a real local broker.

1. starts a throw-away Apache Kafka 4 broker with scripts/kafka.sh (or uses $KBS_KAFKA_BOOTSTRAP),
2. creates topic ``orders`` (3 partitions), produces records and lets consumer group ``billing``
   commit offsets part-way,
3. ``kbs backup`` -> ./kbs-demo/kafka-backups/orders-1 (zstd), then ``kbs validate --deep``,
4. ``kbs restore --dry-run``, then restores into ``orders-restored`` with offset headers and the
   consumer group's offsets translated, and checks every record and the group's position.

    python examples/kafka_backup_restore.py [--records N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]


def kbs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fsspec_kbs.cli.main", *args], check=True)


def read_topic(bootstrap: str, topic: str, partitions: int) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "example-reader", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    while len(eof) < partitions:
        for m in c.consume(1000, timeout=1.0):
            if m.error() is not None:
                eof.add(m.partition())
            else:
                out.append(m)
    c.close()
    return out


def run(bootstrap: str, records: int) -> None:
    root = Path("kbs-demo/kafka-backups").resolve()
    shutil.rmtree(root, ignore_errors=True)
    conf = {"bootstrap.servers": bootstrap}
    admin = AdminClient(conf)
    for f in admin.create_topics([NewTopic("orders", 3, 1)]).values():
        f.result()
    p = Producer(conf)
    for i in range(records):
        p.produce("orders", value=None if i % 100 == 0 else f'{{"order": {i}, "amount": {i % 97}}}'.encode(),
                  key=f"customer-{i % 1000}".encode(), partition=i % 3,
                  headers=[("source", b"web")] if i % 2 else None, timestamp=1_790_000_000_000 + i)
    p.flush()
    # The billing consumer has read a third of partition 0 and half of partition 1.
    c = Consumer({**conf, "group.id": "billing", "enable.auto.commit": False})
    third = records // 9
    c.commit(offsets=[TopicPartition("orders", 0, third), TopicPartition("orders", 1, records // 6)],
             asynchronous=False)
    c.close()

    kbs("backup", "-b", bootstrap, "-t", "orders", "--to", str(root), "--backup-id", "orders-1")
    kbs("validate", str(root / "orders-1"), "--deep")
    kbs("restore", str(root / "orders-1"), "-b", bootstrap, "--map", "orders:orders-restored", "--dry-run")
    # Records keep their (here September 2026) timestamps; a topic with the usual 7-day retention
    # would delete them minutes after the restore, so the created topic keeps them forever.
    kbs("restore", str(root / "orders-1"), "-b", bootstrap, "--map", "orders:orders-restored",
        "--create-topics", "--topic-config", "retention.ms=-1", "--include-offset-headers",
        "--restore-consumer-offsets")

    src = {(m.partition(), m.offset()): m for m in read_topic(bootstrap, "orders", 3)}
    restored = read_topic(bootstrap, "orders-restored", 3)
    assert len(restored) == len(src) == records
    for m in restored:
        h = dict(m.headers())
        orig = src[(m.partition(), int(h["x-kafka-backup-offset"]))]
        assert (m.key(), m.value(), m.timestamp()) == (orig.key(), orig.value(), orig.timestamp())
    group = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("billing")])["billing"].result()
    offsets = {tp.partition: tp.offset for tp in group.topic_partitions if tp.topic == "orders-restored"}
    print(f"restored {len(restored):,} records exactly; group billing on orders-restored: {offsets}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=30_000)
    args = ap.parse_args()

    started = not os.environ.get("KBS_KAFKA_BOOTSTRAP")
    if started:
        out = subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "start"], check=True,
                             capture_output=True, text=True, env={**os.environ, "KBS_PYTHON": sys.executable}).stdout
        bootstrap = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)["KBS_KAFKA_BOOTSTRAP"]
    else:
        bootstrap = os.environ["KBS_KAFKA_BOOTSTRAP"]
    try:
        run(bootstrap, args.records)  # clients are gone when it returns, before the broker stops
    finally:
        if started:
            subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), "stop"], check=False)


if __name__ == "__main__":
    main()
