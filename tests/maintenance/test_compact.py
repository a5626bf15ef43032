"""Compaction of a backup, checked against a naive reference on random data."""

from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_kbs import read_table
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import KbsError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.maintenance import CompactionWarning, compact_backup, retain_backup
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import BackupWriter, open_backup
from fsspec_kbs.store.open import detect_layout
from tests.conftest import load_expected, table_rows


def naive_compact(records: list[dict], retention: int | None) -> list[dict]:
    """Kafka compaction, spelled out: per partition, the last record of each key; null keys all
    kept; a surviving tombstone dropped when older than retention before the partition's max ts."""
    out = []
    parts: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        parts.setdefault((r["topic"], r["partition"]), []).append(r)
    for recs in parts.values():
        max_ts = max(r["timestamp"] for r in recs)
        last: dict[bytes, int] = {}
        for r in recs:
            if r["key"] is not None:
                last[r["key"]] = r["offset"]
        for r in recs:
            if r["key"] is not None and last[r["key"]] != r["offset"]:
                continue
            if (r["key"] is not None and r["value"] is None and retention is not None
                    and r["timestamp"] < max_ts - retention):
                continue
            out.append(r)
    return sorted(out, key=lambda r: (r["topic"], r["partition"], r["offset"]))


record_st = st.fixed_dictionaries({
    "key": st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"", b"d" * 50]), st.binary(max_size=3)),
    "value": st.one_of(st.none(), st.binary(max_size=20)),
    "ts": st.integers(0, 10_000),
    "gap": st.integers(1, 3),
    "headers": st.lists(st.tuples(st.sampled_from(["x", "y"]), st.one_of(st.none(), st.binary(max_size=4))),
                        max_size=2),
})


def write_backup(url: str, parts: dict[tuple[str, int], list[dict]], segment_max_records: int = 7) -> list[dict]:
    rows = []
    with BackupWriter(url, segment_max_records=segment_max_records, compression="lz4") as w:
        for (topic, p), recs in sorted(parts.items()):
            offset = 100
            records = []
            for r in recs:
                records.append({"offset": offset, "timestamp": 1_700_000_000_000 + r["ts"], "key": r["key"],
                                "value": r["value"], "headers": r["headers"]})
                offset += r["gap"]
            if records:
                w.write_columns(topic, p, RecordColumns.from_records(records))
            rows += [{"topic": topic, "partition": p, **r} for r in records]
    return rows


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.dictionaries(st.sampled_from([("t", 0), ("t", 1), ("u", 0)]), st.lists(record_st, max_size=40),
                             min_size=1),
       retention=st.one_of(st.none(), st.integers(0, 8000)))
def test_compaction_matches_naive_reference(tmp_path: Path, parts: dict, retention: int | None) -> None:
    src = str(tmp_path / uuid.uuid4().hex / "src")
    dst = str(tmp_path / uuid.uuid4().hex / "dst")
    rows = write_backup(src, parts)
    if not rows:
        return
    with pytest.warns() if any(r["key"] is None for r in rows) else _nothing():
        report = compact_backup(src, dst, delete_retention=retention)
    want = naive_compact(rows, retention)
    got = table_rows(read_table(dst))
    assert got == [{**r, "headers": [tuple(h) for h in r["headers"]]} for r in want]
    assert report.records_in == len(rows) and report.records_out == len(want)
    assert validate_backup(dst, deep=True).ok


class _nothing:
    def __enter__(self) -> None:
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", CompactionWarning)

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


