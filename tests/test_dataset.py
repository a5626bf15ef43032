"""Filters, pruning, projections, expressions and streaming of the Arrow API."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import fsspec_kbs
from fsspec_kbs import KbsDataset
from fsspec_kbs.filters import ScanFilter, to_millis
from tests.conftest import load_expected, table_rows


@pytest.fixture
def expected(conformance: Path) -> list[dict]:
    return load_expected(conformance / "valid" / "zstd-v1.1" / "expected.jsonl")


@pytest.fixture
def url(conformance: Path) -> str:
    return str(conformance / "valid" / "zstd-v1.1" / "backup-1")


def test_offset_and_time_bounds_are_exact(url: str, expected: list[dict]) -> None:
    t = fsspec_kbs.read_table(url, topics="orders", partitions=0, start_offset=300, end_offset=800,
                              start_time=1_700_000_020_000, end_time=1_700_000_120_000)
    want = [r for r in expected if r["topic"] == "orders" and r["partition"] == 0
            and 300 <= r["offset"] < 800 and 1_700_000_020_000 <= r["timestamp"] < 1_700_000_120_000]
    assert table_rows(t) == want and len(want) > 50


def test_pruning_opens_only_needed_segments(url: str, expected: list[dict]) -> None:
    import json

    ds = fsspec_kbs.KbsDataset.open(url)
    assert len(ds.fragments()) == 6
    manifest = json.loads((Path(url) / "manifest.json").read_text())
    early = [s for t in manifest["topics"] for p in t["partitions"] for s in p["segment_index"]
             if s["min_timestamp"] < 1_700_000_054_300]
    assert [(f.topic, f.partition, f.seq) for f in ds.filter(topics="orders", start_offset=748).fragments()] == \
        [("orders", 0, 2), ("orders", 1, 0), ("orders", 1, 1)]
    assert len(early) < 6
    # A 1.1 manifest's time ranges are claims no cheap read can check: they never prune
    # (docs/format-decisions.md); time bounds checked against data prune as before.
    assert len(ds.filter(end_time=1_700_000_054_300).fragments()) == 6
    checked = KbsDataset(ds.backup)
    checked.backup._segments = [dataclasses.replace(r, time_checked=True) for r in ds.backup.segments()]
    assert len(checked.filter(end_time=1_700_000_054_300).fragments()) == len(early)
    assert ds.filter(topic_pattern=r"user\..*").fragments()[0].topic == "user.events-v2"
    # DNF tuples prune too
    scanner = ds.scanner(filter=[("topic", "=", "orders"), ("partition", "in", [1]), ("offset", ">", 1400)])
    assert len(scanner.fragments) == 1
    assert scanner.to_table().column("offset").to_pylist() == [
        r["offset"] for r in expected if r["topic"] == "orders" and r["partition"] == 1 and r["offset"] > 1400]


def test_opened_segments_are_counted(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsspec_kbs.store.backup import KbsBackup

    opened: list[str] = []
    real = KbsBackup.read_segment  # what readers read whole segments with

    def spy(self, ref):  # type: ignore[no-untyped-def]
        opened.append(ref.name)
        return real(self, ref)

    monkeypatch.setattr(KbsBackup, "read_segment", spy)
    fsspec_kbs.read_table(url, topics="user.events-v2")
    assert opened == ["segment-00000000.kbs"]


def test_columns_and_expression(url: str, expected: list[dict]) -> None:
    t = fsspec_kbs.read_table(url, columns=["offset", "key"], filter=pc.field("value").is_null())
    assert t.schema.names == ["offset", "key"]
    assert t.num_rows == sum(1 for r in expected if r["value"] is None) > 0


def test_count_rows_from_manifest_and_with_filters(url: str, expected: list[dict]) -> None:
    ds = fsspec_kbs.KbsDataset.open(url)
    assert ds.count_rows() == len(expected)
    assert ds.filter(start_time=1_700_000_100_000).count_rows() == sum(
        1 for r in expected if r["timestamp"] >= 1_700_000_100_000)


def test_stream_in_order_single_and_threaded(url: str, expected: list[dict]) -> None:
    for threads in (False, True):
        batches = list(fsspec_kbs.KbsDataset.open(url).to_batches(batch_size=64, use_threads=threads))
        keys = [(r["topic"], r["partition"], r["offset"]) for b in batches for r in b.to_pylist()]
        assert keys == [(r["topic"], r["partition"], r["offset"]) for r in expected]
        assert max(b.num_rows for b in batches) <= 64


def test_to_millis_forms() -> None:
    import datetime as dt

    assert to_millis("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert to_millis(dt.datetime(2023, 11, 14, 22, 13, 20)) == 1_700_000_000_000
    assert to_millis("1700000000000") == 1_700_000_000_000
    # The relative forms of the CLI work in the API too; an ambiguous date is still an error.
    assert to_millis("yesterday") % 86_400_000 == 0
    with pytest.raises(ValueError):
        to_millis("01/02/2026")


def test_scan_filter_and() -> None:
    a = ScanFilter.make(topics=["a", "b"], start_offset=5)
    b = ScanFilter.make(topics="b", start_offset=3, end_offset=9)
    c = a.and_(b)
    assert c.topics == frozenset({"b"}) and (c.start_offset, c.end_offset) == (5, 9)


def test_unknown_column_is_an_error(url: str) -> None:
    with pytest.raises(ValueError, match="unknown column"):
        fsspec_kbs.read_table(url, columns=["nope"])


def test_empty_result_keeps_schema(url: str) -> None:
    t = fsspec_kbs.read_table(url, topics="missing-topic")
    assert t.num_rows == 0 and t.schema == fsspec_kbs.KAFKA_SCHEMA
    assert isinstance(fsspec_kbs.open_reader(url, topics="missing-topic"), pa.RecordBatchReader)


def test_reading_does_not_import_pandas(url: str) -> None:
    """Importing pandas costs a reader ~35 MB of RSS; Arrow output must not pull it in."""
    import subprocess
    import sys

    code = (
        "import sys, fsspec_kbs\n"
        f"url = {url!r}\n"
        "n = fsspec_kbs.read_table(url, start_offset=10).num_rows\n"
        "n += sum(b.num_rows for b in fsspec_kbs.KbsDataset.open(url).to_batches(binary_view=True))\n"
        "print(n, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    rows, pandas_loaded = out.stdout.split()
    assert int(rows) > 0 and pandas_loaded == "False"
