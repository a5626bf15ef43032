"""A segment opened for decoding: decode tasks, then in-order checks against the manifest too."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from fsspec_kbs.errors import SegmentMismatchError
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import (
    BatchInfo,
    ChunkChecks,
    ChunkSource,
    Decoded,
    DecodeTask,
    iter_checked,
)
from fsspec_kbs.store.segment_ref import SegmentRef


class OpenedSegment(ChunkChecks):
    """One segment's decode tasks (:meth:`decode_tasks`, run on any thread) and the checks of
    their results, fed in order to :meth:`accept`; :meth:`finish` runs the end checks,
    including what the manifest says of the segment (records, first and last offset)."""

    def __init__(self, ref: SegmentRef, source: ChunkSource, file: IO[bytes] | None = None,
                 partial: bool = False, on_finish: Callable[[OpenedSegment], None] | None = None) -> None:
        super().__init__(source)
        self.ref = ref
        #: Only some batches are read (through the batch index): no whole-segment checks.
        self.partial = partial
        self._on_finish = on_finish
        self._file = file
        self.records = 0
        self.first: int | None = None
        self.last: int | None = None
        self.min_ts: int | None = None
        self.max_ts: int | None = None

    def decode_tasks(self, max_chunk_bytes: int, views: bool = False) -> Iterator[DecodeTask]:
        return self.source.decode_tasks(max_chunk_bytes, views)

    def accept(self, group: Sequence[BatchInfo], result: Decoded) -> RecordColumns | ViewColumns:
        cols = super().accept(group, result)
        if len(cols):
            if self.first is None:
                self.first = int(cols.offsets[0])
            self.last = int(cols.offsets[-1])
            self.records += len(cols)
            lo, hi = int(cols.timestamps.min()), int(cols.timestamps.max())
            self.min_ts = lo if self.min_ts is None else min(self.min_ts, lo)
            self.max_ts = hi if self.max_ts is None else max(self.max_ts, hi)
        return cols

    def finish(self) -> None:
        super().finish()
        if self.partial:
            return
        ref = self.ref
        for what, mine, theirs in (("records", self.records, ref.records), ("first offset", self.first, ref.first_offset),
                                   ("last offset", self.last, ref.last_offset),
                                   ("min timestamp", self.min_ts, ref.min_timestamp),
                                   ("max timestamp", self.max_ts, ref.max_timestamp)):
            if theirs is not None and mine is not None and mine != theirs:
                raise SegmentMismatchError(f"segment holds {what} {mine} but the manifest says {theirs}",
                                           ref.path, 0)
        if self._on_finish is not None:
            self._on_finish(self)

    @property
    def uncompressed_bytes(self) -> int:
        """Uncompressed size of the batches accepted so far (KBS batches; 0 for others)."""
        return sum(getattr(b, "uncompressed_size", 0) for g in self.groups for b in g)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> OpenedSegment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iter_opened(opened: OpenedSegment, max_chunk_bytes: int, views: bool = False,
                threads: int | None = None) -> Iterator[RecordColumns | ViewColumns]:
    """Decode an opened segment chunk by chunk (threads as ``run_in_order``), checked; then close it."""
    with opened:
        yield from iter_checked(opened.source, max_chunk_bytes, threads, views, opened)
