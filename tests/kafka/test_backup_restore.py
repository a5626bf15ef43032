"""kbs backup / kbs restore against a real Apache Kafka broker (scripts/kafka.sh)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import confluent_kafka
import pytest
from click.testing import CliRunner
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from fsspec_kbs.cli.main import cli
from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import CommitConflictError, KbsError
from fsspec_kbs.kafka import (
    IncrementalGapWarning,
    RetentionWarning,
    read_group_offsets,
    run_backup,
    run_restore,
)
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import Checkpoint
from tests.kafka.helpers import (
    BASE_TS,
    assert_same_records,
    by_partition,
    consume_all,
    create_topic,
    make_records,
    produce,
)

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def backup_rows(url: str) -> list[dict]:
    """What a backup holds, as records comparable with :func:`produce`'s output."""
    t = KbsDataset.open(url).to_table()
    rows = []
    for r in t.to_pylist():
        rows.append({"topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "key": r["key"],
                     "value": r["value"], "timestamp": int(r["timestamp"].timestamp() * 1000),
                     "headers": [(h["key"], h["value"]) for h in r["headers"] or []] or None})
    return rows


def strip(rows: list[dict]) -> list[tuple]:
    return sorted((r["topic"], r["partition"], r["offset"], r["key"], r["value"], r["timestamp"],
                   tuple(tuple(h) for h in r["headers"] or ())) for r in rows)


@pytest.fixture
def conf(kafka_broker) -> dict:
    return kafka_broker.config()


def test_roundtrip_via_cli_every_field(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("orders")
    create_topic(conf, src, 3)
    originals = produce(conf, src, make_records(1500, 3))
    runner = CliRunner()
    r = runner.invoke(cli, ["backup", "-b", kafka_broker.bootstrap, "-t", src, "--to", str(tmp_path),
                            "--backup-id", "b1", "--segment-max-records", "200", "--compression", "lz4", "-q"])
    assert r.exit_code == 0, r.output
    url = str(tmp_path / "b1")
    man = json.loads((tmp_path / "b1" / "manifest.json").read_text())
    assert man["source_cluster"]["cluster_id"]
    assert man["source_cluster"]["bootstrap_servers"] == [kafka_broker.bootstrap]
    assert man["compression"]["algorithm"] == "lz4"
    assert man["statistics"]["records"] == 1500
    assert all(s["records"] <= 200 for t in man["topics"] for p in t["partitions"] for s in p["segment_index"])
    ck = Checkpoint.from_json((tmp_path / "b1" / "checkpoints" / "checkpoint.json").read_bytes())
    assert {p: v.offset for p, v in ck.topics[src].items()} == {p: 499 for p in range(3)}
    assert strip(backup_rows(url)) == strip(originals)

    r = runner.invoke(cli, ["validate", url, "--deep"])
    assert r.exit_code == 0, r.output
    assert validate_backup(url, deep=True).ok

    dst = kafka_broker.new_topic("restored")
    r = runner.invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--map", f"{src}:{dst}", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "dry run" in r.output
    dry = run_restore(url, conf, mapping={src: dst}, dry_run=True)
    assert [(pp.target, pp.partition, pp.records, pp.first_offset, pp.last_offset) for pp in dry.plan] == [
        (dst, p, 500, 0, 499) for p in range(3)]
    assert dst not in AdminClient(conf).list_topics(timeout=10).topics  # dry run created nothing
    r = runner.invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--map", f"{src}:{dst}"])
    assert r.exit_code != 0 and "--create-topics" in r.output
    r = runner.invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--map", f"{src}:{dst}", "--create-topics",
                            "--include-offset-headers", "-q"])
    assert r.exit_code == 0, r.output
    restored = consume_all(conf, dst)
    assert len(AdminClient(conf).list_topics(timeout=10).topics[dst].partitions) == 3
    assert all(r["timestamp_type"] == 1 for r in restored)  # CreateTime, the original value
    assert_same_records(restored, originals, lambda w: [
        ("x-kafka-backup-offset", str(w["offset"]).encode()),
        ("x-kafka-backup-timestamp", str(w["timestamp"]).encode()),
        ("x-kafka-backup-partition", str(w["partition"]).encode())])


