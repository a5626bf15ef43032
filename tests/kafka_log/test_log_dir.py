"""Reading Kafka log directories built here: segments, indexes, transactions, damaged tails, import."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_kbs import read_table
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import BackupNotFoundError, ChecksumError, SegmentFormatError
from fsspec_kbs.format import kafka_log as kl
from fsspec_kbs.kafka_log import (
    KafkaLogScan,
    KafkaLogWarning,
    import_log,
    open_kafka_log_reader,
    read_kafka_log,
)
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import open_backup
from tests.conftest import table_rows
from tests.kafka_log.logbuild import write_segment

T0 = 1_700_000_000_000


def recs(start: int, n: int, rng: random.Random | None = None) -> list[dict]:
    rng = rng or random.Random(start)
    return [{"offset": start + i, "timestamp": T0 + (start + i) * 10 + rng.randint(-30, 30),
             "key": None if rng.random() < 0.1 else f"k{rng.randint(0, 9)}".encode(),
             "value": None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 300)),
             "headers": [("h", b"%d" % i)] if i % 4 == 0 else []} for i in range(n)]


def build_partition(pdir: Path, nbatches: int = 40, per_segment: int = 10, seed: int = 0) -> list[dict]:
    """A partition of plain batches in every codec, rolled every ``per_segment`` batches."""
    rng = random.Random(seed)
    expected, batches, offset = [], [], 0
    for b in range(nbatches):
        rs = recs(offset, rng.randint(1, 30), rng)
        expected += rs
        batches.append(kl.encode_kafka_batch(rs, codec=b % 5))
        offset += len(rs)
    for s in range(0, nbatches, per_segment):
        write_segment(pdir, batches[s : s + per_segment], index_interval=600, pad_index=5 if s else 0)
    return expected


def rows(expected: list[dict], topic: str, partition: int) -> list[dict]:
    return [{"topic": topic, "partition": partition, "offset": r["offset"], "timestamp": r["timestamp"],
             "key": r["key"], "value": r["value"], "headers": list(r.get("headers") or [])} for r in expected]


@pytest.fixture
def log_dir(tmp_path: Path) -> tuple[Path, dict[tuple[str, int], list[dict]]]:
    d = tmp_path / "kafka-logs"
    exp = {("orders", 0): build_partition(d / "orders-0", seed=1),
           ("orders", 1): build_partition(d / "orders-1", nbatches=7, seed=2),
           ("a.b_c-d", 0): build_partition(d / "a.b_c-d-0", nbatches=3, seed=3)}
    # Things a real log dir also holds, none of which are partitions to read.
    (d / "meta.properties").write_text("version=1\n")
    (d / "recovery-point-offset-checkpoint").write_text("0\n0\n")
    build_partition(d / "__consumer_offsets-0", nbatches=2)
    build_partition(d / "orders-2.9f1c2d3e4b5a-delete", nbatches=2)
    (d / "orders-0" / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    return d, exp


def test_reads_every_partition_segment_and_codec(log_dir: tuple[Path, dict]) -> None:
    d, exp = log_dir
    scan = KafkaLogScan(str(d))
    got = table_rows(scan.to_table())
    want = sorted((r for (t, p), e in exp.items() for r in rows(e, t, p)),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))
    assert got == want
    assert [(p.topic, p.partition) for p in scan.report.partitions] == sorted(exp)
    assert all(p.tail is None for p in scan.report.partitions)
    assert len(scan.fragments()[1].segments) == 4


def test_internal_topics_on_request(log_dir: tuple[Path, dict]) -> None:
    d, _ = log_dir
    t = read_kafka_log(str(d), include_internal=True, columns=["topic"])
    assert "__consumer_offsets" in set(t.column("topic").to_pylist())


def test_missing_log_dir(tmp_path: Path) -> None:
    with pytest.raises(BackupNotFoundError):
        read_kafka_log(str(tmp_path / "nope"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.one_of(st.none(), st.integers(-5, 700)), length=st.one_of(st.none(), st.integers(0, 400)),
       t_start=st.one_of(st.none(), st.integers(-100, 7000)), t_len=st.one_of(st.none(), st.integers(0, 3000)))
def test_seek_with_indexes_matches_filtering(log_dir: tuple[Path, dict], start: int | None, length: int | None,
                                             t_start: int | None, t_len: int | None) -> None:
    d, exp = log_dir
    end = None if start is None or length is None else start + length
    ts0 = None if t_start is None else T0 + t_start
    ts1 = None if ts0 is None or t_len is None else ts0 + t_len
    got = table_rows(read_kafka_log(str(d), topics="orders", partitions=[0], start_offset=start, end_offset=end,
                                    start_time=ts0, end_time=ts1))
    want = [r for r in rows(exp[("orders", 0)], "orders", 0)
            if (start is None or r["offset"] >= start) and (end is None or r["offset"] < end)
            and (ts0 is None or r["timestamp"] >= ts0) and (ts1 is None or r["timestamp"] < ts1)]
    assert got == want


def test_seek_reads_less(log_dir: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    d, exp = log_dir
    from fsspec_kbs.kafka_log import log_dir as mod

    seen: list[int] = []
    real = mod.KafkaLogDir._seek

    def spy(self, seg, start_offset, start_time):  # type: ignore[no-untyped-def]
        pos = real(self, seg, start_offset, start_time)
        seen.append(pos)
        return pos

    monkeypatch.setattr(mod.KafkaLogDir, "_seek", spy)
    last = exp[("orders", 0)][-1]["offset"]
    t = read_kafka_log(str(d), topics=["orders"], partitions=[0], start_offset=last - 3)
    assert t.column("offset").to_pylist() == list(range(last - 3, last + 1))
    assert seen and seen[0] > 0  # the index moved the start past the segment's beginning


def test_stale_index_falls_back_to_scanning(log_dir: tuple[Path, dict]) -> None:
    d, exp = log_dir
    seg = sorted((d / "orders-0").glob("*.index"))[0]
    seg.write_bytes(kl.encode_offset_index([(5, 3)], int(seg.stem)))  # position 3 is not a batch
    with pytest.warns(KafkaLogWarning, match="not a batch"):
        t = read_kafka_log(str(d), topics=["orders"], partitions=[0], start_offset=6, end_offset=9)
    assert t.column("offset").to_pylist() == [6, 7, 8]


def _txn_partition(pdir: Path, txnindex: bool, roll_inside: bool = False) -> list[int]:
    """Producer 5 aborts, producer 6 commits, interleaved; returns the offsets a consumer sees."""
    b = [
        kl.encode_kafka_batch(recs(0, 3)),                                                       # 0-2 plain
        kl.encode_kafka_batch(recs(3, 2), producer_id=5, producer_epoch=0, transactional=True),  # 3-4 aborted
        kl.encode_kafka_batch(recs(5, 2), producer_id=6, producer_epoch=0, transactional=True),  # 5-6 committed
        kl.encode_kafka_batch(recs(7, 1), producer_id=9, producer_epoch=0, base_sequence=0),     # 7 idempotent
        kl.encode_kafka_batch(recs(8, 2), producer_id=5, producer_epoch=0, transactional=True),  # 8-9 aborted
        kl.encode_control_batch(10, 5, commit=False),
        kl.encode_control_batch(11, 6, commit=True),
        kl.encode_kafka_batch(recs(12, 2), producer_id=5, producer_epoch=0, transactional=True),  # 12-13 committed
        kl.encode_control_batch(14, 5, commit=True),
        kl.encode_kafka_batch(recs(15, 2)),
    ]
    aborted = [kl.AbortedTxn(3, 5, 10)] if txnindex else []
    if roll_inside:
        write_segment(pdir, b[:3])
        write_segment(pdir, b[3:6], aborted=aborted)
        write_segment(pdir, b[6:])
    else:
        write_segment(pdir, b, aborted=aborted)
    return [0, 1, 2, 5, 6, 7, 12, 13, 15, 16]


@pytest.mark.parametrize("txnindex", [True, False], ids=["txnindex", "markers-only"])
@pytest.mark.parametrize("roll_inside", [False, True], ids=["one-segment", "marker-in-later-segment"])
def test_aborted_transactions_and_control_batches_are_left_out(tmp_path: Path, txnindex: bool,
                                                              roll_inside: bool) -> None:
    want = _txn_partition(tmp_path / "tx-0", txnindex, roll_inside)
    scan = KafkaLogScan(str(tmp_path))
    assert scan.to_table().column("offset").to_pylist() == want
    st_ = scan.report.partitions[0]
    assert (st_.control_batches, st_.aborted_batches, st_.aborted_records) == (3, 2, 4)
    # Starting in the middle of an aborted transaction still leaves it out.
    assert read_kafka_log(str(tmp_path), start_offset=4).column("offset").to_pylist() == [o for o in want if o >= 4]


def test_txnindex_alone_decides_when_marker_is_lost(tmp_path: Path) -> None:
    """A txnindex entry aborts records even if the marker batch is missing (Kafka's fetch path)."""
    b = [kl.encode_kafka_batch(recs(0, 2), producer_id=5, producer_epoch=0, transactional=True),
         kl.encode_kafka_batch(recs(2, 2))]
    write_segment(tmp_path / "t-0", b, aborted=[kl.AbortedTxn(0, 5, 4)])
    with pytest.warns(KafkaLogWarning, match="no commit or abort marker"):
        assert read_kafka_log(str(tmp_path)).column("offset").to_pylist() == [2, 3]


def test_open_transaction_at_end_is_left_out_with_warning(tmp_path: Path) -> None:
    b = [kl.encode_kafka_batch(recs(0, 2)),
         kl.encode_kafka_batch(recs(2, 2), producer_id=5, producer_epoch=0, transactional=True)]
    write_segment(tmp_path / "t-0", b)
    scan = KafkaLogScan(str(tmp_path))
    with pytest.warns(KafkaLogWarning, match="producer ids \\[5\\]"):
        assert scan.to_table().column("offset").to_pylist() == [0, 1]
    assert scan.report.partitions[0].open_transactions == [kl.AbortedTxn(2, 5)]


def test_log_append_time_topic(tmp_path: Path) -> None:
    write_segment(tmp_path / "lat-0", [kl.encode_kafka_batch(recs(0, 3), log_append_time=T0 + 5, codec=3)])
    t = read_kafka_log(str(tmp_path))
    assert t.column("timestampType").to_pylist() == [1, 1, 1]
    assert t.column("timestamp").cast("int64").to_pylist() == [T0 + 5] * 3


# -- damaged tails --------------------------------------------------------------------------------

def _damage_second_segment(d: Path, how: str) -> tuple[Path, int, int]:
    segs = sorted((d / "orders-0").glob("*.log"))
    victim = segs[1]
    data = victim.read_bytes()
    headers, _ = kl.walk_batches(data)
    h = headers[4]
    if how == "crc":
        data = data[: h.position + 70] + bytes([data[h.position + 70] ^ 0xFF]) + data[h.position + 71 :]
    else:
        data = data[: h.position + h.size - 7]
    victim.write_bytes(data)
    return victim, h.position, h.base_offset


@pytest.mark.parametrize("how", ["crc", "truncate"])
def test_damaged_tail_stops_partition_like_log_recovery(log_dir: tuple[Path, dict], how: str) -> None:
    d, exp = log_dir
    victim, position, first_bad = _damage_second_segment(d, how)
    scan = KafkaLogScan(str(d), topics="orders", partitions=0)
    with pytest.warns(KafkaLogWarning) as caught:
        got = scan.to_table().column("offset").to_pylist()
    tail = scan.report.partitions[0].tail
    assert tail is not None and tail.path == str(victim) and tail.position == position
    assert tail.dropped_bytes == victim.stat().st_size - position
    assert len(tail.dropped_segments) == 2 and tail.dropped_segment_bytes > 0
    assert any(str(victim) in str(w.message) and f"byte {position}" in str(w.message) for w in caught)
    # Everything before the damaged batch is there, nothing after it.
    assert got == [r["offset"] for r in exp[("orders", 0)] if r["offset"] < first_bad]
    if how == "crc":
        assert "CRC-32C" in tail.reason


def test_damaged_tail_strict_raises(log_dir: tuple[Path, dict]) -> None:
    d, _ = log_dir
    victim, position, _ = _damage_second_segment(d, "crc")
    with pytest.raises(SegmentFormatError) as e:
        read_kafka_log(str(d), on_corrupt_tail="error")
    assert e.value.path == str(victim) and e.value.offset == position + 17  # the CRC field of that batch
    assert isinstance(e.value, ChecksumError)


def test_no_verify_reads_past_a_bad_crc(log_dir: tuple[Path, dict]) -> None:
    d, exp = log_dir
    victim = sorted((d / "orders-1").glob("*.log"))[0]
    data = bytearray(victim.read_bytes())
    data[17] ^= 0xFF  # the stored CRC itself
    victim.write_bytes(bytes(data))
    t = read_kafka_log(str(d), topics="orders", partitions=1, verify_crc=False)
    assert t.num_rows == len(exp[("orders", 1)])
    with pytest.raises(ChecksumError):
        read_kafka_log(str(d), topics="orders", partitions=1, on_corrupt_tail="error")


# -- import ----------------------------------------------------------------------------------------

def test_import_log_round_trip(log_dir: tuple[Path, dict], tmp_path: Path) -> None:
    d, exp = log_dir
    url = str(tmp_path / "backups" / "imported")
    seen: list = []
    report = import_log(str(d), url, segment_max_records=100, progress=seen.append)
    assert report.records == sum(len(e) for e in exp.values())
    assert [(p.topic, p.partition, p.records) for p in seen] == [(t, p, len(exp[(t, p)])) for t, p in sorted(exp)]
    assert validate_backup(url, deep=True).ok
    assert table_rows(read_table(url)) == table_rows(read_kafka_log(str(d)))
    extra = open_backup(url).manifest.extra["kafka_log_import"]
    assert {(p["topic"], p["partition"]): p["timestamp_type"] for p in extra["partitions"]} == \
        {k: "CreateTime" for k in exp}


def test_import_truncated_log_reports_tail_and_keeps_the_rest(log_dir: tuple[Path, dict], tmp_path: Path) -> None:
    d, exp = log_dir
    victim, position, _ = _damage_second_segment(d, "truncate")
    url = str(tmp_path / "b" / "x")
    with pytest.warns(KafkaLogWarning):
        report = import_log(str(d), url)
    assert [t.position for t in report.tails] == [position]
    tails = [p["tail"] for p in open_backup(url).manifest.extra["kafka_log_import"]["partitions"] if p["tail"]]
    assert tails[0]["path"] == str(victim) and tails[0]["position"] == position
    t = read_table(url, topics=["orders"], partitions=[0])
    assert pc.max(t.column("offset")).as_py() < exp[("orders", 0)][-1]["offset"]


def test_cli_import_log(log_dir: tuple[Path, dict], tmp_path: Path) -> None:
    d, exp = log_dir
    victim, position, _ = _damage_second_segment(d, "crc")
    url = str(tmp_path / "b" / "cli")
    res = CliRunner().invoke(cli, ["import-log", str(d), "--to", url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    tail = next(p["tail"] for p in doc["partitions"] if p["tail"])
    assert (tail["path"], tail["position"]) == (str(victim), position)
    assert f"byte {position}" in res.stderr
    res = CliRunner().invoke(cli, ["import-log", str(d), "--to", url])
    assert res.exit_code == 2 and "already exists" in res.stderr
    res = CliRunner().invoke(cli, ["import-log", str(d), "--to", str(tmp_path / "b" / "strict"), "--strict"])
    assert res.exit_code == 2 and str(victim) in res.stderr and f"byte {position}" in res.stderr
    assert not (tmp_path / "b" / "strict" / "manifest.json").exists()


def test_streaming_reader(log_dir: tuple[Path, dict]) -> None:
    d, exp = log_dir
    reader = open_kafka_log_reader(str(d), columns=["offset", "timestampType"])
    n = 0
    for batch in reader:
        n += batch.num_rows
        assert batch.schema.names == ["offset", "timestampType"]
    assert n == sum(len(e) for e in exp.values())


def test_copy_of_log_dir_on_memory_fs(log_dir: tuple[Path, dict]) -> None:
    import fsspec

    d, exp = log_dir
    mem = fsspec.filesystem("memory")
    for p in (d / "orders-1").iterdir():
        mem.pipe(f"/kl/orders-1/{p.name}", p.read_bytes())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = read_kafka_log("memory://kl")
        assert t.num_rows == len(exp[("orders", 1)])
    finally:
        mem.rm("/kl", recursive=True)


@pytest.mark.parametrize("commit", [False, True])
def test_transaction_spanning_many_segments_markers_only(tmp_path: Path, commit: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from fsspec_kbs.kafka_log import log_dir as mod

    calls: list[int] = []
    real = mod.KafkaLogDir._lookahead

    def spy(self, segs, pending):  # type: ignore[no-untyped-def]
        calls.append(len(pending))
        return real(self, segs, pending)

    monkeypatch.setattr(mod.KafkaLogDir, "_lookahead", spy)
    offset = 0
    want = []
    for s in range(6):
        batches = []
        for _ in range(3):
            batches.append(kl.encode_kafka_batch(recs(offset, 2), producer_id=5, producer_epoch=0, transactional=True))
            want += [offset, offset + 1] if commit else []
            offset += 2
            batches.append(kl.encode_kafka_batch(recs(offset, 1)))
            want.append(offset)
            offset += 1
        if s == 5:
            batches.append(kl.encode_control_batch(offset, 5, commit=commit))
            offset += 1
        write_segment(tmp_path / "long-0", batches)
    assert read_kafka_log(str(tmp_path)).column("offset").to_pylist() == want
    assert calls == [1]  # the marker is searched for once, not at every segment boundary
