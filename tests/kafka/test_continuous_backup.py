"""Continuous backup, end to end: ``readStream.format("kafka")`` -> ``writeStream.format("kbs")``
against a real broker, stopped and killed mid-way, restarted from its checkpoint: the backup
holds every produced record exactly once, offsets, timestamps and headers intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store.commit import STREAMS_FIELD
from tests.fixtures.spark import require_spark_kafka, spark_kafka_jars
from tests.kafka.helpers import consume_all, create_topic, make_records, produce
from tests.kafka.test_backup_restore import backup_rows, strip

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
from spark_continuous_backup import start_backup  # noqa: E402


def _committed_batch(url: str) -> int:
    try:
        doc = json.loads((Path(url) / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return -1
    return max((e["batch"] for e in doc.get(STREAMS_FIELD, {}).values()), default=-1)


def _wait_for_batch(url: str, batch: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _committed_batch(url) < batch:
        assert time.monotonic() < deadline, f"no micro-batch {batch} committed to {url} in {timeout}s"
        time.sleep(0.2)


def _produce_slowly(conf: dict, topic: str, records: list[dict], chunks: int) -> threading.Thread:
    """Produce in ``chunks`` pieces, 0.3 s apart, while the stream runs."""
    def run() -> None:
        step = -(-len(records) // chunks)
        for i in range(0, len(records), step):
            produce(conf, topic, records[i:i + step])
            time.sleep(0.3)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _check_exactly_once(url: str, produced: list[dict]) -> None:
    got = backup_rows(url)
    assert len(got) == len(produced), f"{len(got)} records in the backup, {len(produced)} produced"
    assert strip(got) == strip(produced)
    report = validate_backup(url, deep=True)
    assert report.ok, report.defects


def test_stop_and_restart_from_checkpoint(spark, kafka_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_spark_kafka(spark)
    conf = kafka_broker.config()
    topic = kafka_broker.new_topic("orders")
    create_topic(conf, topic, 3)
    records = make_records(2400, 3)
    url, ckpt = str(tmp_path / "backup-1"), str(tmp_path / "ckpt")
    produce(conf, topic, records[:600])
    q = start_backup(spark, kafka_broker.bootstrap, topic, url, ckpt, trigger_seconds=0.5,
                     max_offsets_per_trigger=300)
    producer = _produce_slowly(conf, topic, records[600:1800], 6)
    _wait_for_batch(url, 2)
    q.stop()  # mid-way: records are still being produced
    producer.join(60)
    produce(conf, topic, records[1800:])
    # Restart from the checkpoint; AvailableNow: catch up, then stop.
    q2 = start_backup(spark, kafka_broker.bootstrap, topic, url, ckpt, available_now=True)
    assert q2.id == q.id
    q2.awaitTermination(180)
    assert q2.exception() is None, q2.exception()
    _check_exactly_once(url, consume_all(conf, topic))


def _driver(kafka_broker, topic: str, url: str, ckpt: str, *extra: str) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
           "KBS_SPARK_KAFKA_JARS": spark_kafka_jars()}
    return subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "spark_continuous_backup.py"), "--bootstrap", kafka_broker.bootstrap,
         "--topic", topic, "--backup", url, "--checkpoint", ckpt, *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def test_kill_9_driver_and_restart(spark, kafka_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    require_spark_kafka(spark)
    conf = kafka_broker.config()
    topic = kafka_broker.new_topic("payments")
    create_topic(conf, topic, 2)
    records = make_records(3000, 2, seed=7)
    url, ckpt = str(tmp_path / "backup-2"), str(tmp_path / "ckpt")
    produce(conf, topic, records[:500])
    driver = _driver(kafka_broker, topic, url, ckpt, "--trigger-seconds", "0.3", "--max-offsets-per-trigger", "200")
    try:
        producer = _produce_slowly(conf, topic, records[500:2500], 10)
        _wait_for_batch(url, 3, timeout=240)
        # kill -9 the driver (the Python process and its JVM), whatever it is doing.
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        producer.join(60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert _committed_batch(url) >= 3
    produce(conf, topic, records[2500:])
    again = _driver(kafka_broker, topic, url, ckpt, "--available-now")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out.decode(errors="replace")[-4000:]
    _check_exactly_once(url, consume_all(conf, topic))