def test_restore_oso_offset_headers_and_secrets_not_printed(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("oso")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(200, 2, seed=5))
    url = str(tmp_path / "b")
    run_backup(conf, [src], url)
    dst = kafka_broker.new_topic("oso-restored")
    cfg = tmp_path / "client.properties"
    cfg.write_text(f"# test\nbootstrap.servers={kafka_broker.bootstrap}\nsasl.password=hunter2\n")
    # sasl.password alone (security.protocol PLAINTEXT) is ignored by librdkafka with a warning only.
    r = CliRunner().invoke(cli, ["restore", url, "--config", str(cfg), "--map", f"{src}:{dst}", "--create-topics",
                                 "--include-offset-headers", "--offset-header-style", "oso"])
    assert r.exit_code == 0, r.output
    assert "hunter2" not in r.output
    assert_same_records(consume_all(conf, dst), originals, lambda w: [
        ("x-original-offset", struct.pack("<q", w["offset"])),
        ("x-original-timestamp", struct.pack("<q", w["timestamp"])),
        ("x-source-partition", struct.pack("<i", w["partition"]))])


def _checkpoint_offsets(path: Path) -> dict:
    try:
        ck = Checkpoint.from_json(path.read_bytes())
    except (FileNotFoundError, KbsError):
        return {}
    return {(t, p): v.offset for t, ps in ck.topics.items() for p, v in ps.items()}


def test_resume_after_kill_9_no_loss_no_duplicates(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("resume")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(4000, 2, seed=2))
    # A backup slowed down by its on_chunk hook (tests/kafka/slow_backup.py), killed part-way.
    cmd = [sys.executable, "-m", "tests.kafka.slow_backup", kafka_broker.bootstrap, src, str(tmp_path / "b"),
           "0.05", "150"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ck_path = tmp_path / "b" / "checkpoints" / "checkpoint.json"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            offs = _checkpoint_offsets(ck_path)
            if offs and sum(o + 1 for o in offs.values()) >= 900:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        else:
            pytest.fail("backup made no progress")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "b" / "manifest.json").exists()
    at_kill = _checkpoint_offsets(ck_path)
    assert sum(o + 1 for o in at_kill.values()) < 4000, "killed too late to test anything"
    # A segment the checkpoint does not vouch for (as if kill -9 hit between write and checkpoint).
    stray = tmp_path / "b" / "topics" / src / "0" / "segment-00009999.kbs"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"KBS1 half-written")
    # Records produced after the cut must not enter the resumed backup either.
    produce(conf, src, make_records(50, 2, seed=3))

    with pytest.raises(CommitConflictError):
        run_backup(conf, [src], str(tmp_path / "b"))  # not --resume: refuses to touch it
    res = run_backup(conf, [src], str(tmp_path / "b"), resume=True, segment_max_records=150)
    assert res.resumed
    assert 0 < res.records < 4000
    assert not stray.exists()
    assert strip(backup_rows(str(tmp_path / "b"))) == strip(originals)
    assert validate_backup(str(tmp_path / "b"), deep=True).ok
    with pytest.raises(CommitConflictError):
        run_backup(conf, [src], str(tmp_path / "b"), resume=True)


