"""Kafka-source option parity and executor-side planning, in process (no SparkSession).

Each read option of Spark's Kafka source is checked against what the Kafka source would return
for the same records (``expected.jsonl`` of the conformance vectors); planning is checked to
put everything a task needs into its input partition (no manifest read on executors).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from fsspec_kbs.spark import KbsReader, parse_options  # noqa: E402
from fsspec_kbs.spark.reader import BackupChangedError  # noqa: E402
from tests.conftest import load_expected, table_rows  # noqa: E402

pytestmark = pytest.mark.spark

COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def _rows(reader: KbsReader, parts: list | None = None) -> list[dict]:
    parts = reader.partitions() if parts is None else parts
    batches = [b for p in parts for b in reader.read(p)]
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    table = table.set_column(5, "timestamp", table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")))
    return table_rows(table)


def read(url: str, **opts: str) -> list[dict]:
    return _rows(KbsReader(parse_options({"path": url, **opts}), COLS))


@pytest.fixture
def case(conformance: Path) -> tuple[str, list[dict]]:
    c = conformance / "valid" / "zstd-v1.1"
    return str(c / "backup-1"), load_expected(c / "expected.jsonl")


def _first_at(rows: list[dict], topic: str, partition: int, ts: int) -> int | None:
    """Kafka's offsetsForTimes: the first offset, in offset order, with timestamp >= ts."""
    for r in sorted((r for r in rows if (r["topic"], r["partition"]) == (topic, partition)), key=lambda r: r["offset"]):
        if r["timestamp"] >= ts:
            return r["offset"]
    return None


