"""Batch indexes on the write side (kbs-format.md §7): every writer writes them, the commit
protocol moves and checks them, ``kbs index`` adds them to old backups, and every bounded
reader then fetches only the index and the batches it needs (counted through a filesystem
wrapper)."""

from __future__ import annotations

import json
import shutil
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner
from fsspec.implementations.memory import MemoryFileSystem

import fsspec_kbs
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import BatchIndexError, CommitError, KbsError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.batch_index import ENTRY_SIZE, INDEX_HEADER_SIZE, parse_index, verify_index
from fsspec_kbs.maintenance.index import add_indexes
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import BackupWriter, KbsBackup
from fsspec_kbs.store.batch_index import index_path
from fsspec_kbs.store.staging import SegmentAdopter

N = 20_000


def records(n: int = N, start: int = 0) -> RecordColumns:
    rng = np.random.default_rng(start)
    return RecordColumns.from_records([
        {"offset": o, "timestamp": 1_000_000 + 10 * o, "key": f"k{o % 97}".encode(),
         "value": bytes(rng.integers(97, 123, 60 + o % 90, dtype=np.uint8)), "headers": []}
        for o in range(start, start + n)])


def write(url: str, *, index: bool = True, n: int = N, mode: str = "error", start: int = 0,
          partitions: int = 1, **kw: Any) -> None:
    with BackupWriter(url, mode=mode, index=index, segment_max_bytes=kw.pop("segment_max_bytes", 400_000),
                      batch_max_bytes=kw.pop("batch_max_bytes", 8_000), **kw) as w:
        for p in range(partitions):
            w.write_columns("t", p, records(n, start))


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def check_indexes(url: str, so: dict | None = None) -> int:
    """Every segment has an index the manifest names, agreeing with the segment read whole."""
    b = KbsBackup.open(url, so)
    assert b.manifest is not None and b.manifest.version == "1.2"
    for ref in b.segments():
        assert ref.index_crc32 is not None, ref.path
        data = b.fs.cat_file(index_path(ref.path))
        assert zlib.crc32(data) == ref.index_crc32
        idx = parse_index(data, index_path(ref.path), ref.path, ref.size_bytes or 0, ref.index_crc32)
        verify_index(idx, b.open_segment(ref))
        assert int(idx.last[-1]) == ref.last_offset and int(idx.max_ts.max()) == ref.max_timestamp
    return len(b.segments())


def rows(url: str, **kw: Any) -> list[tuple[int, int, bytes]]:
    t = fsspec_kbs.read_table(url, columns=["partition", "offset", "value"], **kw)
    return list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                    t.column("value").to_pylist(), strict=True))


