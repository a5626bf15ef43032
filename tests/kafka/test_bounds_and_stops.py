"""Memory bounds of a backup, a restore that stops part-way and continues, an unreachable broker,
librdkafka's logging (issue 24)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import KbsError
from fsspec_kbs.kafka import (
    BackupMemory,
    RestoreIncompleteError,
    parse_offset_ranges,
    run_backup,
    run_restore,
)
from fsspec_kbs.kafka.clients import LOGGER
from fsspec_kbs.store import open_backup
from tests.kafka.helpers import (
    assert_same_records,
    consume_all,
    create_topic,
    make_records,
    produce,
)

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024


@pytest.fixture
def conf(kafka_broker) -> dict:
    return kafka_broker.config()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- memory ------------------------------------------------------------------------------------------
_RSS_CHILD = """
import json, sys
from fsspec_kbs.kafka import BackupMemory, run_backup

def peak_mb():  # VmHWM: ru_maxrss would be inherited across exec from the (bigger) pytest process
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

conf, small, big, root = json.loads(sys.argv[1])
mem = BackupMemory(fetch_queue_bytes=2 << 20, chunk_bytes=1 << 20, buffer_bytes=2 << 20,
                   compress_ahead_bytes=4 << 20, segment_buffer_bytes=4 << 20)