def test_incremental_backup_and_restore_both(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("incr")
    create_topic(conf, src, 3)
    first = produce(conf, src, make_records(600, 3, seed=7))
    b1 = str(tmp_path / "b1")
    r1 = run_backup(conf, [src], b1)
    assert r1.records == 600
    second = produce(conf, src, make_records(300, 3, seed=8, base_ts=BASE_TS + 10_000_000))
    b2 = str(tmp_path / "b2")
    r2 = run_backup(conf, [src], b2, incremental_from=b1)
    assert r2.records == 300
    assert strip(backup_rows(b2)) == strip(second)
    man = json.loads((tmp_path / "b2" / "manifest.json").read_text())
    assert man["kafka"]["backup_type"] == "incremental"
    r3 = run_backup(conf, [src], str(tmp_path / "b3"), incremental_from=b2)
    assert r3.records == 0

    dst = kafka_broker.new_topic("incr-restored")
    run_restore(b1, conf, mapping={src: dst}, create_topics=True)
    run_restore(b2, conf, mapping={src: dst})
    assert_same_records(consume_all(conf, dst), first + second)


def test_incremental_backup_reports_records_deleted_in_between(kafka_broker, conf, tmp_path):
    """Records retention deleted between two backups of a chain are in neither: the second one says
    so (a warning, ``BackupResult.gaps``, ``kafka.gaps`` in its manifest) instead of a silent hole."""
    src = kafka_broker.new_topic("incr-gap")
    create_topic(conf, src, 2)
    produce(conf, src, make_records(200, 2, seed=51))  # 100 per partition
    b1 = str(tmp_path / "b1")
    run_backup(conf, [src], b1)
    produce(conf, src, make_records(200, 2, seed=52, base_ts=BASE_TS + 10_000_000))  # offsets 100-199
    admin = AdminClient(conf)  # kept: a collected client never completes its futures
    for f in admin.delete_records([TopicPartition(src, 0, 130)]).values():
        f.result(timeout=60)
    with pytest.warns(IncrementalGapWarning, match=rf"{src}/0 \[100, 130\)"):
        r2 = run_backup(conf, [src], str(tmp_path / "b2"), incremental_from=b1)
    assert r2.gaps == {(src, 0): (100, 130)}
    assert r2.records == 70 + 100
    man = json.loads((tmp_path / "b2" / "manifest.json").read_text())
    assert man["kafka"]["gaps"] == {src: {"0": [100, 130]}}
    assert man["kafka"]["cut"][src] == {"0": [130, 200], "1": [100, 200]}


def test_point_in_time_and_offset_bounds(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("pitr")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(1000, 2, seed=9))
    url = str(tmp_path / "b")
    run_backup(conf, [src], url, segment_max_records=100)
    lo, hi = BASE_TS + 2000, BASE_TS + 7000
    dst = kafka_broker.new_topic("pitr-time")
    res = run_restore(url, conf, mapping={src: dst}, create_topics=True, from_time=lo,
                      to_time="2023-11-14T22:13:27Z")  # = BASE_TS + 7000 ms, exclusive
    want = [r for r in originals if lo <= r["timestamp"] < hi]
    assert res.records == len(want) == 500
    assert_same_records(consume_all(conf, dst), want)

    dst2 = kafka_broker.new_topic("pitr-offsets")
    run_restore(url, conf, mapping={src: dst2}, create_topics=True,
                offset_ranges={(src, 0): (100, 250), (src, 1): (None, 10)})
    want2 = [r for r in originals if (r["partition"] == 0 and 100 <= r["offset"] < 250)
             or (r["partition"] == 1 and r["offset"] < 10)]
    got2 = consume_all(conf, dst2)
    assert len(got2) == 160
    assert_same_records(got2, want2)


def test_consumer_group_offsets_translated(kafka_broker, conf, tmp_path):
    src = kafka_broker.new_topic("groups")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(400, 2, seed=11))  # 200 per partition
    group = f"g-{src}"
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(src, 0, 130), TopicPartition(src, 1, 200)], asynchronous=False)
    c.close()
    url = str(tmp_path / "b")
    res = run_backup(conf, [src], url)
    assert res.groups >= 1
    import fsspec

    snap = {g.group_id: g.offsets for g in read_group_offsets(fsspec.filesystem("file"), url)}
    assert snap[group] == {src: {0: 130, 1: 200}}

    # Restore only records from time T on: source offsets shift, the group's offsets must follow.
    t_from = BASE_TS + 1000  # drops source offsets 0..49 of each partition
    dst = kafka_broker.new_topic("groups-restored")
    out = run_restore(url, conf, mapping={src: dst}, create_topics=True, from_time=t_from,
                      restore_consumer_offsets=True)
    restored = by_partition(consume_all(conf, dst))
    kept = by_partition([r for r in originals if r["timestamp"] >= t_from])
    # partition 0: committed 130 -> target offset of the first restored record with source offset >= 130
    want0 = next(i for i, r in enumerate(kept[0]) if r["offset"] >= 130)
    want0 = restored[0][want0]["offset"]
    # partition 1: committed at the end (200) -> end of the restored data
    want1 = restored[1][-1]["offset"] + 1
    assert out.group_offsets[group] == {(dst, 0): want0, (dst, 1): want1}
    admin = AdminClient(conf)
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    committed = {(tp.topic, tp.partition): tp.offset for tp in got.topic_partitions if tp.topic == dst}
    assert committed == {(dst, 0): want0, (dst, 1): want1}
    assert want0 == 80  # 50 records dropped before it
    # A consumer of the group resumes at the translated record: same record as in the source.
    assert restored[0][want0]["value"] == [r for r in originals if r["partition"] == 0][130]["value"]


