"""Lazy scans of a backup as Arrow: dataset -> fragments (segments) -> scanner -> batches."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from fsspec_kbs.arrow.convert import bool_mask, columns_to_batch
from fsspec_kbs.arrow.schema import COLUMNS, project
from fsspec_kbs.filters import ScanFilter, TimeLike, dnf_to_expression, dnf_to_scan_filter
from fsspec_kbs.format import ViewColumns
from fsspec_kbs.format.segment import decode_threads
from fsspec_kbs.store import KbsBackup, SegmentRef, open_backup

_ROW_COLUMNS = ("offset", "timestamp")


#: Record data per decoded chunk (one Arrow batch before filtering). Small enough that the
#: chunks in flight stay a few tens of MB (with the thread pool, 2 MiB kept the peak RSS of a
#: 5 GB stream ~30 MB lower than 4 MiB at the same speed); large enough that per-chunk
#: overhead is noise (~1 % slower on one core than 4 MiB).
CHUNK_BYTES = 2 * 1024 * 1024
#: Decoded chunks a segment's worker may hold ready ahead of the consumer.
CHUNK_QUEUE = 1
#: Compressed segment bytes held by the workers at once (a segment is read whole). A segment
#: larger than this still runs, alone; it then uses the cores through chunk-level decoding
#: (:meth:`fsspec_kbs.format.SegmentReader.iter_columns`), so both levels keep the cores busy.
SEGMENT_BUDGET = 96 * 1024 * 1024


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

    def __init__(self, backup: KbsBackup, scan_filter: ScanFilter | None = None) -> None:
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
        """The segments a scan would open, decided from the manifest only."""
        sf = self.scan_filter if scan_filter is None else self.scan_filter.and_(scan_filter)
        return [ref for ref in self.backup.segments() if sf.keeps(ref)]

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
            Decode several segments at once on a thread pool.
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

    def _iter_segment(self, ref: SegmentRef) -> Iterator[pa.RecordBatch]:
        """Filtered Arrow batches of one segment, one per decoded chunk, as they are decoded."""
        # Expressions run on the copied layout (Arrow's filter does not take views yet); the
        # result is cast to views, which points into its buffers.
        views = self.views and self.expression is None
        chunks = self.dataset.backup.iter_columns(ref, verify_checksums=self.verify,
                                                  max_chunk_bytes=CHUNK_BYTES, views=views)
        if not self.use_threads:
            with decode_threads(1):  # one thread means one: no chunk-level decoding pool either
                first = next(chunks, None)
            chunks = iter(() if first is None else itertools.chain([first], chunks))
        for cols in chunks:
            mask = self.scan_filter.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
            if mask is not None and isinstance(cols, ViewColumns):
                cols, mask = cols.filter(mask), None
            batch = columns_to_batch(cols, ref.topic, ref.partition, self._decode_columns, ref.path, views=views)
            if mask is not None:
                batch = batch.filter(bool_mask(mask))
            if self.expression is not None:
                batch = batch.filter(self.expression).select(self.columns)
                if self.views:
                    batch = batch.cast(self.out_schema)
            if batch.num_rows:
                yield batch

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
        except Exception as e:
            from fsspec_kbs.errors import KbsError

            if isinstance(e, KbsError):
                self.errors.append(e)
                return
            raise
        yield from batches

    def _segment_batches(self) -> Iterator[pa.RecordBatch]:
        refs = self.fragments
        if not self.use_threads or len(refs) < 2:
            for ref in refs:
                yield from self._guarded(ref)
            return
        sizes = [SEGMENT_BUDGET if ref.size_bytes is None else int(ref.size_bytes) for ref in refs]
        yield from ordered_stream(self._guarded, refs, default_workers(), CHUNK_QUEUE,
                                  sizes=sizes, budget=SEGMENT_BUDGET)

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
        if self.expression is None:
            total = 0
            for ref in self.fragments:
                s, e = self.scan_filter.bounds(ref.topic, ref.partition)
                inside = (
                    ref.records is not None
                    and (s is None or (ref.first_offset is not None and ref.first_offset >= s))
                    and (e is None or (ref.last_offset is not None and ref.last_offset < e))
                    and self.scan_filter.start_time is None and self.scan_filter.end_time is None
                )
                if not inside:
                    break
                total += ref.records  # type: ignore[operator]
            else:
                return total
        return sum(b.num_rows for b in self.to_batches())


_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Budget:
    """Admits items in their order while the sum of admitted sizes stays within ``limit``.

    An item is always admitted when nothing else is, so one larger than ``limit`` runs alone.
    Strict ticket order means a later item never takes budget an earlier one waits for.
    """

    def __init__(self, limit: int, stop: threading.Event) -> None:
        self.limit = limit
        self.used = 0
        self.next = 0
        self.stop = stop
        self.cv = threading.Condition()

    def acquire(self, ticket: int, size: int) -> bool:
        with self.cv:
            self.cv.wait_for(lambda: self.stop.is_set() or (
                ticket == self.next and (self.used == 0 or self.used + size <= self.limit)))
            if self.stop.is_set():
                return False
            self.used += size
            self.next += 1
            self.cv.notify_all()
            return True

    def release(self, size: int) -> None:
        with self.cv:
            self.used -= size
            self.cv.notify_all()

    def wake(self) -> None:
        with self.cv:
            self.cv.notify_all()


def ordered_stream(fn: Callable[[Any], Iterable[Any]], items: list, workers: int,
                   queue_size: int = CHUNK_QUEUE, sizes: list[int] | None = None,
                   budget: int | None = None) -> Iterator[Any]:
    """Concatenate ``fn(item)`` for each item, in order, running up to ``workers`` of them at once.

    Each item's outputs pass through a queue of ``queue_size``: a worker runs ahead of the
    consumer by at most that many outputs, then waits. At most ``workers + 1`` items are
    started and not yet consumed, and with ``sizes`` and ``budget`` the items being produced
    at once have sizes summing to at most ``budget`` (or are a single item). Memory is thus
    bounded by the producers' own state plus ``(workers + 1) * queue_size`` outputs, however
    long the items are.
    """
    stop = threading.Event()
    gate = _Budget(budget if budget is not None else 2**62, stop)
    sizes = sizes if sizes is not None else [0] * len(items)

    def put(q: queue.Queue, x: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run(ticket: int, item: Any, q: queue.Queue) -> None:
        if not gate.acquire(ticket, sizes[ticket]):
            return
        try:
            for x in fn(item):
                if not put(q, x):
                    return
        except BaseException as e:  # handed to the consumer, which raises it in order
            gate.release(sizes[ticket])
            put(q, _Failure(e))
            return
        gate.release(sizes[ticket])
        put(q, _DONE)

    with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kbs-read") as pool:
        window: deque[tuple[queue.Queue, cf.Future]] = deque()
        it = iter(enumerate(items))

        def submit() -> None:
            for ticket, item in it:
                q: queue.Queue = queue.Queue(maxsize=queue_size)
                window.append((q, pool.submit(run, ticket, item, q)))
                return

        try:
            for _ in range(workers + 1):
                submit()
            while window:
                q, _fut = window[0]
                x = q.get()
                if x is _DONE:
                    window.popleft()
                    submit()
                    continue
                if isinstance(x, _Failure):
                    raise x.error
                yield x
        finally:
            stop.set()
            gate.wake()
            for _q, f in window:
                f.cancel()