# A small backup first: imports, librdkafka and the compiled kernels are in the baseline.
run_backup(conf, [small], root + "/small", memory=mem, consumer_groups=False, consume_batch=2000)
base = peak_mb()
res = run_backup(conf, [big], root + "/big", memory=mem, consumer_groups=False, consume_batch=2000)
print(json.dumps({"base": base, "peak": peak_mb(), "records": res.records, "bytes": res.bytes}))
"""


def test_backup_memory_is_bounded_by_its_configuration(kafka_broker, conf, tmp_path):
    """~150 MB of records through a backup configured to buffer ~16 MB: the peak RSS grows by far
    less than the topic (an unbounded backup held it all, compressed or not). Not a timed test."""
    small, big = kafka_broker.new_topic("mem-small"), kafka_broker.new_topic("mem-big")
    create_topic(conf, small, 1)
    create_topic(conf, big, 3)
    produce(conf, small, make_records(200, 1, seed=5))
    value = os.urandom(512).hex().encode()  # 1 KiB, little to compress: the backup is ~ the topic
    from confluent_kafka import Producer

    p = Producer({**conf, "linger.ms": 20, "compression.type": "lz4"})
    for i in range(150_000):
        while True:
            try:
                p.produce(big, value, b"k%d" % i, i % 3)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, json.dumps([conf, small, big, str(tmp_path)])],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["records"] == 150_000
    topic_mb = row["bytes"] / MB
    grown = row["peak"] - row["base"]
    assert topic_mb > 140
    # Configured: ~14 MB and 2,000-message consume() batches; plus segment assembly, the
    # compressors' contexts, librdkafka's fetch buffers and allocator slack per thread.
    assert row["base"] > 100, row  # the baseline is a real measurement (imports, kernels)
    assert grown < 100, row
    assert open_backup(str(tmp_path / "big")).manifest.statistics["records"] == 150_000


def test_backup_memory_configuration_is_checked():
    with pytest.raises(KbsError, match="buffer_bytes"):
        BackupMemory(buffer_bytes=0)


# -- a restore that stops part-way -------------------------------------------------------------------
def _corrupt_middle_segment(url: Path, topic: str, partition: int) -> tuple[Path, bytes, int]:
    """Flip a byte inside a batch of the middle segment; returns (file, good bytes, its first offset)."""
    ref = [r for r in open_backup(str(url)).segments() if (r.topic, r.partition) == (topic, partition)]
    mid = ref[len(ref) // 2]
    path = url / "topics" / topic / str(partition) / Path(mid.path).name
    good = path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    path.write_bytes(bytes(bad))
    return path, good, mid.first_offset


def test_restore_stops_at_a_corrupt_segment_reports_and_continues(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("stop")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(2000, 2, seed=24))
    url = tmp_path / "b"
    run_backup(conf, [src], str(url), segment_max_records=100, consumer_groups=False)
    seg, good, first_bad = _corrupt_middle_segment(url, src, 1)

    dst = kafka_broker.new_topic("stop-dst")
    with pytest.raises(RestoreIncompleteError) as info:
        run_restore(str(url), conf, mapping={src: dst}, create_topics=True)
    e = info.value
    assert "stopped" in str(e) and seg.name in str(e)
    # Partition 0 came first and all of it; partition 1 up to the corrupt segment, exactly.
    assert e.reached == {(src, 0): 999, (src, 1): first_bad - 1}
    assert not e.uncertain
    assert e.continue_ranges == [f"{src}:0:1000:", f"{src}:1:{first_bad}:"]
    on_target = consume_all(conf, dst)
    assert_same_records(on_target, [r for r in originals if r["partition"] == 0 or r["offset"] < first_bad])

    # Repaired (e.g. the file copied again from a replica), the run continues where it stopped.
    seg.write_bytes(good)
    runner = CliRunner()
    args = ["restore", str(url), "-b", kafka_broker.bootstrap, "--map", f"{src}:{dst}", "-q"]
    for r in e.continue_ranges:
        args += ["--offset-range", r]
    r = runner.invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert_same_records(consume_all(conf, dst), originals)  # every record once, in order


def test_restore_stop_is_reported_per_partition_by_the_cli(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("stopcli")
    create_topic(conf, src, 1)
    produce(conf, src, make_records(600, 1, seed=25))
    url = tmp_path / "b"
    run_backup(conf, [src], str(url), segment_max_records=100, consumer_groups=False)
    _, _, first_bad = _corrupt_middle_segment(url, src, 0)
    r = CliRunner().invoke(cli, ["restore", str(url), "-b", kafka_broker.bootstrap, "--map", f"{src}:{src}-dst",
                                 "--create-topics", "-q"])
    assert r.exit_code == 2
    assert "restore stopped" in r.output
    assert f"{src}/0 ..{first_bad - 1}" in r.output
    assert f"--offset-range {src}:0:{first_bad}:" in r.output


def test_continuation_ranges_intersect_the_original_ones():
    assert parse_offset_ranges(["t:0:10:50", "t:0:20:", "t:1::5"]) == {("t", 0): (20, 50), ("t", 1): (None, 5)}


# -- unreachable broker, logging ---------------------------------------------------------------------
def test_unreachable_broker_fails_within_the_timeout_in_one_line(tmp_path):
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(KbsError, match=f"cannot reach the Kafka cluster at 127.0.0.1:{port} within 2 s"):
        run_backup({"bootstrap.servers": f"127.0.0.1:{port}"}, ["t"], str(tmp_path / "b"), connect_timeout=2)
    assert time.monotonic() - t0 < 10
    # The CLI, in a process of its own so that librdkafka's own stderr is seen too.
    cmd = [sys.executable, "-m", "fsspec_kbs.cli.main", "backup", "-b", f"127.0.0.1:{port}", "--topic", "t",
           "--to", str(tmp_path), "--connect-timeout", "3", "-q"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert time.monotonic() - t0 < 15
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "cannot reach the Kafka cluster" in lines[0] and "--connect-timeout" in lines[0]


def test_librdkafka_logs_through_python_logging(kafka_broker, conf, tmp_path, caplog):
    src = kafka_broker.new_topic("logs")
    create_topic(conf, src, 1)
    produce(conf, src, make_records(50, 1, seed=7))
    # Default: WARNING and above only, and no raw "%6|…" lines from librdkafka on stderr.
    cmd = [sys.executable, "-m", "fsspec_kbs.cli.main", "backup", "-b", kafka_broker.bootstrap, "--topic", src,
           "--to", str(tmp_path), "--backup-id", "quiet", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "%" not in out.stderr and "BGQUEUE" not in out.stderr, out.stderr
    cmd = [sys.executable, "-m", "fsspec_kbs.cli.main", "restore", str(tmp_path / "quiet"), "-b", kafka_broker.bootstrap,
           "--map", f"{src}:{src}-r", "--create-topics", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "%" not in out.stderr and "BGQUEUE" not in out.stderr, out.stderr
    # An application that wants more sets the logger's level: librdkafka's lines arrive as records.
    # An application that wants more lowers the logger's level (kbs -v does): librdkafka's lines
    # arrive as log records, here its debug lines of the consumer.
    caplog.set_level(logging.DEBUG, logger=LOGGER.name)
    run_backup({**conf, "debug": "consumer"}, [src], str(tmp_path / "verbose"), consumer_groups=False)
    assert any(r.name == LOGGER.name and r.levelno == logging.DEBUG for r in caplog.records)
