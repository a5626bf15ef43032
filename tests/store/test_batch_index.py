"""Batch indexes on filesystems: reading an index, and reading batches through it (memory://
and local), against filtering a full read; lying and damaged indexes; bytes fetched."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from fsspec_kbs.arrow.convert import columns_to_batch
from fsspec_kbs.errors import BatchIndexError, ChecksumError, SegmentMismatchError
from fsspec_kbs.format import (
    Codec,
    RecordColumns,
    SegmentReader,
    ViewColumns,
    compress_batch,
    encode_batches,
)
from fsspec_kbs.format.batch_index import (
    ENTRY_DTYPE,
    INDEX_HEADER_SIZE,
    assemble_indexed_segment,
    encode_index,
)
from fsspec_kbs.store.batch_index import index_path, read_batches, read_index
from tests.format.test_batch_index import random_columns

CODECS = [Codec.NONE, Codec.LZ4, Codec.ZSTD]


def rows(cols: RecordColumns | ViewColumns, mask: np.ndarray | None = None) -> list[dict]:
    out = columns_to_batch(cols, "t", 0, views=isinstance(cols, ViewColumns)).to_pylist()
    return out if mask is None else [r for r, keep in zip(out, mask, strict=True) if keep]


def query_mask(cols: RecordColumns | ViewColumns, q: tuple[int | None, ...]) -> np.ndarray:
    so, eo, st, et = q
    off, ts = np.asarray(cols.offsets), np.asarray(cols.timestamps)
    m = np.ones(len(off), bool)
    if so is not None:
        m &= off >= so
    if eo is not None:
        m &= off < eo
    if st is not None:
        m &= ts >= st
    if et is not None:
        m &= ts < et
    return m


@pytest.fixture(params=["memory", "local"])
def fs_root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[fsspec.AbstractFileSystem, str]]:
    if request.param == "memory":
        fs = fsspec.filesystem("memory")
        root = f"/idx-{uuid.uuid4().hex}"
        yield fs, root
        fs.rm(root, recursive=True)
    else:
        yield fsspec.filesystem("file"), str(tmp_path)


def write(fs: fsspec.AbstractFileSystem, root: str, codec: Codec, cols: RecordColumns,
          batch_bytes: int = 2000) -> tuple[str, bytes, bytes]:
    seg, _, idx = assemble_indexed_segment([compress_batch(b, codec) for b in encode_batches(cols, batch_bytes)],
                                           codec)
    path = f"{root}/topics/t/0/segment-00000000.kbs"
    fs.makedirs(f"{root}/topics/t/0", exist_ok=True)
    fs.pipe_file(path, seg)
    fs.pipe_file(index_path(path), idx)
    return path, seg, idx


def test_index_path() -> None:
    assert index_path("s3://b/x/topics/t/0/segment-00000012.kbs") == "s3://b/x/topics/t/0/segment-00000012.index"
    with pytest.raises(ValueError):
        index_path("x/segment-00000012.index")


def test_read_index_absent_damaged_and_lying(fs_root: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = fs_root
    path, seg, idx = write(fs, root, Codec.ZSTD, random_columns(1, 800))
    found = read_index(fs, path, len(seg), zlib.crc32(idx))
    assert found.index is not None and found.reason is None and len(found.index) > 10
    assert read_index(fs, path, len(seg)).index is not None  # 1.2 manifests may omit index_crc32

    none, why = read_index(fs, path, len(seg), zlib.crc32(idx) ^ 1)
    assert none is None and "manifest" in (why or "")
    bad = bytearray(idx)
    bad[100] ^= 1
    fs.pipe_file(index_path(path), bytes(bad))
    none, why = read_index(fs, path, len(seg))
    assert none is None and "CRC-32" in (why or "") and path in (why or "") and index_path(path) in (why or "")

    # Structurally wrong, CRCs recomputed (a writer's bug): corruption, not a fallback.
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE).copy()
    e["position"][3] = e["position"][2]
    lie = encode_index(e)
    fs.pipe_file(index_path(path), lie)
    with pytest.raises(BatchIndexError, match="too short") as err:
        read_index(fs, path, len(seg), zlib.crc32(lie))
    assert path in str(err.value) and index_path(path) in str(err.value)

    fs.rm(index_path(path))
    none, why = read_index(fs, path, len(seg), zlib.crc32(idx))
    assert none is None and "no batch index" in (why or "")


QUERIES = [
    (None, None, None, None),
    ("o", 0.10, None, None),
    ("o", 0.005, None, None),
    ("t", 0.05, None, None),
    ("ot", 0.3, None, None),
    ("first", None, None, None),
    ("last", None, None, None),
    ("none", None, None, None),
]


def concrete(kind: object, frac: object, cols: RecordColumns) -> tuple[int | None, ...]:
    off, ts = cols.offsets, cols.timestamps
    o0, o1, t0, t1 = int(off[0]), int(off[-1]), int(ts.min()), int(ts.max())
    if kind is None:
        return (None, None, None, None)
    if kind == "o":
        s = o0 + (o1 - o0) // 3
        return (s, s + max(1, int((o1 - o0) * frac)), None, None)  # type: ignore[operator]
    if kind == "t":
        s = t0 + (t1 - t0) // 2
        return (None, None, s, s + max(1, int((t1 - t0) * frac)))  # type: ignore[operator]
    if kind == "ot":
        return (o0 + (o1 - o0) // 4, o0 + 3 * (o1 - o0) // 4, t0 + (t1 - t0) // 3, t0 + 2 * (t1 - t0) // 3)
    if kind == "first":
        return (None, o0 + 1, None, None)
    if kind == "last":
        return (o1, None, None, None)
    return (o1 + 1, None, None, None)  # nothing


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("threads", [1, 2])
def test_reads_through_index_equal_filtered_full_read(fs_root: tuple[fsspec.AbstractFileSystem, str],
                                                      codec: Codec, threads: int) -> None:
    fs, root = fs_root
    cols = random_columns(11, 4000)
    path, seg, idx = write(fs, root, codec, cols)
    index = read_index(fs, path, len(seg), zlib.crc32(idx)).index
    assert index is not None
    full = SegmentReader(seg, path).read_all()
    assert full is not None
    header_crc = SegmentReader(seg, path).header.checksum
    for kind, frac, _, _ in QUERIES:
        q = concrete(kind, frac, cols)
        runs = index.select(*q)
        got = list(read_batches(fs, path, index, runs, codec=codec, crc64=header_crc, threads=threads,
                                max_chunk_bytes=20_000, gap=0))
        got_rows = [r for c in got for r in rows(c, query_mask(c, q))]
        assert got_rows == rows(full, query_mask(full, q)), (kind, frac)
        if kind is None:
            assert sum(len(c) for c in got) == len(full)
    # Views, coalesced with a large gap.
    q = concrete("ot", 0.3, cols)
    got = list(read_batches(fs, path, index, index.select(*q), views=True, gap=10**9))
    assert all(isinstance(c, ViewColumns) for c in got)
    assert [r for c in got for r in rows(c, query_mask(c, q))] == rows(full, query_mask(full, q))


@pytest.mark.parametrize("field, delta", [("min_timestamp", +1), ("last_offset", -1), ("max_timestamp", -1)])
@pytest.mark.parametrize("codec", CODECS)
def test_lying_index_raises_never_returns_wrong_rows(fs_root: tuple[fsspec.AbstractFileSystem, str],
                                                     codec: Codec, field: str, delta: int) -> None:
    """An index whose entries lie, with every CRC (its own and the manifest's) recomputed."""
    fs, root = fs_root
    cols = random_columns(3, 3000)
    path, seg, idx = write(fs, root, codec, cols)
    e = np.frombuffer(idx, ENTRY_DTYPE, offset=INDEX_HEADER_SIZE).copy()
    i = len(e) // 2
    e[field][i] = int(e[field][i]) + delta
    lie = encode_index(e)
    fs.pipe_file(index_path(path), lie)
    index = read_index(fs, path, len(seg), zlib.crc32(lie)).index
    assert index is not None  # structurally valid: only reading the batch can tell
    # Every query that reads batch i fails, whatever else it reads: by offset (a lied-down last
    # offset does not hide the batch: selection uses base offsets) and by time.
    base = int(index.base[i])
    for q in [(base, base + 1, None, None), (int(index.last[i]) + 1, int(index.base[i + 1]) + 1, None, None),
              (None, None, int(index.min_ts[i]), int(index.min_ts[i]) + 1), (None, None, None, None)]:
        runs = index.select(*q)
        assert any(a <= i < b for a, b in runs), q
        with pytest.raises(BatchIndexError) as err:
            list(read_batches(fs, path, index, runs))
        assert path in str(err.value) and index_path(path) in str(err.value) and f"batch {i}" in str(err.value)


def test_segment_replaced_or_damaged(fs_root: tuple[fsspec.AbstractFileSystem, str]) -> None:
    fs, root = fs_root
    path, seg, idx = write(fs, root, Codec.ZSTD, random_columns(4, 2000))
    index = read_index(fs, path, len(seg)).index
    assert index is not None
    crc = SegmentReader(seg).header.checksum
    with pytest.raises(SegmentMismatchError, match="replaced"):
        list(read_batches(fs, path, index, [(3, 5)], crc64=crc ^ 1))
    with pytest.raises(SegmentMismatchError, match="codec"):
        list(read_batches(fs, path, index, [(3, 5)], codec=Codec.LZ4))
    bad = bytearray(seg)
    bad[int(index.position[4]) + 40] ^= 0x10
    fs.pipe_file(path, bytes(bad))
    assert len(list(read_batches(fs, path, index, [(0, 4)]))) == 1  # batches before it are fine
    with pytest.raises(ChecksumError, match="batch 4") as err:
        list(read_batches(fs, path, index, [(3, 5)]))
    assert index_path(path) in str(err.value)


class CountingFS(MemoryFileSystem):
    """memory:// counting the bytes and requests it serves."""

    bytes_read = 0
    requests = 0

    def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
        data = super().cat_file(path, start, end, **kwargs)
        CountingFS.bytes_read += len(data)
        CountingFS.requests += 1
        return data


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_bytes_read_for_one_percent_of_offsets(codec: Codec) -> None:
    fs = CountingFS(skip_instance_cache=True)
    root = f"/count-{uuid.uuid4().hex}"
    cols = random_columns(21, 40_000)
    path, seg, idx = write(fs, root, codec, cols, batch_bytes=4000)
    try:
        CountingFS.bytes_read = CountingFS.requests = 0
        lookup = read_index(fs, path, len(seg), zlib.crc32(idx))
        index = lookup.index
        assert index is not None and len(index) > 1000
        o0, o1 = int(cols.offsets[0]), int(cols.offsets[-1])
        start = o0 + (o1 - o0) // 2
        q = (start, start + (o1 - o0) // 100, None, None)
        got = list(read_batches(fs, path, index, index.select(*q)))
        # The batches holding a matching record, and their stored bytes.
        off = np.concatenate([c.offsets for c in got])
        full = SegmentReader(seg).read_all()
        assert full is not None
        m = query_mask(full, q)
        lo, hi = int(full.offsets[m][0]), int(full.offsets[m][-1])
        first = int(np.searchsorted(index.base, lo, "right")) - 1
        stop = int(np.searchsorted(index.base, hi, "right"))
        matching = index.stored_bytes([(first, stop)])
        assert off[0] <= lo and off[-1] >= hi
        print(f"\n{codec.name}: segment {len(seg)} B in {len(index)} batches; index {len(idx)} B; "
              f"matching batches {matching} B; read {CountingFS.bytes_read} B in {CountingFS.requests} requests")
        assert CountingFS.bytes_read <= 1.2 * matching + len(idx)
        assert CountingFS.requests == 4  # index; header, batches and footer (far apart: not coalesced)
        # Without the header (codec from the manifest): one request less, same rows.
        CountingFS.requests = 0
        again = list(read_batches(fs, path, index, index.select(*q), codec=codec, read_header=False))
        assert CountingFS.requests == 1 and [rows(c) for c in again] == [rows(c) for c in got]
        CountingFS.requests = 0
        assert list(read_batches(fs, path, index, [])) == [] and CountingFS.requests == 0
    finally:
        fs.rm(root, recursive=True)
