"""``kbs://`` over moto S3 (a real S3 server on loopback, spoken to by s3fs)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import fsspec_kbs
from fsspec_kbs.errors import BackupNotFoundError
from fsspec_kbs.fs import KbsFileSystem
from tests.conftest import load_expected, table_rows
from tests.fs.helpers import expected_jsonl, sample_table

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_backup(s3_root: str, s3_storage_options: dict) -> tuple[str, pa.Table]:
    table = sample_table(n=900, partitions=3)
    url = f"{s3_root}/backup-1"
    fsspec_kbs.write_table(url, table, storage_options=s3_storage_options, segment_max_records=100)
    return url, table


def test_filesystem_with_target_options(s3_backup: tuple[str, pa.Table], s3_storage_options: dict) -> None:
    url, table = s3_backup
    fs = fsspec.filesystem("kbs", fo=url, target_options=s3_storage_options)
    assert fs.ls("", detail=False) == ["manifest.json", "orders"]
    assert fs.ls("orders", detail=False) == ["orders/0", "orders/1", "orders/2"]
    listing = fs.ls("orders/0", detail=True)
    segments = [e for e in listing if e["kind"] == "segment"]
    assert len(segments) == 3 and [e["records"] for e in segments] == [100, 100, 100]
    target = fsspec.filesystem("s3", **s3_storage_options)
    for e in segments:
        assert e["size"] == target.size(e["target"])
        assert e["codec"] == "zstd" and e["min_timestamp"] <= e["max_timestamp"]
        assert fs.cat(e["name"]) == target.cat_file(e["target"])
        assert fs.cat_file(e["name"], start=0, end=4) == b"KBS1"
    assert json.loads(fs.cat("manifest.json"))["backup_id"] == "backup-1"
    assert fs.cat("orders/2/records.jsonl").decode() == expected_jsonl(table, "orders", 2)
    assert fs.glob("*/*/records.parquet") == [f"orders/{p}/records.parquet" for p in range(3)]


def test_chained_urls_on_s3(s3_backup: tuple[str, pa.Table], s3_storage_options: dict) -> None:
    url, table = s3_backup
    expected = expected_jsonl(table, "orders", 1)
    for chained in (f"kbs::{url}/orders/1/records.jsonl", f"kbs://orders/1/records.jsonl::{url}"):
        with fsspec.open(chained, "rt", s3=s3_storage_options) as f:
            assert f.read() == expected
    fs, path = fsspec.url_to_fs(f"kbs::{url}", s3=s3_storage_options)
    assert isinstance(fs, KbsFileSystem) and fs.ls(path, detail=False) == ["manifest.json", "orders"]


def test_pandas_and_pyarrow_on_s3(s3_backup: tuple[str, pa.Table], s3_storage_options: dict) -> None:
    pd = pytest.importorskip("pandas")
    url, table = s3_backup
    # kbs:// with the backup in fo: pandas < 3 does not take chained kbs:: URLs.
    df = pd.read_json("kbs://orders/0/records.jsonl", lines=True, dtype=False, convert_dates=False,
                      storage_options={"fo": url, "target_options": s3_storage_options})
    want = [json.loads(line) for line in expected_jsonl(table, "orders", 0).splitlines()]
    assert df["offset"].tolist() == [r["offset"] for r in want]
    assert df["timestamp"].tolist() == [r["timestamp"] for r in want]
    assert [None if pd.isna(k) else k for k in df["key"]] == [r["key"] for r in want]
    fs = fsspec.filesystem("kbs", fo=url, target_options=s3_storage_options)
    with fs.open("orders/0/records.parquet") as f:
        part0 = pq.read_table(f)
    assert table_rows(part0) == [r for r in table_rows(table) if r["partition"] == 0]
    ds = pads.dataset(fs.glob("orders/*/records.parquet"), filesystem=fs, format="parquet")
    assert table_rows(ds.to_table()) == table_rows(table)


@pytest.mark.conformance
def test_conformance_backup_uploaded_to_s3(conformance: Path, s3_root: str, s3_storage_options: dict) -> None:
    case = conformance / "valid" / "none-v1.0"  # a 1.0 manifest: sizes come from listing S3
    target = fsspec.filesystem("s3", **s3_storage_options)
    target.put(str(case / "backup-1"), f"{s3_root}/backup-1", recursive=True)
    fs = fsspec.filesystem("kbs", fo=f"{s3_root}/backup-1", target_options=s3_storage_options)
    for e in fs.ls("orders/1"):
        if e["kind"] == "segment":
            assert e["size"] == (case / "backup-1" / "topics" / "orders" / "1" / e["name"].rsplit("/", 1)[1]).stat().st_size
    ds = pads.dataset(fs.glob("*/*/records.parquet"), filesystem=fs, format="parquet")
    assert table_rows(ds.to_table()) == load_expected(case / "expected.jsonl")


def test_errors_on_s3(s3_backup: tuple[str, pa.Table], s3_root: str, s3_storage_options: dict) -> None:
    url, _ = s3_backup
    with pytest.raises(BackupNotFoundError):
        fsspec.filesystem("kbs", fo=f"{s3_root}/backup-2", target_options=s3_storage_options)
    with pytest.raises(FileNotFoundError):
        fsspec.open(f"kbs::{url}/orders/7/records.jsonl", s3=s3_storage_options).open()
    fs = fsspec.filesystem("kbs", fo=url, target_options=s3_storage_options)
    with pytest.raises(PermissionError, match="read-only"):
        fs.pipe("orders/0/x", b"x")
    with pytest.raises(PermissionError, match="read-only"):
        fsspec.open(f"kbs::{url}/orders/0/records.jsonl", "wb", s3=s3_storage_options).open()
    target = fsspec.filesystem("s3", **s3_storage_options)
    assert target.exists(f"{url}/manifest.json")  # nothing was touched
