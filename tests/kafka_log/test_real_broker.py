"""Log directories written by a real Apache Kafka broker, compared with what a consumer reads.

The broker (tests/fixtures/kafka.py, scripts/kafka.sh) writes ``log_dir/<topic>-<p>/``; topics
here roll segments every few batches (tiny ``segment.index.bytes``) so every test crosses segment
boundaries and reads sparse ``.index`` / ``.timeindex`` files, including the zero-padded ones of the
active segment.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from fsspec_kbs import read_table
from fsspec_kbs.format import kafka_log as kl
from fsspec_kbs.kafka_log import KafkaLogScan, KafkaLogWarning, import_log, read_kafka_log
from fsspec_kbs.maintenance import compact_backup
from fsspec_kbs.store import open_backup

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.kafka

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
#: Roll a segment every ~10 batches and index every batch; never delete by retention (the broker's
#: retention check would otherwise remove segments while a test reads them).
SMALL_SEGMENTS = {"segment.index.bytes": "120", "index.interval.bytes": "1", "retention.ms": "-1",
                  "retention.bytes": "-1"}
#: Recent CreateTime timestamps (old ones would also count as expired for time retention).
T0 = int(time.time() * 1000) - 3_600_000


def _create(admin: AdminClient, topic: str, partitions: int, config: dict[str, str]) -> None:
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        f.result(timeout=30)


def _produce(bootstrap: str, topic: str, n: int, partitions: int, codec: str = "none", every: int = 15,
             tombstones: bool = False, keys: int = 0) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                     "enable.idempotence": True})
    for i in range(n):
        key = f"key-{i % keys if keys else i}".encode()
        value = None if tombstones and i % 13 == 5 else (f"{codec} record {i} " * (1 + i % 7)).encode()
        headers = [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else None
        p.produce(topic, key=None if i % 11 == 10 and not keys else key, value=value, partition=i % partitions,
                  headers=headers, timestamp=T0 + i * 7 - (i % 5) * 20)
        if i % every == every - 1:
            p.flush(30)  # each flush ends a batch: many batches, many segments
    assert p.flush(30) == 0


def consume(bootstrap: str, topic: str, partitions: int) -> list[dict]:
    """Every record a read_committed consumer gets, as table_rows-style dicts (plus timestampType)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
    ends = {}
    for p in range(partitions):
        _lo, hi = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)
        ends[p] = hi
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    rows: list[dict] = []
    done = {p for p, hi in ends.items() if hi == 0}
    deadline = time.monotonic() + 60
    while len(done) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(m.error())
            ts_type, ts = m.timestamp()
            rows.append({"topic": m.topic(), "partition": m.partition(), "offset": m.offset(), "timestamp": ts,
                         "key": m.key(), "value": m.value(), "headers": list(m.headers() or []),
                         "timestampType": ts_type - 1})
            if m.offset() >= ends[m.partition()] - 1:
                done.add(m.partition())
        # read_committed stops at the last stable offset: markers past it count as done
        for p in range(partitions):
            pos = c.position([ck.TopicPartition(topic, p)])[0].offset
            if pos >= ends[p]:
                done.add(p)
    c.close()
    assert len(done) == partitions, f"consumer did not reach the end of {topic}"
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def log_rows(table) -> list[dict]:  # type: ignore[no-untyped-def]
    ts = table.column("timestamp").cast("int64").to_pylist()
    out = []
    for i, r in enumerate(table.to_pylist()):
        out.append({"topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "timestamp": ts[i],
                    "key": r["key"], "value": r["value"],
                    "headers": [(h["key"], h["value"]) for h in r["headers"] or []],
                    "timestampType": r["timestampType"]})
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def without_type(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "timestampType"}


def backup_rows(table) -> list[dict]:  # type: ignore[no-untyped-def]
    """Rows of a table read back from a KBS backup (which stores no timestamp type)."""
    return [without_type(r) for r in log_rows(table)]


@pytest.fixture(scope="module")
def broker(kafka_broker):  # type: ignore[no-untyped-def]
    if not kafka_broker.log_dir:
        pytest.skip("the broker's log directory is unknown (set KBS_KAFKA_LOG_DIR)")
    return kafka_broker