@pytest.mark.parametrize("extra", [{}, {"auto.offset.reset": "latest"}], ids=["default", "latest"])
def test_records_gone_after_the_cut_fail_the_backup(kafka_broker, conf, tmp_path, extra):
    """Records the cut covers but the broker deleted before they were read (retention, DeleteRecords,
    or a resume days later) fail the backup: the position is never reset past them, whatever the
    client config says, so no backup completes with a silent gap."""
    src = kafka_broker.new_topic("gone")
    create_topic(conf, src, 1)
    produce(conf, src, make_records(300, 1, seed=31))
    admin = AdminClient(conf)

    def delete_head(_planned: int) -> None:  # after the end offsets are read, before any fetch
        for f in admin.delete_records([TopicPartition(src, 0, 120)]).values():
            f.result()

    url = tmp_path / "b"
    with pytest.raises(KbsError, match=f"records of {src}/0 from about offset 0 cannot be read"):
        run_backup({**conf, **extra}, [src], str(url), on_plan=delete_head)
    assert not (url / "manifest.json").exists()


def test_corrupt_batch_on_the_broker_fails_the_backup(kafka_broker, conf, tmp_path):
    """A batch whose bytes on the broker no longer match its CRC is neither copied nor skipped."""
    if not kafka_broker.log_dir:
        pytest.skip("needs the broker's log directory")
    src = kafka_broker.new_topic("corrupt")
    create_topic(conf, src, 1)
    p = Producer({**conf, "linger.ms": 0})
    for i in range(60):
        p.produce(src, f"value-{i:05d}".encode(), partition=0)
        assert p.flush(10) == 0  # one small batch per record
    seg = next(Path(kafka_broker.log_dir, f"{src}-0").glob("*.log"))
    at = seg.read_bytes().index(b"value-00030")
    with seg.open("r+b") as f:  # the broker serves the page cache: it sees the flipped byte
        f.seek(at + 6)
        f.write(b"X")
    with pytest.raises(KbsError, match="_BAD_MSG"):
        run_backup(conf, [src], str(tmp_path / "b"))


def test_watermark_errors_of_a_new_topic_are_retried(kafka_broker, conf, tmp_path, monkeypatch):
    """Right after CreateTopics the leader may answer NOT_LEADER for a while: asked again, not fatal.

    Injected (a real broker does this only in a short, racy window after the topic is created).
    """
    src = kafka_broker.new_topic("newtopic")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(100, 2, seed=41))
    failures = {"left": 3}

    class FlakyConsumer(confluent_kafka.Consumer):
        def get_watermark_offsets(self, *args, **kwargs):
            if failures["left"]:
                failures["left"] -= 1
                raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
            return super().get_watermark_offsets(*args, **kwargs)

    monkeypatch.setattr(confluent_kafka, "Consumer", FlakyConsumer)
    url = str(tmp_path / "b")
    res = run_backup(conf, [src], url)
    assert failures["left"] == 0
    assert res.records == 100
    assert strip(backup_rows(url)) == strip(originals)


def test_restore_warns_when_the_target_topic_would_delete_old_records(kafka_broker, conf, tmp_path):
    """Kafka deletes by record timestamp and a restore keeps timestamps: records older than the
    target's retention.ms would vanish at the next retention check, so the restore says so."""
    src = kafka_broker.new_topic("retention")
    create_topic(conf, src, 1)
    produce(conf, src, make_records(20, 1, seed=71))  # 2023 timestamps
    url = str(tmp_path / "b")
    run_backup(conf, [src], url)
    short = kafka_broker.new_topic("retention-1d")
    with pytest.warns(RetentionWarning, match=f"topic {short} deletes records older than retention.ms=86400000"):
        res = run_restore(url, conf, mapping={src: short}, create_topics=True,
                          topic_config={"retention.ms": "86400000"})
    assert len(res.retention_warnings) == 1
    # The test broker keeps records whatever their age (scripts/kafka.sh: log.retention.ms=-1).
    kept = kafka_broker.new_topic("retention-kept")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RetentionWarning)
        res = run_restore(url, conf, mapping={src: kept}, create_topics=True)
    assert res.retention_warnings == []
    assert len(consume_all(conf, kept)) == 20
    # The CLI prints it once, after the table, and takes the created topic's configs.
    cli_short = kafka_broker.new_topic("retention-cli")
    r = CliRunner().invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--map", f"{src}:{cli_short}",
                                 "--create-topics", "--topic-config", "retention.ms=3600000"])
    assert r.exit_code == 0, r.output
    printed = " ".join(r.output.split())  # rich wraps long lines at the terminal's width
    assert printed.count(f"topic {cli_short} deletes records older than retention.ms=3600000") == 1, r.output
    r = CliRunner().invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--map", f"{src}:{short}",
                                 "--topic-config", "retention.ms"])
    assert r.exit_code != 0 and "--topic-config 'retention.ms' is not key=value" in " ".join(r.output.split())


