"""Retention of a backup: whole leading segments by age and size, bytes copied unchanged."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_kbs import read_table
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import CommitConflictError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.maintenance import parse_duration, parse_size, plan_retention, retain_backup
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import BackupWriter, open_backup
from tests.conftest import table_rows

T0 = 1_700_000_000_000


def naive_plan(sizes: list[int], max_ts: list[int], age: int | None, cap: int | None, now: int) -> tuple[int, int]:
    """Kafka's two retention passes, one segment at a time."""
    segs = list(zip(sizes, max_ts, strict=True))
    by_age = 0
    while age is not None and segs and now - segs[0][1] > age:
        segs.pop(0)
        by_age += 1
    by_size = 0
    while cap is not None and segs and sum(s for s, _ in segs) - segs[0][0] >= cap:
        segs.pop(0)
        by_size += 1
    return by_age, by_size


@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 1000)), max_size=12),
       st.one_of(st.none(), st.integers(0, 1000)), st.one_of(st.none(), st.integers(0, 600)))
def test_plan_matches_naive(segs: list[tuple[int, int]], age: int | None, cap: int | None) -> None:
    sizes = [s for s, _ in segs]
    ts = sorted(t for _, t in segs)  # segments are in time order, mostly; not required
    assert plan_retention(sizes, ts, age, cap, 1000) == naive_plan(sizes, ts, age, cap, 1000)


def make_backup(url: str, rng: random.Random) -> dict[tuple[str, int], list[dict]]:
    parts = {}
    with BackupWriter(url, segment_max_records=10, compression="zstd") as w:
        for key in (("t", 0), ("t", 1), ("u", 3)):
            n = rng.randint(0, 60)
            recs = [{"offset": i * 2, "timestamp": T0 + i * 1000 + rng.randint(0, 500), "key": b"k",
                     "value": rng.randbytes(rng.randint(0, 200)), "headers": []} for i in range(n)]
            if recs:
                w.write_columns(*key, RecordColumns.from_records(recs))
            parts[key] = recs
    return parts


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), age=st.one_of(st.none(), st.integers(0, 70_000)),
       cap=st.one_of(st.none(), st.integers(0, 20_000)))
def test_retain_drops_leading_segments_and_copies_bytes(tmp_path_factory: pytest.TempPathFactory, seed: int,
                                                         age: int | None, cap: int | None) -> None:
    if age is None and cap is None:
        return
    root = tmp_path_factory.mktemp("ret")
    src, dst = str(root / "src"), str(root / "dst")
    make_backup(src, random.Random(seed))
    source = open_backup(src)
    report = retain_backup(src, dst, max_age=age, max_bytes=cap)
    assert report.reference_time == source.manifest.time_range["latest_timestamp"]
    out = open_backup(dst)
    kept_rows = []
    for (topic, p) in sorted({(r.topic, r.partition) for r in source.segments()}):
        refs = [r for r in source.segments() if (r.topic, r.partition) == (topic, p)]
        by_age, by_size = naive_plan([r.size_bytes for r in refs], [r.max_timestamp for r in refs], age, cap,
                                     report.reference_time)
        kept = refs[by_age + by_size :]
        got = [r for r in out.segments() if (r.topic, r.partition) == (topic, p)]
        assert [g.seq for g in got] == list(range(len(kept)))
        for g, k in zip(got, kept, strict=True):
            assert Path(g.path).read_bytes() == Path(k.path).read_bytes()
            assert (g.first_offset, g.last_offset, g.records, g.crc64) == \
                (k.first_offset, k.last_offset, k.records, k.crc64)
        if kept:
            kept_rows += table_rows(read_table(src, topics=[topic], partitions=[p],
                                               start_offset=kept[0].first_offset))
    assert table_rows(read_table(dst)) == sorted(kept_rows, key=lambda r: (r["topic"], r["partition"],
                                                                           r["offset"]))
    assert validate_backup(dst, deep=True).ok


def test_retain_refuses_same_target_and_existing(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    make_backup(src, random.Random(1))
    with pytest.raises(ValueError, match="must differ"):
        retain_backup(src, src, max_bytes=1)
    retain_backup(src, str(tmp_path / "dst"), max_bytes=1)
    with pytest.raises(CommitConflictError):
        retain_backup(src, str(tmp_path / "dst"), max_bytes=1)
    retain_backup(src, str(tmp_path / "dst"), max_age="1h", overwrite=True)
    assert open_backup(str(tmp_path / "dst")).manifest.extra["retention"]["max_age_ms"] == 3_600_000


def test_retain_now_reference(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    make_backup(src, random.Random(2))
    report = retain_backup(src, str(tmp_path / "dst"), max_age="1d", now="2100-01-01T00:00:00Z")
    assert report.segments_dropped == len(open_backup(src).segments())
    assert read_table(str(tmp_path / "dst")).num_rows == 0


def test_cli_retain(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    make_backup(src, random.Random(3))
    res = CliRunner().invoke(cli, ["retain", src, "--to", dst, "--max-age", "20s", "--max-bytes", "2KiB", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["max_age_ms"] == 20_000 and doc["max_bytes"] == 2048
    assert CliRunner().invoke(cli, ["retain", src, "--to", dst, "--max-age", "1d"]).exit_code == 2
    res = CliRunner().invoke(cli, ["retain", src, "--to", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--max-age" in res.output


def test_units() -> None:
    assert parse_duration("7d") == 7 * 86_400_000
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("250ms") == 250
    assert parse_duration("1500") == 1500
    assert parse_size("10GiB") == 10 * 1024**3
    assert parse_size("500MB") == 500_000_000
    for bad in ("7 days", "", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_size("10 parsecs")


def test_retain_refuses_a_segment_the_manifest_does_not_describe(tmp_path: Path) -> None:
    """A segment replaced by another backup's (same size, valid CRCs) must stop retain, not be
    copied into a clean-looking backup."""
    import shutil

    import fsspec_kbs
    from fsspec_kbs.errors import SegmentFormatError
    from fsspec_kbs.format import RecordColumns
    from fsspec_kbs.maintenance import retain_backup
    from fsspec_kbs.store import BackupWriter

    def make(url: str, base: int) -> None:
        w = BackupWriter(url, compression="none")
        w.write_columns("t", 0, RecordColumns.from_records([
            dict(offset=base + i, timestamp=1000 + i, key=b"k", value=b"v%02d" % i, headers=[]) for i in range(10)]))
        w.commit()

    make(str(tmp_path / "a"), 0)
    make(str(tmp_path / "b"), 100)
    shutil.copy(tmp_path / "b/topics/t/0/segment-00000000.kbs", tmp_path / "a/topics/t/0/segment-00000000.kbs")
    with pytest.raises(SegmentFormatError):
        fsspec_kbs.read_table(str(tmp_path / "a"))
    with pytest.raises(SegmentFormatError):
        retain_backup(str(tmp_path / "a"), str(tmp_path / "c"), max_bytes=10**9)
    assert not (tmp_path / "c" / "manifest.json").exists()
