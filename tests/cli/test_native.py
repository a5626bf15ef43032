"""The API feels native: Arrow streams, fsspec conventions, star import, no numba until a decode."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

import fsspec_kbs
from fsspec_kbs import KbsDataset, NoMatchWarning


@pytest.fixture(scope="module")
def backup(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("native") / "backup-1")
    t = pa.table({"topic": ["orders"] * 5 + ["payments"] * 3,
                  "partition": pa.array([0, 0, 1, 1, 1, 0, 0, 0], pa.int32()),
                  "value": [b"v%d" % i for i in range(8)]})
    fsspec_kbs.write_table(url, t)
    return url


def test_dataset_is_an_arrow_stream(backup: str) -> None:
    ds = KbsDataset.open(backup).filter(topics="orders")
    assert pa.RecordBatchReader.from_stream(ds).read_all().num_rows == 5
    assert pa.table(ds).num_rows == 5  # pyarrow takes any __arrow_c_stream__ object
    scanner = ds.scanner(columns=["partition", "offset"])
    assert pa.RecordBatchReader.from_stream(scanner).schema.names == ["partition", "offset"]
    assert ds.to_pyarrow_dataset(columns=["offset"]).to_table().num_rows == 5


def test_duckdb_and_polars_take_a_dataset(backup: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    ds = KbsDataset.open(backup)
    rows = duckdb.sql("select topic, count(*) from ds group by all order by 1").fetchall()
    assert rows == [("orders", 5), ("payments", 3)]
    reader = fsspec_kbs.open_reader(backup, columns=["offset"])  # noqa: F841 - duckdb finds it by name
    assert duckdb.sql("select count(*) from reader").fetchall() == [(8,)]
    df = pl.DataFrame(ds)
    assert df.shape == (8, 8) and df["topic"].to_list()[:1] == ["orders"]


def test_duckdb_reads_kbs_files(backup: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    fs = fsspec.filesystem("kbs", fo=backup)
    con = duckdb.connect()
    con.register_filesystem(fs)
    assert con.sql("select count(*) from read_json('kbs://orders/1/records.jsonl')").fetchall() == [(3,)]
    assert con.sql("select count(*) from read_parquet('kbs://*/*/records.parquet')").fetchall() == [(8,)]
    assert fs.modified("orders/0/records.jsonl").year >= 2025


def test_flat_storage_options_reach_the_target(backup: str) -> None:
    fs = fsspec.filesystem("kbs", fo=backup, auto_mkdir=True)
    assert fs.target.auto_mkdir is True
    fs = fsspec.filesystem("kbs", fo=backup, target_protocol="file", target_options={"auto_mkdir": True})
    assert fs.target.auto_mkdir is True and fs.ls("", detail=False)[0] == "manifest.json"


def test_kbs_urls_open_or_say_what_to_write(backup: str) -> None:
    with fsspec.open(f"kbs://{backup}/orders/0/records.jsonl", "rt") as f:  # kbs:///abs/path
        assert '"offset": 0' in f.readline()
    with pytest.raises(ValueError, match="kbs::"):
        fsspec.open("kbs://orders/0/records.jsonl").open()
    assert fsspec_kbs.read_table(f"kbs::{backup}").num_rows == 8
    assert fsspec_kbs.read_table(f"kbs://{backup}").num_rows == 8
    with pytest.raises(ValueError, match="backup's own URL"):
        fsspec_kbs.read_table("kbs://orders/0")


def test_filters_matching_nothing_warn(backup: str) -> None:
    with pytest.warns(NoMatchWarning, match="'ordrs' is not in"):
        assert fsspec_kbs.read_table(backup, topics="ordrs").num_rows == 0
    with pytest.warns(NoMatchWarning, match="partition 4"):
        fsspec_kbs.read_table(backup, topics="orders", partitions=4)
    with pytest.warns(NoMatchWarning, match="offsets"):
        fsspec_kbs.read_table(backup, start_offset=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fsspec_kbs.read_table(backup, topics="orders", partitions=1).num_rows == 3


def test_star_import_and_py_typed() -> None:
    space: dict = {}
    exec("from fsspec_kbs import *", space)
    assert all(name in space for name in fsspec_kbs.__all__)
    assert (Path(fsspec_kbs.__file__).parent / "py.typed").is_file()


def test_no_numba_until_the_first_decode(backup: str) -> None:
    code = ("import sys, fsspec_kbs, fsspec_kbs.cli.main; assert 'numba' not in sys.modules, 'import'; "
            f"fsspec_kbs.read_table({backup!r}); "
            "from fsspec_kbs.format import kernels; assert ('numba' in sys.modules) == kernels.JIT_ENABLED")
    subprocess.run([sys.executable, "-c", code], check=True)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fsspec_kbs.cli.main", "--help"],
                          capture_output=True, text=True, check=True)
    assert "numba" not in proc.stderr
