"""oso-native backups through the Spark data source and the ``kbs`` fsspec protocol.

Nothing here says "oso": both entry points must detect the layout through ``open_backup``.
"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from tests.conftest import load_expected
from tests.oso.helpers import CODECS, copy_vector, segment_files, vector

pytestmark = pytest.mark.conformance


@pytest.mark.parametrize("codec", CODECS)
def test_kbs_protocol_views_and_raw_segments(conformance: Path, codec: str) -> None:
    pytest.importorskip("fsspec_kbs.fs")
    src = vector(conformance, codec)
    expected = [json.loads(x) for x in (src.parent / "expected.jsonl").read_text().splitlines()]
    fs = fsspec.filesystem("kbs", fo=str(src))
    parts = sorted({(r["topic"], r["partition"]) for r in expected})
    assert sorted(fs.ls("", detail=False)) == sorted(["manifest.json", *{t for t, _ in parts}])
    got = []
    for topic, p in parts:
        with fs.open(f"{topic}/{p}/records.jsonl", "rt") as f:
            got += [json.loads(line) for line in f.read().splitlines()]
    assert got == expected
    # raw segment files are served as stored
    seg = segment_files(src)[0]
    listed = fs.ls("audit.log/0", detail=False)
    assert f"audit.log/0/{seg.name}" in listed
    assert fs.cat(f"audit.log/0/{seg.name}") == seg.read_bytes()
    # chained URL, as users write it
    with fsspec.open(f"kbs::{src}/orders/2/records.jsonl", "rt") as f:
        assert [json.loads(x) for x in f.read().splitlines()] == [
            r for r in expected if (r["topic"], r["partition"]) == ("orders", 2)]


def test_kbs_protocol_parquet_view(conformance: Path) -> None:
    pytest.importorskip("fsspec_kbs.fs")
    import pyarrow.parquet as pq

    from tests.conftest import table_rows

    src = vector(conformance, "lz4")
    fs = fsspec.filesystem("kbs", fo=str(src))
    with fs.open("orders/0/records.parquet", "rb") as f:
        table = pq.read_table(f)
    want = [r for r in load_expected(src.parent / "expected.jsonl") if (r["topic"], r["partition"]) == ("orders", 0)]
    assert table_rows(table) == want


def test_kbs_protocol_corrupt_segment_names_file(conformance: Path, tmp_path: Path) -> None:
    pytest.importorskip("fsspec_kbs.fs")
    from fsspec_kbs.errors import ChecksumError

    backup = copy_vector(conformance, "zstd", tmp_path)
    seg = segment_files(backup)[0]
    data = bytearray(seg.read_bytes())
    data[50] ^= 1
    seg.write_bytes(bytes(data))
    fs = fsspec.filesystem("kbs", fo=str(backup))
    with pytest.raises(ChecksumError, match=seg.name), fs.open("audit.log/0/records.jsonl", "rt") as f:
        f.read()


@pytest.mark.spark
@pytest.mark.parametrize("codec", CODECS)
def test_spark_reads_oso_vectors(spark, conformance: Path, codec: str) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    from tests.spark.helpers import df_rows

    src = vector(conformance, codec)
    expected = load_expected(src.parent / "expected.jsonl")
    df = spark.read.format("kbs").load(str(src))
    assert df_rows(df) == expected
    sel = df.where((F.col("topic") == "orders") & (F.col("partition") == 0) & (F.col("offset") >= 400))
    assert df_rows(sel) == [r for r in expected
                            if (r["topic"], r["partition"]) == ("orders", 0) and r["offset"] >= 400]


@pytest.mark.spark
def test_spark_prunes_oso_segments_on_offsets(spark, conformance: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A corrupt segment outside the offset range is never opened."""
    from pyspark.sql import functions as F

    from tests.spark.helpers import df_rows

    backup = copy_vector(conformance, "zstd", tmp_path)
    first_orders = segment_files(backup)[1]  # orders/0, offsets 1…383
    first_orders.write_bytes(b"XBAK" + first_orders.read_bytes()[4:])
    expected = load_expected(vector(conformance, "zstd").parent / "expected.jsonl")
    df = spark.read.format("kbs").load(str(backup))
    sel = df.where((F.col("topic") == "orders") & (F.col("partition") == 0) & (F.col("offset") >= 700))
    assert df_rows(sel) == [r for r in expected
                            if (r["topic"], r["partition"]) == ("orders", 0) and r["offset"] >= 700]
