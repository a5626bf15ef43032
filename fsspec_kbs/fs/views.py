"""Helpers of :mod:`fsspec_kbs.fs`: decoded views of a partition and the file object serving them.

A view is produced from the segments of one partition:

* ``records.jsonl``: one JSON object per record, in offset order, exactly as ``kbs cat`` prints
  them (keys, values and header values base64, null as null). Generated lazily, one decoded
  chunk at a time, as the reader asks for bytes.
* ``records.parquet``: the partition in the Kafka Arrow schema, written whole when the file is
  opened (a Parquet footer comes last, so nothing can be read before the end is written).

Both land in a spooled temporary file (memory up to a limit, then disk), so the file object is
seekable and re-reading does not decode again.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsspec_kbs.arrow.jsonl import jsonl_lines
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.store import SegmentRef

#: Bytes a view keeps in memory before its spool file moves to disk.
DEFAULT_SPOOL_BYTES = 16 * 1024 * 1024

JSONL = "records.jsonl"
PARQUET = "records.parquet"
VIEWS = (JSONL, PARQUET)


# -- records.jsonl ---------------------------------------------------------------------------------

def jsonl_chunks(refs: Iterable[SegmentRef], iter_columns: Callable[[SegmentRef], Iterator[RecordColumns]],
                 rows_per_chunk: int = 4096) -> Iterator[bytes]:
    """``records.jsonl`` of the given segments, ``rows_per_chunk`` records at a time.

    Small chunks keep the first bytes quick and the text in memory small; a segment is still
    decoded (and its checksums verified) as a whole by ``iter_columns``.
    """
    for ref in refs:
        for cols in iter_columns(ref):
            for start in range(0, len(cols), rows_per_chunk):
                yield jsonl_lines(cols.slice(start, start + rows_per_chunk), ref.topic, ref.partition,
                                  path=ref.path)


# -- records.parquet -------------------------------------------------------------------------------

class _NoClose(io.RawIOBase):
    """Lets pyarrow's writer 'close' its sink without closing our spool file."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return self._target.write(b)

    def tell(self) -> int:
        return self._target.tell()

    def flush(self) -> None:
        self._target.flush()


def write_parquet(batches: Iterable[Any], schema: Any, spool: Any) -> None:
    """Write Arrow record batches as one Parquet file into ``spool`` (one row group per batch)."""
    import pyarrow.parquet as pq

    with pq.ParquetWriter(_NoClose(spool), schema, compression="zstd") as writer:
        for batch in batches:
            writer.write_batch(batch)


# -- the file object -------------------------------------------------------------------------------

class KbsViewFile(io.BufferedIOBase):
    """Read-only, seekable file over bytes produced by an iterator, spooled as they come.

    Bytes are generated only as far as a read (or a seek from the end) needs them. Generation
    errors (a corrupt segment) surface from the read that reaches them.

    Attributes
    ----------
    fs, path : the filesystem and path the file was opened from (fsspec convention).
    details : dict, the ``info()`` of the path when it was opened.
    """

    def __init__(self, fs: Any, path: str, chunks: Iterator[bytes] | None, details: dict,
                 spool_bytes: int = DEFAULT_SPOOL_BYTES, spool: Any = None,
                 on_complete: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.fs = fs
        self.path = path
        self.details = details
        self.mode = "rb"
        self._spool = spool if spool is not None else tempfile.SpooledTemporaryFile(max_size=spool_bytes)  # noqa: SIM115
        self._spool.seek(0, io.SEEK_END)
        self._filled = self._spool.tell()
        self._chunks = chunks
        self._pos = 0
        self._on_complete = on_complete
        if chunks is None and on_complete is not None:
            on_complete(self._filled)

    @property
    def name(self) -> str:
        return self.path

    @property
    def size(self) -> int:
        """Total size in bytes (generates the whole view)."""
        self._fill(None)
        return self._filled

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _fill(self, upto: int | None) -> None:
        """Generate until ``upto`` bytes exist (``None``: everything)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        while self._chunks is not None and (upto is None or self._filled < upto):
            chunk = next(self._chunks, None)
            if chunk is None:
                self._chunks = None
                if self._on_complete is not None:
                    self._on_complete(self._filled)
                break
            self._spool.seek(self._filled)
            self._spool.write(chunk)
            self._filled += len(chunk)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            self._fill(None)
            size = max(0, self._filled - self._pos)
        else:
            self._fill(self._pos + size)
        self._spool.seek(self._pos)
        data = self._spool.read(min(size, max(0, self._filled - self._pos)))
        self._pos += len(data)
        return data

    read1 = read

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        memoryview(b).cast("B")[: len(data)] = data
        return len(data)

    readinto1 = readinto

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            self._fill(None)
            pos = self._filled + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            if self._chunks is not None and hasattr(self._chunks, "close"):
                self._chunks.close()  # release the segment being decoded
            self._chunks = None
            self._spool.close()
        super().close()

    def __repr__(self) -> str:
        return f"<KbsViewFile {self.path!r}>"


# -- info() dicts ----------------------------------------------------------------------------------

def _min(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _max(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _sum(values: Iterable[int | None]) -> int | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def summary(refs: list[SegmentRef]) -> dict[str, Any]:
    """Offsets, counts and time range of some segments (None where the manifest does not say)."""
    return {
        "segments": len(refs),
        "records": _sum(r.records for r in refs),
        "first_offset": _min(r.first_offset for r in refs),
        "last_offset": _max(r.last_offset for r in refs),
        "min_timestamp": _min(r.min_timestamp for r in refs),
        "max_timestamp": _max(r.max_timestamp for r in refs),
    }


def segment_info(name: str, ref: SegmentRef, size: int | None, target: str) -> dict[str, Any]:
    return {
        "name": name, "type": "file", "size": size, "kind": "segment",
        "topic": ref.topic, "partition": ref.partition, "seq": ref.seq,
        "first_offset": ref.first_offset, "last_offset": ref.last_offset, "records": ref.records,
        "min_timestamp": ref.min_timestamp, "max_timestamp": ref.max_timestamp,
        "codec": ref.codec, "crc64": ref.crc64, "layout": ref.layout, "target": target,
    }


def view_info(name: str, view: str, topic: str, partition: int, refs: list[SegmentRef],
              size: int | None) -> dict[str, Any]:
    return {"name": name, "type": "file", "size": size, "kind": "view",
            "format": "jsonl" if view == JSONL else "parquet",
            "topic": topic, "partition": partition, **summary(refs)}