@pytest.fixture(scope="module")
def admin(broker) -> AdminClient:  # type: ignore[no-untyped-def]
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture(scope="module")
def codec_topics(broker, admin) -> dict[str, str]:  # type: ignore[no-untyped-def]
    topics = {}
    for codec in CODECS:
        topic = broker.new_topic(f"log-{codec}")
        _create(admin, topic, 2, SMALL_SEGMENTS)
        _produce(broker.bootstrap, topic, 400, 2, codec)
        topics[codec] = topic
    return topics


@pytest.mark.parametrize("codec", CODECS)
def test_each_compression_type_matches_consumer(broker, codec_topics, codec: str) -> None:  # type: ignore[no-untyped-def]
    topic = codec_topics[codec]
    scan = KafkaLogScan(broker.log_dir, topics=topic)
    got = log_rows(scan.to_table())
    want = consume(broker.bootstrap, topic, 2)
    assert len(want) == 400
    assert got == want
    assert all(p.tail is None for p in scan.report.partitions)
    segments = [len(p.segments) for p in scan.fragments()]
    assert min(segments) >= 2, segments
    # the batches on disk really use the codec the producer was told to use
    seg = scan.fragments()[0].segments[0]
    headers, _ = kl.walk_batches(Path(seg.path).read_bytes())
    assert {kl.KAFKA_CODEC_NAMES[h.codec] for h in headers} == {codec}


