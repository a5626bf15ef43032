"""Spark input partitions covering batch ranges of one segment, by its batch index (issue 21 item 4).

A segment larger than ``maxPartitionBytes`` is read by several tasks, each fetching only its
batches (ranged reads, every batch CRC-32 checked); without a usable index the segment is one
task, as before; an index removed after planning makes the task read the segment instead.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from benchmarks.common import make_columns  # noqa: E402
from fsspec_kbs.errors import KbsError  # noqa: E402
from fsspec_kbs.spark import KbsReader, parse_options  # noqa: E402
from fsspec_kbs.spark.partition import BatchRun, SegmentPiece, group_pieces  # noqa: E402
from fsspec_kbs.store import BackupWriter, SegmentRef  # noqa: E402

pytestmark = pytest.mark.spark

COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def backup(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two partitions of ~6 MiB segments, batches of ~256 KiB, with batch indexes."""
    root = tmp_path_factory.mktemp("split") / "backup"
    w = BackupWriter(str(root), compression="zstd", segment_max_bytes=6 * MIB, batch_max_bytes=256 * 1024)
    for p in range(2):
        w.write_columns("t", p, make_columns(30_000, seed=p + 1))
    m = w.commit()
    assert sum(e.index_crc32 is not None for t in m.topics for p in t.partitions for e in p.segment_index) >= 4
    return str(root)


def reader(url: str, **opts: str) -> KbsReader:
    return KbsReader(parse_options({"path": url, **opts}), COLS)


def read_all(r: KbsReader, parts: list | None = None) -> pa.Table:
    parts = r.partitions() if parts is None else parts
    # Through pickle, as Spark ships them to executors.
    return pa.Table.from_batches([b for p in parts for b in r.read(pickle.loads(pickle.dumps(p)))])


def test_large_segments_split_into_batch_ranges(backup: str) -> None:
    whole = reader(backup, maxPartitionBytes=str(64 * MIB), minPartitionBytes="0")
    want = read_all(whole)
    assert want.num_rows == 60_000
    assert all(s.run is None for p in whole.partitions() for s in p.segments)

    split = reader(backup, maxPartitionBytes=str(MIB), minPartitionBytes="0")
    parts = split.partitions()
    runs = [s for p in parts for s in p.segments]
    assert all(s.run is not None for s in runs)
    assert len(parts) > 2 * len({s.ref.path for s in runs})  # several tasks per segment
    for s in runs:  # each task's bytes are a whole-batch range of at most maxPartitionBytes (or one batch)
        a, b = s.run.batches
        assert s.run.byte_range[1] - s.run.byte_range[0] <= MIB or b - a == 1
    got = read_all(split, parts)
    assert got.equals(want)
    # A run's partition stays small: refs and a few numbers, no index entries.
    assert max(len(pickle.dumps(p)) for p in parts) < 2000
    # minPartitions splits runs further by offsets; each task still reads only its batches.
    many = reader(backup, maxPartitionBytes=str(MIB), minPartitionBytes="0", minPartitions="100")
    parts = many.partitions()
    assert len(parts) >= 100
    assert read_all(many, parts).equals(want)