def test_errors_are_clear(kafka_broker, conf, tmp_path):
    with pytest.raises(KbsError, match="no topic matches"):
        run_backup(conf, ["does-not-exist-.*"], str(tmp_path / "x"))
    src = kafka_broker.new_topic("err")
    create_topic(conf, src, 2)
    produce(conf, src, make_records(10, 2))
    url = str(tmp_path / "b")
    run_backup(conf, [src], url)
    with pytest.raises(CommitConflictError):
        run_backup(conf, [src], url)
    small = kafka_broker.new_topic("small")
    create_topic(conf, small, 1)
    with pytest.raises(KbsError, match="partitions"):
        run_restore(url, conf, mapping={src: small})
    with pytest.raises(KbsError, match="not in the backup"):
        run_restore(url, conf, topics=["nope"], dry_run=True)
    r = CliRunner().invoke(cli, ["restore", url, "-b", kafka_broker.bootstrap, "--offset-range", "bad"])
    assert r.exit_code != 0 and "TOPIC:PARTITION:START:END" in r.output


def test_restore_oso_native_backup(kafka_broker, conf, conformance):
    """Backups of the OSO tool's own layout restore too (read through open_backup detection)."""
    from tests.conftest import load_expected

    root = conformance / "oso-native" / "zstd"
    expected = load_expected(root / "expected.jsonl")
    topics = sorted({r["topic"] for r in expected})
    mapping = {t: kafka_broker.new_topic("oso-native") for t in topics}
    res = run_restore(str(root / "oso-backup-1"), conf, mapping=mapping, create_topics=True)
    assert res.records == len(expected)
    for t in topics:
        want = [{**r, "headers": r["headers"] or None} for r in expected if r["topic"] == t]
        assert_same_records(consume_all(conf, mapping[t]), want)


@pytest.mark.s3
def test_backup_to_s3_resume_and_restore(kafka_broker, conf, s3_root, s3_storage_options):
    """Object storage: checkpoint, uncovered-segment cleanup and resume work on s3:// too."""
    src = kafka_broker.new_topic("s3")
    create_topic(conf, src, 2)
    originals = produce(conf, src, make_records(500, 2, seed=21))
    url = f"{s3_root}/b"
    so = s3_storage_options
    # An interrupted run, simulated: a plan-only checkpoint plus a stray segment nobody vouched for.
    import fsspec

    from fsspec_kbs.kafka.backup import PLAN_KEY
    fs = fsspec.filesystem("s3", **so)
    cut = {src: {"0": [0, 250], "1": [0, 250]}}
    ck = Checkpoint("b", "2026-01-01T00:00:00Z", {}, {PLAN_KEY: {"partitions": cut, "compression": "lz4",
                                                                   "partition_counts": {src: 2}}})
    fs.pipe_file(f"{url}/checkpoints/checkpoint.json", ck.to_json())
    fs.pipe_file(f"{url}/topics/{src}/0/segment-00000000.kbs", b"partial")
    res = run_backup(conf, [src], url, storage_options=so, resume=True)
    assert res.resumed and res.records == 500
    assert json.loads(fs.cat_file(f"{url}/manifest.json"))["compression"]["algorithm"] == "lz4"
    dst = kafka_broker.new_topic("s3-restored")
    run_restore(url, conf, storage_options=so, mapping={src: dst}, create_topics=True)
    assert_same_records(consume_all(conf, dst), originals)