def test_import_compare_and_seek(broker, codec_topics, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topics = list(codec_topics.values())
    url = str(tmp_path / "backups" / "from-broker")
    report = import_log(broker.log_dir, url, topics=topics)
    assert report.records == 400 * len(topics)
    got = read_table(url)
    for topic in topics:
        part = got.filter(pc.equal(got["topic"], topic))
        assert backup_rows(part) == [without_type(r) for r in consume(broker.bootstrap, topic, 2)]
    kinds = {p["topic"]: p["timestamp_type"] for p in open_backup(url).manifest.extra["kafka_log_import"]["partitions"]}
    assert set(kinds.values()) == {"CreateTime"}
    # seeking with the broker's sparse indexes gives the same rows as filtering everything
    topic = codec_topics["zstd"]
    full = log_rows(read_kafka_log(broker.log_dir, topics=topic))
    ts = sorted(r["timestamp"] for r in full)
    for start, end, t0 in ((0, None, None), (57, 301, None), (190, None, ts[len(ts) // 2]), (None, None, ts[-3])):
        seek = log_rows(read_kafka_log(broker.log_dir, topics=topic, start_offset=start, end_offset=end,
                                       start_time=t0))
        assert seek == [r for r in full if (start is None or r["offset"] >= start)
                        and (end is None or r["offset"] < end) and (t0 is None or r["timestamp"] >= t0)]


def test_transactions_with_abort_match_read_committed(broker, admin) -> None:  # type: ignore[no-untyped-def]
    topic = broker.new_topic("log-txn")
    _create(admin, topic, 1, SMALL_SEGMENTS)
    plain = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    tx = ck.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}",
                      "linger.ms": 0})
    tx.init_transactions(60)
    for round_, outcome in enumerate(["commit", "abort", "commit", "abort", "commit"]):
        tx.begin_transaction()
        for i in range(25):
            tx.produce(topic, key=b"t%d" % i, value=f"{outcome} {round_} {i}".encode())
            if i % 5 == 4:
                tx.flush(30)
                plain.produce(topic, key=b"p", value=f"plain {round_} {i}".encode())  # interleaved
                plain.flush(30)
        if outcome == "commit":
            tx.commit_transaction(30)
        else:
            tx.abort_transaction(30)
    plain.produce(topic, value=b"last")
    plain.flush(30)
    want = consume(broker.bootstrap, topic, 1)
    scan = KafkaLogScan(broker.log_dir, topics=topic)
    got = log_rows(scan.to_table())
    assert got == want
    values = [r["value"] for r in got]
    assert not any(v.startswith(b"abort") for v in values)
    assert sum(v.startswith(b"commit") for v in values) == 75
    stats = scan.report.partitions[0]
    assert stats.aborted_records == 50 and stats.control_batches == 5
    assert len(scan.fragments()[0].segments) >= 3
    assert any(s.txnindex for s in scan.fragments()[0].segments)


def test_log_append_time_topic(broker, admin) -> None:  # type: ignore[no-untyped-def]
    topic = broker.new_topic("log-lat")
    _create(admin, topic, 1, {**SMALL_SEGMENTS, "message.timestamp.type": "LogAppendTime"})
    _produce(broker.bootstrap, topic, 60, 1, "lz4")
    got = log_rows(read_kafka_log(broker.log_dir, topics=topic))
    assert got == consume(broker.bootstrap, topic, 1)
    assert {r["timestampType"] for r in got} == {1}


def test_compacted_topic(broker, admin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = broker.new_topic("log-compact")
    _create(admin, topic, 1, {**SMALL_SEGMENTS, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.001",
                              "segment.ms": "500", "min.compaction.lag.ms": "0", "delete.retention.ms": "86400000"})
    _produce(broker.bootstrap, topic, 300, 1, "snappy", every=10, tombstones=True, keys=12)
    # The broker's cleaner compacts the closed segments in the background; wait for offset gaps.
    deadline = time.monotonic() + 90
    offsets: list[int] = []
    while time.monotonic() < deadline:
        with _quiet():
            offsets = read_kafka_log(broker.log_dir, topics=topic, columns=["offset"]).column("offset").to_pylist()
        if len(offsets) < 300:
            break
        time.sleep(2)
    time.sleep(1)  # let the cleaner finish swapping files in
    want = consume(broker.bootstrap, topic, 1)
    got = log_rows(read_kafka_log(broker.log_dir, topics=topic))
    assert got == want
    if len(offsets) < 300:
        assert got[-1]["offset"] == 299 and len(got) < 300  # compacted: gaps in the offsets
    # kbs compact on the imported backup leaves exactly the latest value of every key
    url = str(tmp_path / "b" / "compacted-src")
    import_log(broker.log_dir, url, topics=[topic])
    compact_backup(url, str(tmp_path / "b" / "compacted"))
    latest: dict[bytes, dict] = {}
    for r in want:
        latest[r["key"]] = r
    out = backup_rows(read_table(str(tmp_path / "b" / "compacted")))
    assert out == sorted((without_type(r) for r in latest.values()), key=lambda r: r["offset"])
    assert open_backup(str(tmp_path / "b" / "compacted")).manifest.extra["compaction"]["partitions"][0][
        "records_out"] == len(latest)


class _quiet:
    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


@pytest.fixture
def damaged_copy(broker, codec_topics, tmp_path: Path) -> Iterator[tuple[Path, str]]:  # type: ignore[no-untyped-def]
    topic = codec_topics["gzip"]
    copy = tmp_path / "copy"
    shutil.copytree(Path(broker.log_dir) / f"{topic}-0", copy / f"{topic}-0")
    yield copy, topic


def _batches(path: Path) -> list[kl.KafkaBatchHeader]:
    headers, tail = kl.walk_batches(path.read_bytes())
    assert tail is None
    return headers


@pytest.mark.parametrize("how", ["truncate-last", "corrupt-middle"])
def test_damaged_copy_of_broker_log(broker, damaged_copy, how: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy, topic = damaged_copy
    want = [r for r in consume(broker.bootstrap, topic, 2) if r["partition"] == 0]
    segs = sorted((copy / f"{topic}-0").glob("*.log"))
    victim = segs[-1] if how == "truncate-last" else segs[len(segs) // 2]
    headers = _batches(victim)
    if how == "truncate-last":
        bad = headers[-1]
        victim.write_bytes(victim.read_bytes()[: bad.end - 3])
        later = []
    else:
        bad = headers[len(headers) // 2]
        data = bytearray(victim.read_bytes())
        data[bad.position + 80] ^= 0x01
        victim.write_bytes(bytes(data))
        later = segs[segs.index(victim) + 1 :]
    size = victim.stat().st_size
    url = str(tmp_path / "b" / "damaged")
    with pytest.warns(KafkaLogWarning) as caught:
        report = import_log(str(copy), url)
    [tail] = report.tails
    assert (tail.path, tail.position, tail.dropped_bytes) == (str(victim), bad.position, size - bad.position)
    assert tail.dropped_segments == [str(p) for p in later]
    assert any(f"byte {bad.position}" in str(w.message) and str(victim) in str(w.message) for w in caught)
    assert backup_rows(read_table(url)) == [without_type(r) for r in want if r["offset"] < bad.base_offset]