def test_assign_reads_only_those_partitions(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    got = read(url, assign=json.dumps({"orders": [1], "user.events-v2": [0]}))
    assert got == [r for r in rows if (r["topic"], r["partition"]) in {("orders", 1), ("user.events-v2", 0)}]


def test_subscribe_and_pattern(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    assert read(url, subscribe="orders") == [r for r in rows if r["topic"] == "orders"]
    assert read(url, subscribePattern=r"user\..*") == [r for r in rows if r["topic"] == "user.events-v2"]


def test_offsets_json(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    got = read(url, subscribe="orders", startingOffsets=json.dumps({"orders": {"0": 100, "1": -2}}),
               endingOffsets=json.dumps({"orders": {"0": 200, "1": -1}}))
    assert got == [r for r in rows if r["topic"] == "orders" and (r["partition"] == 1 or 100 <= r["offset"] < 200)]


def test_offsets_by_timestamp_are_kafka_lookups(case) -> None:  # type: ignore[no-untyped-def]
    """Offsets found as Kafka's offsetsForTimes finds them (timestamps in the vectors are not
    monotonic: the first offset in offset order, not a row filter on timestamps)."""
    url, rows = case
    ts = sorted(r["timestamp"] for r in rows if (r["topic"], r["partition"]) == ("orders", 0))
    t0, t1 = ts[len(ts) // 3], ts[2 * len(ts) // 3]
    s, e = _first_at(rows, "orders", 0, t0), _first_at(rows, "orders", 0, t1)
    assert s is not None and e is not None and s < e
    got = read(url, assign='{"orders": [0]}', startingOffsetsByTimestamp=json.dumps({"orders": {"0": t0}}),
               endingOffsetsByTimestamp=json.dumps({"orders": {"0": t1}}))
    want = [r for r in rows if (r["topic"], r["partition"]) == ("orders", 0) and s <= r["offset"] < e]
    assert got == want


def test_global_timestamps_look_up_every_partition(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    ts = sorted(r["timestamp"] for r in rows)
    t0, t1 = ts[len(ts) // 4], ts[len(ts) // 2]
    got = read(url, startingTimestamp=str(t0), startingOffsetsByTimestampStrategy="latest",
               endingTimestamp=str(t1))
    want = []
    for tp in sorted({(r["topic"], r["partition"]) for r in rows}):
        s, e = _first_at(rows, *tp, t0), _first_at(rows, *tp, t1)
        want += [r for r in rows if (r["topic"], r["partition"]) == tp and s is not None
                 and s <= r["offset"] and (e is None or r["offset"] < e)]
    assert got == sorted(want, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def test_starting_timestamp_without_match(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    late = max(r["timestamp"] for r in rows if r["topic"] == "user.events-v2") + 1
    with pytest.raises(ValueError, match="no record of user.events-v2/0 has a timestamp at or after"):
        read(url, subscribe="user.events-v2", startingTimestamp=str(late))
    assert read(url, subscribe="user.events-v2", startingTimestamp=str(late),
                startingOffsetsByTimestampStrategy="latest") == []
    # An ending timestamp past every record means latest, as in Kafka.
    assert read(url, subscribe="user.events-v2", endingTimestamp=str(late)) == \
        [r for r in rows if r["topic"] == "user.events-v2"]


def test_min_partitions_splits_segments(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    reader = KbsReader(parse_options({"path": url}), COLS)
    assert len(reader.partitions()) == 1  # six small segments packed together
    for n in (4, 6, 25):
        split = KbsReader(parse_options({"path": url, "minPartitions": str(n)}), COLS)
        parts = split.partitions()
        assert len(parts) >= n
        assert _rows(split, parts) == rows  # every record once
    capped = KbsReader(parse_options({"path": url, "maxRecordsPerPartition": "100"}), COLS)
    parts = capped.partitions()
    assert all(sum((s.end or 10**9) - (s.start or 0) if s.end is not None else 100 for s in p.segments)
               <= 100 or len(p.segments) == 1 for p in parts)
    assert len(parts) >= len(rows) // 100 and _rows(capped, parts) == rows


def test_fail_on_data_loss(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    with pytest.raises(FileNotFoundError, match=r"partition orders/7 \(option 'assign'\).*failOnDataLoss=false"):
        read(url, assign='{"orders": [0, 7]}')
    assert read(url, assign='{"orders": [0, 7]}', failOnDataLoss="false") == \
        [r for r in rows if (r["topic"], r["partition"]) == ("orders", 0)]
    with pytest.raises(FileNotFoundError, match="topic 'nope'"):
        read(url, subscribe="orders,nope")
    with pytest.raises(FileNotFoundError, match="offsets 0 to 0 are not in the backup"):
        read(url, startingOffsets='{"orders": {"0": 0}}')  # the backup starts at offset 1
    with pytest.raises(FileNotFoundError, match="offsets 1122 to 1999"):
        read(url, endingOffsets='{"orders": {"0": 2000}}')
    assert read(url, endingOffsets='{"orders": {"0": 2000}}', failOnDataLoss="false") == rows
    with pytest.raises(FileNotFoundError, match="orders/5"):
        read(url, startingOffsetsByTimestamp='{"orders": {"5": 1}}')


def test_headers_null_without_headers(case) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    reader = KbsReader(parse_options({"path": url}), COLS)
    table = pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)])
    headers = table.column("headers").to_pylist()
    assert headers.count(None) == sum(1 for r in rows if not r["headers"]) > 0
    assert [] not in headers


def test_null_headers_write_back(tmp_path: Path) -> None:
    import fsspec_kbs

    src = pa.table({"value": [b"a", b"b", b"c"],
                    "headers": pa.array([None, [{"key": "k", "value": b"v"}], None],
                                        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))})
    fsspec_kbs.write_table(str(tmp_path / "backup-1"), src, topic="t")
    back = fsspec_kbs.read_table(str(tmp_path / "backup-1"))
    fsspec_kbs.write_table(str(tmp_path / "backup-2"), back)  # what was read writes back as it is
    again = fsspec_kbs.read_table(str(tmp_path / "backup-2"))
    assert back.column("headers").to_pylist() == again.column("headers").to_pylist() == \
        [None, [{"key": "k", "value": b"v"}], None]


def test_tasks_read_no_manifest(case, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url, rows = case
    copy = tmp_path / "backup-1"
    shutil.copytree(url, copy)
    reader = KbsReader(parse_options({"path": str(copy), "minPartitionBytes": "0"}), COLS)
    parts = [pickle.loads(pickle.dumps(p)) for p in reader.partitions()]  # as Spark ships them
    task_reader = pickle.loads(pickle.dumps(reader))
    (copy / "manifest.json").unlink()  # tasks must not need it
    import fsspec.implementations.local as local

    opened: list[str] = []
    real = local.LocalFileSystem.cat_file

    def cat_file(self, path, *a, **k):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real(self, path, *a, **k)

    monkeypatch.setattr(local.LocalFileSystem, "cat_file", cat_file)
    assert _rows(task_reader, parts) == rows
    assert not [p for p in opened if p.endswith("manifest.json")]


def test_backup_changed_while_reading(case, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import fsspec_kbs

    url, rows = case
    copy = tmp_path / "backup-1"
    shutil.copytree(url, copy)
    reader = KbsReader(parse_options({"path": str(copy), "minPartitionBytes": "0"}), COLS)
    parts = reader.partitions()
    # Rewritten between planning and the tasks: other segments under the same names.
    table = fsspec_kbs.read_table(str(copy)).slice(0, 500)
    fsspec_kbs.write_table(str(copy), table, mode="overwrite", segment_max_records=50)
    with pytest.raises(BackupChangedError, match="the backup changed while reading.*run the read again"):
        _rows(reader, parts)
    # A damaged segment under an unchanged manifest keeps its own error.
    shutil.rmtree(copy)
    shutil.copytree(url, copy)
    parts = reader.partitions()
    seg = copy / "topics" / "orders" / "0" / "segment-00000000.kbs"
    seg.write_bytes(seg.read_bytes()[:-10])
    with pytest.raises(Exception, match="truncated") as info:
        _rows(reader, parts)
    assert not isinstance(info.value, BackupChangedError)


def test_planning_payload_does_not_grow_with_the_manifest(tmp_path: Path) -> None:
    """Each input partition carries its own segments only (executors never read the
    manifest): the same size for a manifest of 2,000 or 20,000 segments. The planning time
    for 100,000 segments is measured by benchmarks/spark_plan.py (target < 5 s)."""
    from benchmarks.spark_plan import synthetic_backup

    sizes = {}
    for n in (2_000, 20_000):
        url = synthetic_backup(tmp_path / str(n), n)
        reader = KbsReader(parse_options({"path": url}), COLS)
        parts = reader.partitions()
        assert sum(len(p.segments) for p in parts) == n
        sizes[n] = max(len(pickle.dumps(p)) for p in parts)
        assert len(pickle.dumps(reader)) < 4096
    assert sizes[20_000] <= sizes[2_000] * 1.1, sizes