# -- writers --------------------------------------------------------------------------------------
def test_writer_writes_indexes_and_manifest_1_2(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    write(url, partitions=2)
    assert check_indexes(url) > 4
    files = sorted(p.name for p in (tmp_path / "b/topics/t/0").iterdir())
    kbs = [f for f in files if f.endswith(".kbs")]
    assert files == sorted(kbs + [f[:-4] + ".index" for f in kbs])
    assert not (tmp_path / "b/_staging").exists()
    # Append: the base's segments keep their index_crc32, the new ones get theirs.
    write(url, mode="append", n=5_000, start=N, partitions=2)
    assert check_indexes(url) > 6
    assert rows(url, start_offset=N - 10, end_offset=N + 10, partitions=0) == [
        r for r in rows(url, partitions=0) if N - 10 <= r[1] < N + 10]


def test_index_opt_out(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    write(url, index=False)
    assert not list((tmp_path / "b").rglob("*.index"))
    doc = manifest(tmp_path / "b")
    assert doc["version"] == "1.2"
    assert all("index_crc32" not in s for s in doc["topics"][0]["partitions"][0]["segment_index"])


def test_resume_writes_indexes(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    w = BackupWriter(url, segment_max_bytes=200_000, batch_max_bytes=8_000)
    w.write_columns("t", 0, records(8_000))
    w.flush()  # staged, never committed: the run "died"
    w2 = BackupWriter(url, mode="resume", txn_id=w.txn_id, segment_max_bytes=200_000, batch_max_bytes=8_000)
    w2.write_columns("t", 0, records(2_000, 8_000))
    w2.commit()
    assert check_indexes(url) >= 3
    assert [r[1] for r in rows(url)] == list(range(10_000))


def test_adopter_moves_staged_index_and_rewrite_reindexes(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    staged = BackupWriter(f"{url}/_staging/job/task", stage_only=True, segment_max_bytes=200_000,
                          batch_max_bytes=8_000)
    staged.write_columns("t", 0, records(5_000))
    staged.write_columns("t", 1, records(5_000))
    staged.flush()
    ad = SegmentAdopter(url, mode="error", txn_id="job", segment_max_bytes=200_000, batch_max_bytes=8_000)
    for w in staged.written_segments:
        assert Path(w.index_path).is_file() and w.index_crc32 is not None
        if w.partition == 0:
            ad.adopt_segment("t", 0, w.path, w.stats, w.index_crc32)
        else:  # provisional offsets: shifted and re-encoded, with a new index
            ad.rewrite_segment("t", 1, w.path, 100)
    ad.commit()
    assert check_indexes(url) >= 4
    assert [r[1] for r in rows(url, partitions=1)] == list(range(100, 5_100))


def test_compact_retain_convert_write_indexes(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    write(src, index=False)
    fsspec_kbs.compact_backup(src, str(tmp_path / "compacted"))
    fsspec_kbs.retain_backup(src, str(tmp_path / "retained"), max_bytes=10**9)
    fsspec_kbs.convert_backup(src, str(tmp_path / "oso"), "oso")
    fsspec_kbs.convert_backup(str(tmp_path / "oso"), str(tmp_path / "back"), "kbs")
    for name in ("compacted", "retained", "back"):
        assert check_indexes(str(tmp_path / name)) >= 1, name
        got = rows(str(tmp_path / name))
        assert got == rows(src) if name != "compacted" else set(got) <= set(rows(src))
    assert not list((tmp_path / "oso").rglob("*.index"))  # the OSO layout has no index


# -- the commit protocol ----------------------------------------------------------------------------
class Crash(Exception):
    pass


def test_roll_forward_moves_and_checks_indexes(tmp_path: Path) -> None:
    url = str(tmp_path / "b")

    def fault(step: str) -> None:
        if step == "claimed":
            raise Crash(step)

    w = BackupWriter(url, fault=fault, segment_max_bytes=200_000, batch_max_bytes=8_000)
    w.write_columns("t", 0, records(5_000))
    with pytest.raises(Crash):
        w.commit()
    record = json.loads(next((tmp_path / "b/_commits").glob("*.json")).read_text())
    index_moves = [m for m in record["moves"] if m["dst"].endswith(".index")]
    assert index_moves and all("crc32" in m and "crc64" not in m or m.get("crc64") is None for m in index_moves)
    # A staged index damaged before the roll forward: the commit cannot finish, nothing is published.
    staged = tmp_path / "b" / index_moves[0]["src"]
    good = staged.read_bytes()
    staged.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(CommitError, match="crc32"):
        fsspec_kbs.store.txn.repair(url)
    assert not (tmp_path / "b/manifest.json").exists()
    staged.write_bytes(good)
    fsspec_kbs.store.txn.repair(url)
    assert check_indexes(url) >= 2


# -- kbs index ----------------------------------------------------------------------------------------
def make_old(root: Path, version: str) -> str:
    url = str(root)
    write(url, index=False, partitions=2)
    doc = manifest(root)
    doc["version"] = version
    doc.pop("commit", None)  # as written before commit records
    shutil.rmtree(root / "_commits")
    if version == "1.0":
        for p in doc["topics"][0]["partitions"]:
            del p["segment_index"]
    (root / "manifest.json").write_text(json.dumps(doc))
    return url


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_add_indexes_to_old_backup(tmp_path: Path, version: str) -> None:
    url = make_old(tmp_path / "b", version)
    before = rows(url)
    seen: list[str] = []
    report = add_indexes(url, progress=lambda done, total, ref, action: seen.append(action))
    assert report.indexed == report.segments == len(seen) > 4 and report.committed is not None
    assert report.version_before == version
    assert check_indexes(url) == report.segments
    assert rows(url) == before
    # Idempotent: the second run only verifies.
    again = add_indexes(url)
    assert again.committed is None and again.verified == report.segments and again.indexed == 0
    # A damaged index is rebuilt, reported.
    victim = sorted((tmp_path / "b/topics/t/1").glob("*.index"))[1]
    victim.write_bytes(victim.read_bytes()[:-3])
    fixed = add_indexes(url)
    assert fixed.committed is not None and list(fixed.rebuilt) == [str(victim).replace(".index", ".kbs")]
    assert check_indexes(url) == report.segments


def test_add_indexes_on_s3(s3_root: str, s3_storage_options: dict) -> None:
    url = f"{s3_root}/b-{uuid.uuid4().hex[:6]}"
    so = s3_storage_options
    with BackupWriter(url, so, index=False, segment_max_bytes=100_000, batch_max_bytes=4_000) as w:
        w.write_columns("t", 0, records(5_000))
    report = add_indexes(url, so)
    assert report.indexed == report.segments > 2 and report.committed is not None
    assert check_indexes(url, so) == report.segments
    assert add_indexes(url, so).committed is None
    t = fsspec_kbs.read_table(url, storage_options=so, start_offset=2_000, end_offset=2_010)
    assert t.column("offset").to_pylist() == list(range(2_000, 2_010))


def test_kbs_index_cli(tmp_path: Path) -> None:
    url = make_old(tmp_path / "b", "1.1")
    res = CliRunner().invoke(cli, ["index", url])
    assert res.exit_code == 0, res.output
    assert "indexed" in res.output and "manifest 1.2" in res.output
    res = CliRunner().invoke(cli, ["index", url])
    assert res.exit_code == 0 and "already have a good index" in res.output
    fsspec_kbs.convert_backup(url, str(tmp_path / "oso"), "oso")
    res = CliRunner().invoke(cli, ["index", str(tmp_path / "oso")])
    assert res.exit_code != 0 and "no batch index" in res.output
    with pytest.raises(KbsError, match="no batch index"):
        add_indexes(str(tmp_path / "oso"))


def test_add_indexes_rebases_on_concurrent_append(tmp_path: Path) -> None:
    url = make_old(tmp_path / "b", "1.1")
    from fsspec_kbs.maintenance import index as index_mod

    real = index_mod._build
    calls = []

    def build(state: Any, *a: Any) -> Any:
        if not calls:  # another writer appends between the indexing and the claim
            write(url, mode="append", n=2_000, start=N, partitions=2)
        calls.append(state.version)
        return real(state, *a)

    index_mod._build = build  # type: ignore[assignment]
    try:
        add_indexes(url)
    finally:
        index_mod._build = real  # type: ignore[assignment]
    assert len(calls) == 2  # rebased on the append
    assert check_indexes(url) > 6
    assert [r[1] for r in rows(url, partitions=0)] == list(range(N + 2_000))


# -- bounded readers through a byte-counting filesystem ------------------------------------------------
class CountingFS(MemoryFileSystem):
    """memory:// as ``countmem://``, counting the bytes served per file suffix."""

    protocol = ("countmem",)
    read: dict[str, int] = {}

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, str):
            path = path.removeprefix("countmem://")
        return MemoryFileSystem._strip_protocol(path)

    @staticmethod
    def _count(path: str, n: int) -> None:
        kind = path.rsplit(".", 1)[-1] if "." in path.rsplit("/", 1)[-1] else "other"
        CountingFS.read[kind] = CountingFS.read.get(kind, 0) + n

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
        data = super().cat_file(path, start, end, **kw)
        self._count(path, len(data))
        return data

    def _open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        f = super()._open(path, mode, **kw)
        if "r" in mode:
            read = f.read

            def counted(n: int = -1) -> bytes:
                data = read(n)
                self._count(path, len(data))
                return data

            f.read = counted
        return f


fsspec.register_implementation("countmem", CountingFS, clobber=True)


@pytest.fixture
def counted() -> Iterator[tuple[str, dict]]:
    """A backup of one partition (50 segments' worth of batches) on memory://, read as countmem://;
    yields the countmem URL and what a 1 % offset and a 1 % time query should cost."""
    name = f"/idx-{uuid.uuid4().hex[:8]}/b"
    write(f"memory://{name}", n=N, segment_max_bytes=1_000_000, batch_max_bytes=4_000)
    fs = MemoryFileSystem()
    b = KbsBackup.open(f"memory://{name}")
    lo, hi = N // 2, N // 2 + N // 100
    t0, t1 = 1_000_000 + 10 * lo, 1_000_000 + 10 * hi
    cost = {}
    for what, bounds in (("offset", (lo, hi, None, None)), ("time", (None, None, t0, t1))):
        need = len(fs.cat_file(f"{name}/manifest.json"))
        for ref in b.segments():
            if not ref.may_contain(lo, hi) and what == "offset":
                continue
            idx = b.batch_index(ref)
            assert idx is not None
            runs = idx.select(*bounds)
            # A time query reads the index of every segment of the partition: the manifest's
            # time range of a segment alone never prunes it (docs/format-decisions.md).
            if runs or what == "time":
                need += idx.stored_bytes(runs) + len(fs.cat_file(index_path(ref.path)))
        cost[f"need_{what}"] = need
    try:
        yield f"countmem://{name}", {"offset": (lo, hi), "time": (t0, t1), **cost,
                                      "stored": sum(r.size_bytes or 0 for r in b.segments())}
    finally:
        fs.rm(name.rsplit("/", 1)[0], recursive=True)


def _reset() -> None:
    CountingFS.read = {}


def _total() -> int:
    return sum(CountingFS.read.values())


def _assert_narrow(q: dict, what: str, got: list[int]) -> None:
    lo, hi = q[what]
    want = list(range(lo, hi)) if what == "offset" else list(range((lo - 1_000_000) // 10, (hi - 1_000_000) // 10))
    assert got == want
    total = _total()
    # Index + matching batches (+ the segment header, 32 B per segment) + manifest; some slack
    # for index files of segments a time query has to look at.
    assert total <= 1.2 * q[f"need_{what}"], (what, total, q[f"need_{what}"], CountingFS.read)
    assert total < q["stored"] / 10, (total, q["stored"])


@pytest.mark.parametrize("what", ["offset", "time"])
def test_read_table_open_reader_dataset_read_only_needed(counted: tuple[str, dict], what: str) -> None:
    url, q = counted
    kw = ({"start_offset": q["offset"][0], "end_offset": q["offset"][1]} if what == "offset"
          else {"start_time": q["time"][0], "end_time": q["time"][1]})
    _reset()
    _assert_narrow(q, what, [r[1] for r in rows(url, **kw)])
    _reset()
    with fsspec_kbs.open_reader(url, columns=["offset"], **kw) as reader:
        got = reader.read_all().column("offset").to_pylist()
    _assert_narrow(q, what, got)
    _reset()
    ds = fsspec_kbs.KbsDataset.open(url).filter(**kw)
    _assert_narrow(q, what, ds.to_table(columns=["offset"]).column("offset").to_pylist())


@pytest.mark.parametrize("what", ["offset", "time"])
def test_kbs_cat_reads_only_needed(counted: tuple[str, dict], what: str) -> None:
    url, q = counted
    lo, hi = q[what]
    args = ["--start-offset", str(lo), "--end-offset", str(hi)] if what == "offset" else [
        "--start-time", str(lo), "--end-time", str(hi)]
    _reset()
    res = CliRunner().invoke(cli, ["cat", url, *args])
    assert res.exit_code == 0, res.output
    _assert_narrow(q, what, [json.loads(line)["offset"] for line in res.output.splitlines()])


@pytest.mark.parametrize("what", ["offset", "time"])
def test_restore_plan_reads_only_needed(counted: tuple[str, dict], what: str) -> None:
    """``kbs restore`` plans exact counts from the batches its bounds select (no broker needed:
    the run stops once planned)."""
    from fsspec_kbs.kafka.restore import RestoreRun

    url, q = counted
    lo, hi = q[what]
    kw: dict[str, Any] = ({"offset_ranges": {("t", 0): (lo, hi)}} if what == "offset"
                          else {"from_time": lo, "to_time": hi})
    planned: list = []

    class Planned(Exception):
        pass

    def stop(plans: list) -> None:
        planned.extend(plans)
        raise Planned

    _reset()
    with pytest.raises(Planned):
        RestoreRun(url, {"bootstrap.servers": "127.0.0.1:1"}, on_plan=stop, **kw).run()
    total = _total()
    assert total <= 1.2 * q[f"need_{what}"], (what, total, q[f"need_{what}"], CountingFS.read)
    (plan,) = planned
    want = [r[1] for r in rows(url, **({"start_offset": lo, "end_offset": hi} if what == "offset"
                                       else {"start_time": lo, "end_time": hi}))]
    assert (plan.records, plan.first_offset, plan.last_offset) == (len(want), want[0], want[-1])


def test_kbs_chained_url_reads_only_needed(counted: tuple[str, dict]) -> None:
    url, q = counted
    _reset()
    _assert_narrow(q, "offset", [r[1] for r in rows(f"kbs::{url}", start_offset=q["offset"][0],
                                                     end_offset=q["offset"][1])])


def test_without_index_reads_whole_segments(tmp_path: Path) -> None:
    """The reference: the same query on a backup without indexes reads far more."""
    name = f"/idx-{uuid.uuid4().hex[:8]}/b"
    write(f"memory://{name}", index=False, n=N, segment_max_bytes=1_000_000, batch_max_bytes=4_000)
    try:
        _reset()
        got = [r[1] for r in rows(f"countmem://{name}", start_time=1_000_000 + 10 * (N // 2),
                                  end_time=1_000_000 + 10 * (N // 2 + N // 100))]
        assert got == list(range(N // 2, N // 2 + N // 100))
        assert _total() > 1_000_000
    finally:
        MemoryFileSystem().rm(name.rsplit("/", 1)[0], recursive=True)


# -- damaged indexes: reported with both names, never a wrong row -------------------------------------
def _damage(root: Path, how: str) -> Path:
    victim = sorted((root / "topics/t/0").glob("*.index"))[2]
    data = bytearray(victim.read_bytes())
    if how == "flip":
        data[INDEX_HEADER_SIZE + ENTRY_SIZE + 3] ^= 0x40
    elif how == "truncate":
        del data[-7:]
    elif how in ("lie_offsets", "lie_time"):
        e = np.frombuffer(bytes(data[INDEX_HEADER_SIZE:]), dtype=[("b", "<u8"), ("l", "<u8"), ("p", "<u8"),
                                                                  ("mn", "<i8"), ("mx", "<i8")]).copy()
        if how == "lie_offsets":
            e["l"][1] -= 1  # the batch's last record lies beyond the entry
        else:
            e["mx"][1] -= 5
        body = e.tobytes()
        data = bytearray(data[:12] + zlib.crc32(body).to_bytes(4, "little") + body)
        m = manifest(root)  # the manifest's index_crc32 recomputed too: only the entries lie
        seq = int(victim.stem.split("-")[1])
        m["topics"][0]["partitions"][0]["segment_index"][seq]["index_crc32"] = zlib.crc32(bytes(data))
        (root / "manifest.json").write_text(json.dumps(m))
    elif how == "manifest_crc":
        m = manifest(root)
        seq = int(victim.stem.split("-")[1])
        m["topics"][0]["partitions"][0]["segment_index"][seq]["index_crc32"] ^= 1
        (root / "manifest.json").write_text(json.dumps(m))
    elif how == "missing":
        victim.unlink()
        return victim
    victim.write_bytes(bytes(data))
    return victim


@pytest.mark.parametrize("how", ["flip", "truncate", "manifest_crc", "missing", "lie_offsets", "lie_time"])
def test_damaged_index_falls_back_or_fails_never_wrong(tmp_path: Path, how: str) -> None:
    url = str(tmp_path / "b")
    write(url, segment_max_bytes=100_000, batch_max_bytes=4_000)
    truth = rows(url)
    b = KbsBackup.open(url)
    seg = b.segments()[2]
    victim = _damage(tmp_path / "b", how)
    queries = [{"start_offset": seg.first_offset, "end_offset": (seg.first_offset or 0) + 300},
               {"start_time": seg.min_timestamp, "end_time": (seg.max_timestamp or 0) + 1}]
    for kw in queries:
        lo = kw.get("start_offset", kw.get("start_time"))
        try:
            got = rows(url, **kw)
        except BatchIndexError as e:
            assert how.startswith("lie")
            assert str(victim) in str(e) and str(victim).replace(".index", ".kbs") in str(e)
            continue
        key = 1 if "start_offset" in kw else None
        want = [r for r in truth if (r[1] if key else 1_000_000 + 10 * r[1]) >= lo and
                (r[1] if key else 1_000_000 + 10 * r[1]) < (kw.get("end_offset") or kw.get("end_time"))]
        assert got == want, how
    report = validate_backup(url, deep=True)
    assert not report.ok
    text = " ".join(f"{d.path} {d.message}" for d in report.defects)
    assert str(victim) in text and str(victim).replace(".index", ".kbs") in text


def test_raised_base_offset_cannot_hide_a_batch(tmp_path: Path) -> None:
    """A CRC-valid index whose entry claims a batch starts later than it does: an offset query
    ending inside the real batch would skip it; the header check of the next batch catches it."""
    url = str(tmp_path / "b")
    write(url, segment_max_bytes=100_000, batch_max_bytes=4_000)
    b = KbsBackup.open(url)
    ref = b.segments()[1]
    idx = b.batch_index(ref)
    assert idx is not None and len(idx) > 3 and int(idx.last[2]) - int(idx.base[2]) > 10
    real = int(idx.base[2])
    e = idx.entries.copy()
    e["base_offset"][2] += 10
    body = e.tobytes()
    head = b"KBSI\x01\x00\x00\x00" + len(e).to_bytes(4, "little") + zlib.crc32(body).to_bytes(4, "little")
    ipath = Path(index_path(ref.path))
    ipath.write_bytes(head + body)
    doc = manifest(tmp_path / "b")
    doc["topics"][0]["partitions"][0]["segment_index"][1]["index_crc32"] = zlib.crc32(head + body)
    (tmp_path / "b/manifest.json").write_text(json.dumps(doc))
    with pytest.raises(BatchIndexError, match="batch 2 base offset") as err:
        rows(url, start_offset=int(idx.base[1]), end_offset=real + 5)
    assert str(ipath) in str(err.value) and ref.path in str(err.value)