def test_split_reads_only_the_run_bytes(backup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = reader(backup, maxPartitionBytes=str(MIB), minPartitionBytes="0")
    parts = r.partitions()
    one = parts[len(parts) // 2]
    (seg,) = one.segments
    ranges: list[tuple[int, int]] = []
    whole: list[str] = []
    local = fsspec.filesystem("file")
    real_cat_file = type(local).cat_file

    def cat_file(self, path, start=None, end=None, **kw):  # type: ignore[no-untyped-def]
        if str(path).endswith(".kbs"):  # local cat_ranges reads through cat_file too
            (whole.append(path) if start is None and end is None else ranges.append((start, end)))
        return real_cat_file(self, path, start, end, **kw)

    monkeypatch.setattr(type(local), "cat_file", cat_file)
    rows = read_all(r, [one])
    assert rows.num_rows > 0 and not whole
    lo, hi = seg.run.byte_range
    fetched = sum(e - s for s, e in ranges)
    assert fetched <= (hi - lo) + 32 + 64 * 1024  # the run, the segment header, a coalescing gap


def test_no_index_means_whole_segment_tasks(tmp_path: Path) -> None:
    w = BackupWriter(str(tmp_path / "b"), compression="zstd", segment_max_bytes=6 * MIB, batch_max_bytes=256 * 1024,
                     index=False)
    w.write_columns("t", 0, make_columns(20_000))
    w.commit()
    r = reader(str(tmp_path / "b"), maxPartitionBytes=str(MIB), minPartitionBytes="0")
    parts = r.partitions()
    assert all(s.run is None for p in parts for s in p.segments)
    assert read_all(r, parts).num_rows == 20_000


def test_index_gone_after_planning_reads_the_segment(backup: str, tmp_path: Path) -> None:
    import shutil

    url = str(tmp_path / "copy")
    shutil.copytree(backup, url)
    r = reader(url, maxPartitionBytes=str(MIB), minPartitionBytes="0")
    parts = r.partitions()
    want = read_all(r, parts)
    for p in Path(url).rglob("*.index"):
        p.unlink()
    assert read_all(r, parts).equals(want)  # each task reads its run's offsets from the whole segment


def test_damaged_batch_in_a_run_is_an_error(backup: str, tmp_path: Path) -> None:
    import shutil

    url = str(tmp_path / "copy")
    shutil.copytree(backup, url)
    r = reader(url, maxPartitionBytes=str(MIB), minPartitionBytes="0")
    parts = r.partitions()
    target = parts[1].segments[0]
    path = Path(target.ref.path)
    data = bytearray(path.read_bytes())
    data[sum(target.run.byte_range) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(KbsError) as err:
        read_all(r, [parts[1]])
    assert str(path) in str(err.value)
    # onCorrupt=skip drops that run (with a warning naming the file), never yields a wrong row.
    from fsspec_kbs.spark.reader import KbsCorruptSegmentWarning

    skip = reader(url, maxPartitionBytes=str(MIB), minPartitionBytes="0", onCorrupt="skip")
    with pytest.warns(KbsCorruptSegmentWarning, match=str(path)):
        assert [b for b in skip.read(parts[1])] == []


def test_offset_and_time_bounds_keep_only_matching_batches(backup: str) -> None:
    manifest = json.loads((Path(backup) / "manifest.json").read_text())
    seg = manifest["topics"][0]["partitions"][0]["segment_index"][0]
    lo = seg["first_offset"] + 1000
    r = reader(backup, maxPartitionBytes=str(MIB), minPartitionBytes="0",
               startingOffsets=json.dumps({"t": {"0": lo}}), endingOffsets=json.dumps({"t": {"0": lo + 500}}))
    parts = r.partitions()
    runs = [s for p in parts for s in p.segments if s.ref.partition == 0]
    assert runs and all(s.run is not None for s in runs)
    assert sum(s.run.byte_range[1] - s.run.byte_range[0] for s in runs) < 2 * MIB  # not the 6 MiB segment
    got = read_all(r, parts)
    assert got.filter(pa.compute.equal(got["partition"], 0))["offset"].to_pylist() == list(range(lo, lo + 500))
    # A time window: the timestamp options find offsets through the index, then only those batches.
    full = read_all(reader(backup, minPartitionBytes="0"))
    p0 = full.filter(pa.compute.equal(full["partition"], 0))
    t0, t1 = p0["timestamp"][lo].value // 1000, p0["timestamp"][lo + 500].value // 1000
    r = reader(backup, maxPartitionBytes=str(MIB), minPartitionBytes="0", assign=json.dumps({"t": [0]}),
               startingTimestamp=str(t0), endingTimestamp=str(t1))
    parts = r.partitions()
    assert sum(s.run.byte_range[1] - s.run.byte_range[0] for p in parts for s in p.segments) < 2 * MIB
    got = read_all(r, parts)
    assert got["offset"].to_pylist() == list(range(lo, lo + 500))


def test_pushed_filters_read_only_matching_batches(backup: str) -> None:
    """Spark's pushed filters (what ``.where`` gives the reader) narrow to batch ranges too."""

    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

    from fsspec_kbs.spark.reader import KbsPushdownReader

    full = read_all(reader(backup, minPartitionBytes="0"))
    p0 = full.filter(pa.compute.equal(full["partition"], 0))
    r = KbsPushdownReader(parse_options({"path": backup, "minPartitionBytes": "0"}), COLS)
    assert r.pushFilters([EqualTo(("partition",), 0), GreaterThanOrEqual(("offset",), 7000),
                          LessThan(("offset",), 7300)]) == []
    parts = r.partitions()
    assert sum(s.run.byte_range[1] - s.run.byte_range[0] for p in parts for s in p.segments) < 2 * MIB
    assert read_all(r, parts)["offset"].to_pylist() == list(range(7000, 7300))

    t0, t1 = (p0["timestamp"][i].as_py() for i in (12_000, 12_400))
    r = KbsPushdownReader(parse_options({"path": backup, "minPartitionBytes": "0"}), COLS)
    r.pushFilters([EqualTo(("partition",), 0), GreaterThanOrEqual(("timestamp",), t0.replace(tzinfo=None)),
                   LessThan(("timestamp",), t1.replace(tzinfo=None))])
    parts = r.partitions()
    assert sum(s.run.byte_range[1] - s.run.byte_range[0] for p in parts for s in p.segments) < 2 * MIB
    want = p0.filter(pa.compute.and_(pa.compute.greater_equal(p0["timestamp"], pa.scalar(t0, p0["timestamp"].type)),
                                     pa.compute.less(p0["timestamp"], pa.scalar(t1, p0["timestamp"].type))))
    assert read_all(r, parts).equals(want)


def _piece(partition: int, seq: int, size: int) -> SegmentPiece:
    ref = SegmentRef("t", partition, seq, f"t/{partition}/{seq}", first_offset=seq * 1000,
                     last_offset=seq * 1000 + 999, records=1000, size_bytes=size)
    return SegmentPiece(ref)


def test_packing_keeps_a_partition_worth_a_task_apart() -> None:
    """Pieces of several partitions: each partition's range is a task once it holds a quarter
    of minPartitionBytes (as the Kafka source makes one task per partition); tiny ones are
    still packed together, and within one partition packing is as before."""
    o = parse_options({"path": "memory://x", "minPartitionBytes": str(8 * MIB)})
    key = [[(p.ref.partition, p.ref.seq) for p in g] for g in group_pieces(
        [_piece(p, 0, 6 * MIB) for p in range(6)], o)]
    assert key == [[(p, 0)] for p in range(6)]
    tiny = group_pieces([_piece(p, 0, 100_000) for p in range(6)], o)
    assert [len(g) for g in tiny] == [6]
    one = group_pieces([_piece(0, s, 3 * MIB) for s in range(4)], o)
    assert [len(g) for g in one] == [3, 1]


def test_worker_heap_is_frozen_only_in_a_daemon_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gc.freeze`` is for PySpark's daemon-forked workers (which collect after every task);
    the driver, tests and other processes keep their collector as it is."""
    import gc

    from fsspec_kbs.spark import reader as mod

    monkeypatch.setattr(mod, "_frozen_at_modules", 0)
    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    mod._freeze_worker_heap()
    assert calls == [] and mod._frozen_at_modules == 0
    monkeypatch.setattr(mod.sys, "argv", ["/x/site-packages/pyspark/daemon.py", "pyspark.worker"])
    mod._freeze_worker_heap()
    mod._freeze_worker_heap()
    assert calls == ["freeze"]
    monkeypatch.setitem(mod.sys.modules, "kbs_test_newly_imported", mod)  # e.g. numba, loaded later
    mod._freeze_worker_heap()
    assert calls == ["freeze", "freeze"]


def test_segment_piece_pickles_small_and_whole() -> None:
    """What a task gets: every field of the piece and its ref back, without the field names
    (a payload of refs and numbers: a task's size does not grow with the manifest)."""
    ref = SegmentRef("t", 3, 7, "b/topics/t/3/segment-00000007.kbs", 100, 199, 100, 1_000, 2_000, 4096,
                     2**63 + 5, "zstd", "kbs", True, 0xDEADBEEF)
    piece = SegmentPiece(ref, 120, None, BatchRun((2, 5), (512, 2048), (110, 160)), 9000)
    raw = pickle.dumps(piece)
    assert pickle.loads(raw) == piece and b"first_offset" not in raw
    assert len(raw) < 250
