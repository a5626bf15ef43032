"""Zero-copy ``binary_view`` reads: the same rows as the default, as views into the batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import fsspec_kbs
from fsspec_kbs.arrow.convert import columns_to_batch
from fsspec_kbs.arrow.schema import KAFKA_SCHEMA, KAFKA_VIEW_SCHEMA
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.records import encode_batches
from fsspec_kbs.format.segment import SegmentReader, encode_segment
from tests.conftest import load_expected, table_rows
from tests.oso.helpers import vector

VALID = ["none-v1.0", "lz4-v1.1", "zstd-v1.1"]


@pytest.mark.parametrize("case", VALID)
def test_views_read_the_expected_rows(conformance: Path, case: str) -> None:
    url = str(conformance / "valid" / case / "backup-1")
    t = fsspec_kbs.read_table(url, binary_view=True)
    assert t.schema == KAFKA_VIEW_SCHEMA
    t.validate(full=True)
    assert table_rows(t) == load_expected(conformance / "valid" / case / "expected.jsonl")
    assert t.cast(KAFKA_SCHEMA).equals(fsspec_kbs.read_table(url))


def test_views_with_row_filters_and_expressions(conformance: Path) -> None:
    url = str(conformance / "valid" / "zstd-v1.1" / "backup-1")
    bounds = dict(topics="orders", start_offset=300, end_offset=800,
                  start_time=1_700_000_020_000, end_time=1_700_000_120_000)
    views = fsspec_kbs.read_table(url, binary_view=True, **bounds)
    plain = fsspec_kbs.read_table(url, **bounds)
    assert 50 < views.num_rows < 1000
    views.validate(full=True)
    assert views.cast(KAFKA_SCHEMA).equals(plain)
    expr = pc.field("offset") < 500
    views = fsspec_kbs.read_table(url, binary_view=True, filter=expr)
    assert views.schema == KAFKA_VIEW_SCHEMA
    assert views.cast(KAFKA_SCHEMA).equals(fsspec_kbs.read_table(url, filter=expr))
    some_key = plain.column("key").drop_null()[0]
    by_key = pc.field("key") == some_key
    assert fsspec_kbs.read_table(url, binary_view=True, filter=by_key).num_rows == \
        fsspec_kbs.read_table(url, filter=by_key).num_rows >= 1


def test_views_stream_in_small_batches_and_to_pandas(conformance: Path) -> None:
    url = str(conformance / "valid" / "lz4-v1.1" / "backup-1")
    reader = fsspec_kbs.open_reader(url, binary_view=True, batch_size=37, columns=["value", "headers", "offset"])
    batches = list(reader)
    assert reader.schema == pa.schema([KAFKA_VIEW_SCHEMA.field(c) for c in ("value", "headers", "offset")])
    assert all(b.num_rows <= 37 for b in batches) and len(batches) > 2
    streamed = pa.Table.from_batches(batches)
    assert streamed.column("value").type == pa.binary_view()
    df = streamed.to_pandas()
    whole = fsspec_kbs.read_table(url, columns=["value", "headers", "offset"]).to_pandas()
    assert df["value"].tolist() == whole["value"].tolist()
    # A record without headers is None (a null list), in both layouts.
    assert [None if h is None else list(h) for h in df["headers"]] == \
        [None if h is None else list(h) for h in whole["headers"]]
    assert any(h is None for h in whole["headers"])


def test_oso_backups_read_as_views(conformance: Path) -> None:
    url = str(vector(conformance, "zstd"))
    t = fsspec_kbs.read_table(url, binary_view=True)
    assert t.schema == KAFKA_VIEW_SCHEMA
    assert t.cast(KAFKA_SCHEMA).equals(fsspec_kbs.read_table(url))


def _cols(n: int, seed: int) -> RecordColumns:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        # Lengths around the 12-byte inline limit, nulls, and headers with null values.
        klen = int(rng.choice([0, 1, 4, 11, 12, 13, 40]))
        vlen = int(rng.choice([0, 3, 12, 13, 100, 3000]))
        recs.append({"offset": 10 + 2 * i, "timestamp": 1_700_000_000_000 + i,
                     "key": None if rng.random() < 0.1 else rng.bytes(klen),
                     "value": None if rng.random() < 0.1 else rng.bytes(vlen),
                     "headers": [(f"h{j}" * int(rng.integers(1, 8)), None if j == 1 else rng.bytes(j * 6))
                                 for j in range(int(rng.integers(0, 4)))]})
    return RecordColumns.from_records(recs)


@pytest.mark.parametrize("codec", list(Codec))
def test_views_point_into_the_batches(codec: Codec) -> None:
    cols = _cols(500, 3)
    data, _ = encode_segment(encode_batches(cols, 20_000), codec)
    chunks = list(SegmentReader(data).iter_columns(60_000, threads=1, views=True))
    assert len(chunks) > 2 and all(isinstance(c, ViewColumns) for c in chunks)
    batches = [columns_to_batch(c, "t", 0) for c in chunks]
    for b in batches:
        b.validate(full=True)
    t = pa.Table.from_batches(batches)
    # Long values are not copied: their views point into the chunks' decompressed batches.
    long_views = np.concatenate([c.value_views.view(np.int32).reshape(-1, 4) for c in chunks])
    assert (long_views[:, 0] > 12).sum() > 100
    assert t.cast(KAFKA_SCHEMA).to_pylist() == \
        columns_to_batch(cols, "t", 0).to_pylist()
    # Arrow needs the inline bytes after a short value zero-padded.
    short = long_views[(long_views[:, 0] <= 4)]
    assert (short[:, 2:] == 0).all() and len(short) > 10


def test_filter_keeps_the_right_rows_and_headers() -> None:
    cols = _cols(300, 5)
    data, _ = encode_segment(encode_batches(cols, 10_000), Codec.ZSTD)
    (views,) = SegmentReader(data).iter_columns(2**30, threads=1, views=True)
    mask = np.random.default_rng(1).random(len(views)) < 0.4
    got = columns_to_batch(views.filter(mask), "t", 0)
    got.validate(full=True)
    want = columns_to_batch(cols, "t", 0).filter(pa.array(mask))
    assert got.cast(want.schema).equals(want)


def test_example_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "zero_copy_views.py"
    res = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "binary_view=True   200000 rows" in res.stdout


def test_huge_record_count_is_an_error_not_an_allocation() -> None:
    """With checks off, a batch claiming 2^32-1 records is rejected by the scan; the views
    decoder sizes its arrays by what the batch can hold, not by the claim."""
    import struct

    from fsspec_kbs.errors import RecordFormatError
    from fsspec_kbs.format.segment import HEADER_SIZE

    data, _ = encode_segment(encode_batches(_cols(10, 1), 100_000), Codec.ZSTD)
    bad = bytearray(data)
    struct.pack_into("<Q", bad, 16, 2**32 - 1)  # segment header record count
    struct.pack_into("<I", bad, HEADER_SIZE + 8, 2**32 - 1)  # the batch's record count
    for views in (False, True):
        with pytest.raises(RecordFormatError, match="x.kbs"):
            list(SegmentReader(bytes(bad), "x.kbs", verify_checksums=False).iter_columns(views=views))
