"""Lazy scans of a backup as Arrow: dataset -> fragments (segments) -> scanner -> batches."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from fsspec_kbs.arrow.convert import bool_mask, columns_to_batch
from fsspec_kbs.arrow.schema import COLUMNS, project
from fsspec_kbs.errors import KbsError, SegmentFormatError
from fsspec_kbs.filters import ScanFilter, TimeLike, dnf_to_expression, dnf_to_scan_filter
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import Decoded
from fsspec_kbs.store import Backup, SegmentRef, open_backup
from fsspec_kbs.store.opened import OpenedSegment
from fsspec_kbs.store.segment_ref import Bounds
from fsspec_kbs.threads import run_in_order, worker_pool

_ROW_COLUMNS = ("offset", "timestamp")


#: Record data per decoded chunk (one Arrow batch before filtering). Small enough that the
#: chunks in flight stay a few tens of MB (with the thread pool, 2 MiB kept the peak RSS of a
#: 5 GB stream ~30 MB lower than 4 MiB at the same speed); large enough that per-chunk
#: overhead is noise (~1 % slower on one core than 4 MiB).
CHUNK_BYTES = 2 * 1024 * 1024


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class KbsDataset:
    """A backup seen as a table with the Kafka schema (see :data:`fsspec_kbs.KAFKA_SCHEMA`).

    Nothing is read until a terminal method (``to_table``, ``to_batches``, ``to_reader``,
    ``to_pandas``, ``count_rows``) runs, and only segments that can match the filters are
    opened.

    Examples
    --------
    >>> ds = KbsDataset.open("s3://bucket/backups/backup-1", storage_options={...})  # doctest: +SKIP
    >>> ds.filter(topics="orders", start_time="2026-11-01").to_pandas()  # doctest: +SKIP
    """

    def __init__(self, backup: Backup, scan_filter: ScanFilter | None = None) -> None:
        self.backup = backup
        self.scan_filter = scan_filter or ScanFilter()

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, allow_incomplete: bool = False) -> KbsDataset:
        """Open a backup directory on any fsspec URL (the layout is detected)."""
        return cls(open_backup(url, storage_options, allow_incomplete=allow_incomplete))

    @property
    def schema(self) -> pa.Schema:
        return project(None)

    def filter(
        self,
        topics: str | Iterable[str] | None = None,
        partitions: int | Iterable[int] | None = None,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: TimeLike | None = None,
        end_time: TimeLike | None = None,
        topic_pattern: str | None = None,
    ) -> KbsDataset:
        """A new dataset whose filters are these ANDed with the current ones.

        Offsets and times: start inclusive, end exclusive. Times are Unix ms, datetimes or
        ISO-8601 strings.
        """
        more = ScanFilter.make(topics, partitions, start_offset, end_offset, start_time, end_time, topic_pattern)
        return KbsDataset(self.backup, self.scan_filter.and_(more))

    def fragments(self, scan_filter: ScanFilter | None = None) -> list[SegmentRef]:
        """The segments a scan would open, decided from the manifest.

        Segments of the wanted partitions that the offset bounds prune have their header and
        footer read and compared with the manifest (:meth:`Backup.check_unread`): a
        manifest whose offsets lie raises instead of dropping rows.
        """
        sf = self.scan_filter if scan_filter is None else self.scan_filter.and_(scan_filter)
        wanted = [ref for ref in self.backup.segments() if sf.wants_partition(ref.topic, ref.partition)]
        if sf.start_time is not None or sf.end_time is not None:
            wanted = self.backup.check_time_bounds(wanted)  # batch indexes confirm what may prune
        kept, pruned = [], []
        for ref in wanted:
            (kept if sf.keeps(ref) else pruned).append(ref)
        self.backup.check_unread(pruned)
        return kept

    def scanner(
        self,
        columns: list[str] | None = None,
        filter: Any = None,
        batch_size: int | None = None,
        use_threads: bool = True,
        verify_checksums: bool = True,
        on_error: str = "raise",
        binary_view: bool = False,
    ) -> KbsScanner:
        """A lazy scan.

        Parameters
        ----------
        columns : list of str, optional
            Subset of the schema's columns, in this order.
        filter : pyarrow.compute.Expression or list of tuples, optional
            Row filter; DNF tuples ``[("offset", ">=", 10), ...]`` also prune segments.
        batch_size : int, optional
            Maximum rows per yielded batch.
        use_threads : bool, default True
            Decode on two threads: the chunks of consecutive segments go through one window
            of decode tasks, and segments are read ahead on reading threads.
        verify_checksums : bool, default True
            Check CRC-64 per segment and CRC-32 per batch.
        on_error : {"raise", "skip"}, default "raise"
            ``skip`` reports corrupt segments through :attr:`KbsScanner.errors` and goes on.
        binary_view : bool, default False
            Zero-copy output: ``key``, ``value`` and header values as ``binary_view``, header
            keys as ``string_view``, pointing into the decompressed batches instead of copies
            of them (see :data:`~fsspec_kbs.arrow.schema.KAFKA_VIEW_SCHEMA`). Faster and the
            same memory while streaming, but a batch keeps its whole chunk's decompressed
            batches (~2 MB) alive while any row of it is. Arrow's compute functions do not all
            take views yet (``filter``/``take`` do not): a ``filter`` expression makes the
            scan decode copies and cast its result to views.
        """
        return KbsScanner(self, columns, filter, batch_size, use_threads, verify_checksums, on_error,
                          binary_view)

    def to_batches(self, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        return self.scanner(**kwargs).to_batches()

    def to_reader(self, **kwargs: Any) -> pa.RecordBatchReader:
        return self.scanner(**kwargs).to_reader()

    def to_table(self, **kwargs: Any) -> pa.Table:
        return self.scanner(**kwargs).to_table()

    def to_pandas(self, **kwargs: Any) -> Any:
        return self.to_table(**kwargs).to_pandas()

    def count_rows(self, **kwargs: Any) -> int:
        return self.scanner(**kwargs).count_rows()

    # -- Arrow interchange (appended: the Arrow PyCapsule stream protocol) --
    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """Arrow PyCapsule stream: ``duckdb.sql("select * from ds")``, ``polars.from_arrow(ds)``,
        ``pa.RecordBatchReader.from_stream(ds)`` read the dataset directly (one scan per call)."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_pyarrow_dataset(self, **kwargs: Any) -> Any:
        """A one-shot ``pyarrow.dataset`` (a scan of this dataset), for APIs that take one;
        ``kwargs`` go to :meth:`scanner`."""
        return self.scanner(**kwargs).to_pyarrow_dataset()


