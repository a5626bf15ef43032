"""Batch indexes on a filesystem (kbs-format.md §7): find, read and use a segment's
``segment-NNNNNNNN.index`` to fetch only the batches a query needs.

The format side (parsing, checks, selection, decoding) is :mod:`fsspec_kbs.format.batch_index`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import NamedTuple

import fsspec

from fsspec_kbs.errors import (
    BatchIndexDamagedError,
    BatchIndexError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.format.batch_index import (
    DEFAULT_GAP,
    INDEX_SUFFIX,
    BatchIndex,
    coalesce,
    decode_batches,
    parse_index,
)
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import HEADER_SIZE, SegmentHeader, run_in_order

SEGMENT_SUFFIX = ".kbs"


def index_path(segment_path: str) -> str:
    """The index file of a segment: same directory and stem, ``.index`` for ``.kbs``."""
    if not segment_path.endswith(SEGMENT_SUFFIX):
        raise ValueError(f"{segment_path} is not a segment file (*{SEGMENT_SUFFIX})")
    return segment_path[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX


class IndexLookup(NamedTuple):
    """What :func:`read_index` found: the index, or None and why it cannot be used."""

    index: BatchIndex | None
    reason: str | None = None


def read_index(fs: fsspec.AbstractFileSystem, segment_path: str, segment_size: int,
               expected_crc32: int | None = None) -> IndexLookup:
    """Read and check the index of the segment at ``segment_path`` (``segment_size`` bytes).

    ``expected_crc32`` is the manifest's ``index_crc32`` for the segment, if any. Returns
    ``(None, reason)`` when there is no index file or it cannot be used (damaged: a CRC-32
    does not match; unknown version): read the segment whole then, and let ``validate``
    report ``reason``. Raises :class:`~fsspec_kbs.errors.BatchIndexError` for an index whose
    CRCs match but whose entries break §7 (written wrong: corruption).
    """
    path = index_path(segment_path)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return IndexLookup(None, f"{path}: no batch index")
    try:
        return IndexLookup(parse_index(data, path, segment_path, segment_size, expected_crc32))
    except BatchIndexDamagedError as e:
        return IndexLookup(None, str(e))


def read_batches(fs: fsspec.AbstractFileSystem, segment_path: str, index: BatchIndex,
                 ranges: Sequence[tuple[int, int]], *, codec: Codec | None = None, crc64: int | None = None,
                 gap: int = DEFAULT_GAP, max_chunk_bytes: int = 32 * 1024 * 1024, views: bool = False,
                 threads: int | None = None, read_header: bool = True) -> Iterator[RecordColumns | ViewColumns]:
    """Fetch the batch runs ``ranges`` (from :meth:`BatchIndex.select`) of a segment and yield
    their records, decoded and checked (§7), in order: whole batches, not filtered to a query.

    All byte ranges, coalesced (``gap``), and the 32-byte segment header are fetched with one
    ``fs.cat_ranges`` call, so everything selected is in memory at once: for a selection
    near the whole segment, read the segment instead. The header gives the codec (which must
    equal ``codec`` when given) and its CRC-64 must equal ``crc64`` (the manifest's) when
    given: a segment replaced after its index was written is caught. The segment CRC-64
    itself cannot be checked without reading the whole segment; each batch's CRC-32 is.
    Runs are decoded in chunks of about ``max_chunk_bytes`` stored bytes (``threads`` as
    :func:`~fsspec_kbs.format.segment.run_in_order`). ``read_header=False`` (needs ``codec``)
    skips the header: one request less when the selection does not start near it, without
    the ``crc64`` and first-offset checks.
    """
    ip = index.index_path
    if not read_header and codec is None:
        raise ValueError("read_header=False needs the codec")
    chunks = _split(index, ranges, max_chunk_bytes)
    if not chunks:
        return
    head = [(0, HEADER_SIZE)] if read_header else []
    wanted = coalesce([*head, *index.byte_ranges(chunks)], gap)
    blobs = fs.cat_ranges([segment_path] * len(wanted), [s for s, _ in wanted], [e for _, e in wanted],
                          on_error="raise")
    for (s, e), blob in zip(wanted, blobs, strict=True):
        if len(blob) != e - s:
            raise TruncatedSegmentError(f"file ends at byte {s + len(blob)}, the batch index {ip} expects "
                                        f"{index.segment_size} bytes", segment_path, s + len(blob))
    if read_header:
        codec = _check_header(blobs[0][:HEADER_SIZE], segment_path, index, codec, crc64).codec
    assert codec is not None

    def tasks() -> Iterator[tuple[None, partial]]:
        k = 0
        for first, stop in chunks:
            pos = int(index.position[first])
            while wanted[k][1] <= pos:  # chunks and fetched ranges are both in file order
                k += 1
            start = wanted[k][0]
            yield None, partial(decode_batches, memoryview(blobs[k]), start, index, first, stop, codec, views)

    for _, cols in run_in_order(tasks(), threads):
        yield cols


def _check_header(data: bytes, segment_path: str, index: BatchIndex, codec: Codec | None,
                  crc64: int | None) -> SegmentHeader:
    """The segment header, checked against the caller's codec, CRC-64 and the index."""
    header = SegmentHeader.parse(data, segment_path)
    if codec is not None and header.codec != codec:
        raise SegmentMismatchError(f"segment codec is {header.codec.name}, expected {codec.name}", segment_path, 5)
    if crc64 is not None and header.checksum != crc64:
        raise SegmentMismatchError(
            f"header CRC-64 {header.checksum} differs from the manifest's {crc64} "
            "(the segment was replaced after the manifest was written)", segment_path, 24)
    if len(index) and header.first_offset != int(index.base[0]):
        raise BatchIndexError(f"header first offset {header.first_offset} but the index's first batch starts "
                              f"at {index.base[0]}", segment_path, 8, segment_path, index.index_path)
    return header


def _split(index: BatchIndex, runs: Sequence[tuple[int, int]], max_bytes: int) -> list[tuple[int, int]]:
    """``runs`` in file order, cut into chunks of whole batches of about ``max_bytes`` stored."""
    out: list[tuple[int, int]] = []
    prev = 0
    for first, stop in sorted(runs):
        if not 0 <= first < stop <= len(index) or first < prev:
            raise ValueError(f"batch run {first}:{stop} is empty, out of range or overlaps another")
        prev = stop
        a = first
        while a < stop:
            # First batch whose end reaches max_bytes past this chunk's start (at least one batch).
            b = int(index.end.searchsorted(index.position[a] + max_bytes, "left")) + 1
            b = min(max(b, a + 1), stop)
            out.append((a, b))
            a = b
    return out