def test_null_keys_kept_with_warning_and_report(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "s" / "src"), str(tmp_path / "d" / "dst")
    recs = [{"key": None, "value": b"1", "ts": 1, "gap": 1, "headers": []},
            {"key": b"k", "value": b"2", "ts": 2, "gap": 1, "headers": []},
            {"key": None, "value": b"3", "ts": 3, "gap": 1, "headers": []},
            {"key": b"k", "value": None, "ts": 4, "gap": 5, "headers": []},
            {"key": b"j", "value": b"5", "ts": 9000, "gap": 1, "headers": []}]
    write_backup(src, {("t", 0): recs})
    with pytest.warns(CompactionWarning, match="2 record\\(s\\) with a null key"):
        report = compact_backup(src, dst)
    assert read_table(dst).column("offset").to_pylist() == [100, 102, 103, 108]  # gaps stay
    p = report.partitions[0]
    assert (p.records_in, p.records_out, p.superseded, p.null_key_records, p.tombstones_removed) == (5, 4, 1, 2, 0)
    with pytest.warns(CompactionWarning):
        compact_backup(src, str(tmp_path / "d" / "dst2"), delete_retention="5s")
    assert read_table(str(tmp_path / "d" / "dst2")).column("offset").to_pylist() == [100, 102, 108]
    m = open_backup(dst).manifest
    assert m.extra["compaction"]["source"] == src and m.compression["algorithm"] == "lz4"


def test_cli_compact(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "s" / "src"), str(tmp_path / "d" / "dst")
    recs = [{"key": b"k%d" % (i % 3), "value": None if i == 8 else b"v", "ts": i * 1000, "gap": 1, "headers": []}
            for i in range(10)]
    write_backup(src, {("t", 0): recs})
    res = CliRunner().invoke(cli, ["compact", src, "--to", dst, "--delete-retention", "2s", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["records_in"] == 10 and doc["delete_retention_ms"] == 2000
    assert read_table(dst).column("offset").to_pylist() == [107, 108, 109]
    res = CliRunner().invoke(cli, ["compact", src, "--to", dst])
    assert res.exit_code == 2 and "already exists" in res.stderr
    res = CliRunner().invoke(cli, ["compact", src, "--to", dst, "--delete-retention", "soon"])
    assert res.exit_code == 2 and "duration" in res.output


def test_compact_oso_native_backup(conformance: Path, tmp_path: Path) -> None:
    """Compaction reads either layout (here the OSO tool's) and writes KBS."""
    src = conformance / "oso-native" / "zstd" / "oso-backup-1"
    expected = load_expected(src.parent / "expected.jsonl")
    dst = str(tmp_path / "b" / "compacted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompactionWarning)
        compact_backup(str(src), dst)
    assert detect_layout(dst) == "kbs"
    want = naive_compact(expected, None)
    assert table_rows(read_table(dst)) == want
    with pytest.raises(KbsError, match="convert"):
        retain_backup(str(src), str(tmp_path / "b" / "r"), max_age="1d")


def test_copies_keep_streaming_records_without_rolling_a_query_back(tmp_path: Path) -> None:
    """Compaction appended into a backup a streaming sink also writes keeps, per query, the later
    micro-batch; convert carries the record (kbs-format.md §3: unknown fields are kept)."""
    import json

    from fsspec_kbs.maintenance import compact_backup
    from fsspec_kbs.maintenance.convert import convert_backup
    from fsspec_kbs.store import BackupWriter
    from fsspec_kbs.store.commit import STREAMS_FIELD

    def make(url: str, topic: str, streams: dict) -> None:
        w = BackupWriter(url)
        w.write_columns(topic, 0, RecordColumns.from_records([
            dict(offset=i, timestamp=1000 + i, key=b"k%d" % i, value=b"v", headers=[]) for i in range(5)]))
        w.commit(extra={STREAMS_FIELD: streams})

    def streams(url: Path) -> dict:
        return {q: e["batch"] for q, e in json.loads((url / "manifest.json").read_text())[STREAMS_FIELD].items()}

    make(str(tmp_path / "src"), "a", {"q1": {"batch": 5}, "q3": {"batch": 2}})
    make(str(tmp_path / "dst"), "b", {"q1": {"batch": 7}, "q2": {"batch": 1}})
    compact_backup(str(tmp_path / "src"), str(tmp_path / "dst"), mode="append")
    assert streams(tmp_path / "dst") == {"q1": 7, "q2": 1, "q3": 2}
    convert_backup(str(tmp_path / "src"), str(tmp_path / "copy"))
    assert streams(tmp_path / "copy") == {"q1": 5, "q3": 2}