class KbsScanner:
    """Reads the segments a dataset selects, in (topic, partition, offset) order."""

    def __init__(self, dataset: KbsDataset, columns: list[str] | None, filter: Any, batch_size: int | None,
                 use_threads: bool, verify_checksums: bool, on_error: str, binary_view: bool = False) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError("on_error must be 'raise' or 'skip'")
        self.dataset = dataset
        self.columns = list(COLUMNS) if columns is None else list(columns)
        self.views = binary_view
        self.out_schema = project(self.columns, binary_view)
        sf = dataset.scan_filter
        self.expression = None
        if isinstance(filter, list):
            sf = sf.and_(dnf_to_scan_filter(filter))
            self.expression = dnf_to_expression(filter)
        elif filter is not None:
            self.expression = filter
        self.scan_filter = sf
        self.batch_size = batch_size
        self.use_threads = use_threads
        self.verify = verify_checksums
        self.on_error = on_error
        self.errors: list[Exception] = []
        # Expressions may reference any column: decode those too and drop them afterwards.
        self._decode_columns = self.columns if self.expression is None else list(COLUMNS)

    @property
    def fragments(self) -> list[SegmentRef]:
        return self.dataset.fragments(self.scan_filter)

    @property
    def _views(self) -> bool:
        # Expressions run on the copied layout (Arrow's filter does not take views yet); the
        # result is cast to views, which points into its buffers.
        return self.views and self.expression is None

    def _batch_of(self, ref: SegmentRef, cols: RecordColumns | ViewColumns) -> pa.RecordBatch | None:
        """One decoded chunk as a filtered Arrow batch (None when no row is left)."""
        mask = self.scan_filter.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
        if mask is not None and isinstance(cols, ViewColumns):
            cols, mask = cols.filter(mask), None
        batch = columns_to_batch(cols, ref.topic, ref.partition, self._decode_columns, ref.path, views=self._views)
        if mask is not None:
            batch = batch.filter(bool_mask(mask))
        if self.expression is not None:
            batch = batch.filter(self.expression).select(self.columns)
            if self.views:
                batch = batch.cast(self.out_schema)
        return batch if batch.num_rows else None

    def _iter_segment(self, ref: SegmentRef) -> Iterator[pa.RecordBatch]:
        """Filtered Arrow batches of one segment, one per decoded chunk, on this thread alone."""
        for cols in self.dataset.backup.iter_columns(ref, verify_checksums=self.verify, max_chunk_bytes=CHUNK_BYTES,
                                                     views=self._views, threads=1, bounds=self._bounds(ref)):
            batch = self._batch_of(ref, cols)
            if batch is not None:
                yield batch

    def _bounds(self, ref: SegmentRef) -> Bounds:
        """What of ``ref`` the scan wants: batches outside it need not be read (batch index)."""
        return self.scan_filter.segment_bounds(ref)

    def _read_segment(self, ref: SegmentRef) -> list[pa.RecordBatch]:
        return list(self._iter_segment(ref))

    def _guarded(self, ref: SegmentRef) -> Iterator[pa.RecordBatch]:
        if self.on_error == "raise":
            # Stream: memory stays at a few chunks per worker, whatever the segment size.
            yield from self._iter_segment(ref)
            return
        try:
            # Skipping must drop a corrupt segment whole, so its batches wait for its end.
            batches = self._read_segment(ref)
        except KbsError as e:
            self.errors.append(e)
            return
        yield from batches

    def _segment_batches(self) -> Iterator[pa.RecordBatch]:
        refs = self.fragments
        if self.use_threads:
            yield from self._pipelined(refs)
        else:
            for ref in refs:
                yield from self._guarded(ref)
        if not self.errors:
            self.dataset.backup.check_totals()  # a no-op unless every segment was read whole

    def _pipelined(self, refs: list[SegmentRef]) -> Iterator[pa.RecordBatch]:
        """Every segment's chunks through one window of decode tasks (``run_in_order``).

        The decoding threads go from one segment's chunks to the next's without waiting, and
        also build each chunk's Arrow batch; this thread only runs the in-order checks and
        hands the batches on. Segments are opened ahead (:func:`opened_ahead`). Errors are
        those of :meth:`Backup.iter_columns`, raised or (``on_error="skip"``) collected
        in segment order.
        """
        skip = self.on_error == "skip"
        for (state, what), result in run_in_order(self._pipeline_tasks(refs)):
            if state.failed:
                continue
            try:
                if isinstance(what, _Failure):
                    raise what.error
                if isinstance(result, _Failure):
                    raise result.error
                assert state.opened is not None
                if what is _END:
                    state.opened.finish()
                    yield from state.kept
                    continue
                decoded, batch = result
                state.opened.accept(what, decoded)
                if batch is not None:
                    if skip:  # a corrupt segment is dropped whole, so its batches wait for its end
                        state.kept.append(batch)
                    else:
                        yield batch
            except KbsError as e:
                error = self._diagnosed(state.ref, e)
                if not skip:
                    raise error from None
                self.errors.append(error)
                state.failed = True
                state.kept.clear()

    def _pipeline_tasks(self, refs: list[SegmentRef]) -> Iterator[tuple[tuple[_Segment, Any], Callable[[], Any] | None]]:
        """((segment state, chunk group), decode task) for every chunk of every segment, then
        (state, ``_END``); a segment that fails to open or plan gives (state, its failure)."""
        for ref, opening in opened_ahead(self.dataset.backup, refs, self.verify, default_workers(), self._bounds):
            state = _Segment(ref)
            try:
                state.opened = opening.result()
                with state.opened:  # a stream's file is done with once its tasks are out
                    for group, decode in state.opened.decode_tasks(CHUNK_BYTES, self._views):
                        if state.failed:
                            break
                        yield (state, group), self._decode_task(ref, decode)
            except Exception as e:
                yield (state, _Failure(e)), None
            yield (state, _END), None

    def _decode_task(self, ref: SegmentRef, decode: Callable[[], Decoded]) -> Callable[[], Any]:
        """A task decoding one chunk group and building its Arrow batch on a decoding thread."""
        def run() -> Any:
            try:
                decoded = decode()
                return decoded, self._batch_of(ref, decoded[0])
            except Exception as e:  # raised by the consumer, in order, as its segment's error
                return _Failure(e)
        return run

    def _diagnosed(self, ref: SegmentRef, error: KbsError) -> KbsError:
        """The error to report for ``ref``: a format error re-diagnosed by the layout (e.g. a
        segment replaced since the manifest), else ``error`` itself."""
        if isinstance(error, SegmentFormatError):
            try:
                self.dataset.backup.rediagnose(ref, self.verify, error)
            except KbsError as diagnosed:
                return diagnosed
        return error

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self._segment_batches():
            if self.batch_size is None or batch.num_rows <= self.batch_size:
                yield batch
            else:
                for start in range(0, batch.num_rows, self.batch_size):
                    yield batch.slice(start, self.batch_size)

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.out_schema, self.to_batches())

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), schema=self.out_schema)

    def count_rows(self) -> int:
        """Rows the scan yields, counted by decoding them: the manifest's record counts are
        claims, and a count fails where a read of the same rows would."""
        return sum(b.num_rows for b in self.to_batches())

    # -- Arrow interchange (appended: the Arrow PyCapsule stream protocol) --
    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """Arrow PyCapsule stream of this scan (see :meth:`KbsDataset.__arrow_c_stream__`)."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_pyarrow_dataset(self) -> Any:
        """This scan as a one-shot ``pyarrow.dataset.Dataset`` (it can be scanned once)."""
        import pyarrow.dataset as pads

        return pads.dataset(self.to_reader())


_END = object()  # a segment's last task is behind: run its end checks


class _Failure:
    """A decode task's error, returned as its result: ``run_in_order`` would raise its own
    ``_Raised`` at once, without the key that says which segment failed (skip mode needs it)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Segment:
    """A segment's place in a pipelined scan."""

    def __init__(self, ref: SegmentRef) -> None:
        self.ref = ref
        self.opened: OpenedSegment | None = None
        self.failed = False
        self.kept: list[pa.RecordBatch] = []


def opened_ahead(backup: Backup, refs: list[SegmentRef], verify: bool, workers: int,
                 bounds: Callable[[SegmentRef], Bounds] | None = None) -> Iterator[tuple[SegmentRef, cf.Future]]:
    """Each ref with the future of :meth:`Backup.open_chunks`, in order, opening up to
    ``workers`` ahead of the one being read, on ``workers`` threads (parallel reads for remote
    stores).

    A KBS segment opened ahead is held whole only when below ``KbsBackup.stream_min_bytes``
    (4 MiB): the segments held ahead stay below ``workers * 4 MiB`` (an OSO segment is one
    compressed unit, decoded whole).
    """
    pool = worker_pool("io", workers)
    ahead: deque[tuple[SegmentRef, cf.Future]] = deque()
    it = iter(refs)
    try:
        while True:
            for ref in it:
                ahead.append((ref, pool.submit(functools.partial(backup.open_chunks, ref, verify,
                                                                 bounds and bounds(ref)))))
                if len(ahead) >= workers:
                    break
            if not ahead:
                return
            yield ahead.popleft()
    finally:
        for _ref, fut in ahead:
            if not fut.cancel() and fut.exception() is None:
                fut.result().close()  # a stream opened ahead and never read
