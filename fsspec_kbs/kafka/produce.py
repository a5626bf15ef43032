"""The producing half of ``kbs restore``: decode ahead on a thread, produce in order, and know
what reached the target when it must stop."""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, repeat
from operator import length_hint
from typing import Any

import numpy as np

from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import KbsError


def offset_headers(style: str, offset: int, timestamp: int, partition: int) -> list[tuple[str, bytes]]:
    """Provenance headers added to a restored record (kbs-format.md §5 or OSO's binary form)."""
    if style == "kbs":
        return [("x-kafka-backup-offset", str(offset).encode()),
                ("x-kafka-backup-timestamp", str(timestamp).encode()),
                ("x-kafka-backup-partition", str(partition).encode())]
    return [("x-original-offset", struct.pack("<q", offset)),
            ("x-original-timestamp", struct.pack("<q", timestamp)),
            ("x-source-partition", struct.pack("<i", partition))]


class RestoreIncompleteError(KbsError):
    """A restore stopped part-way (a corrupt segment, records the cluster refused, …).

    ``reached`` says, per source partition, the last source offset known to be on the target
    (every record of the selection up to it was acknowledged, none after it was sent);
    ``uncertain`` the source partitions where some records may or may not have arrived, with
    the range sent to them. ``continue_ranges`` are ``TOPIC:PARTITION:START:END`` specs that,
    added to the same command (``--offset-range``, or ``offset_ranges=`` in Python), restore the
    rest without duplicates.
    """

    def __init__(self, cause: str, reached: dict[tuple[str, int], int],
                 uncertain: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.cause = cause
        self.reached = reached
        self.uncertain = uncertain
        self.continue_ranges = [f"{t}:{p}:{off + 1}:" for (t, p), off in sorted(reached.items())]
        lines = [f"restore stopped: {cause}"]
        if reached:
            lines.append("reached the target (source offsets, every record of the selection up to them): "
                         + ", ".join(f"{t}/{p} ..{off}" for (t, p), off in sorted(reached.items())))
        for (t, p), (a, b) in sorted(uncertain.items()):
            lines.append(f"{t}/{p}: some of offsets {a}..{b} may be on the target (not acknowledged "
                         "before the stop); check the target before restoring them again")
        if self.continue_ranges:
            lines.append("continue without duplicates by adding: "
                         + " ".join(f"--offset-range {r}" for r in self.continue_ranges))
        else:
            lines.append("nothing reached the target: run the same command again")
        super().__init__("\n".join(lines))


#: Producer settings of a restore; ``-X``/``--config`` override them, idempotence is forced.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger.ms": 20,
    "batch.size": 1024 * 1024,
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 512 * 1024,
    "compression.type": "lz4",
}
#: Decoded records waiting for the producing thread, at most (bytes of keys and values).
READ_AHEAD_BYTES = 32 * 1024 * 1024
#: Compressed bytes decoded at a time. Small: turning a chunk into Python objects holds the GIL
#: in long C calls, which the producing thread then waits out (32 MiB chunks: ~20 % slower).
CHUNK_BYTES = 2 * 1024 * 1024


@dataclass
class _Chunk:
    """Records of one source partition as the producer takes them (Python lists)."""

    src: tuple[str, int]
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list | None] | None
    nbytes: int


def _slices(raw: Any, o: list[int]) -> list:
    """``[raw[o[0]:o[1]], raw[o[1]:o[2]], …]`` in C-level maps (no Python statement per item)."""
    return list(map(raw.__getitem__, map(slice, o, o[1:])))


def _py_values(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray) -> list[bytes | None]:
    """bytes objects of a binary column, nulls as None: each copied once, straight from the
    column (a ``bytes`` of memoryview slices; no intermediate copy of the whole column)."""
    out: list[bytes | None] = list(map(bytes, _slices(memoryview(data), offsets.tolist())))
    if not bool(valid.all()):
        for i in np.flatnonzero(~valid).tolist():
            out[i] = None
    return out


def _py_headers(cols: Any) -> list[list | None] | None:
    """Per record a list of (key, value) or None; None for the column when no record has any."""
    ho = cols.header_offsets
    if int(ho[-1]) == int(ho[0]):
        return None
    kraw = cols.header_key_data.tobytes()
    if kraw.isascii():  # (nearly always) str offsets are byte offsets: one decode, then slices
        keys = _slices(kraw.decode("ascii"), cols.header_key_offsets.tolist())
    else:
        keys = [k.decode("utf-8", "surrogateescape") for k in _slices(kraw, cols.header_key_offsets.tolist())]
    pairs = list(zip(keys, _py_values(cols.header_value_offsets, cols.header_value_data, cols.header_value_valid),
                     strict=True))
    has = np.flatnonzero(np.diff(ho))
    out: list[list | None] = [None] * (len(ho) - 1)
    per = map(pairs.__getitem__, map(slice, ho[has].tolist(), ho[has + 1].tolist()))
    for i, h in zip(has.tolist(), per, strict=True):
        out[i] = h
    return out


def chunk_of_columns(src: tuple[str, int], cols: Any, mask: np.ndarray | None) -> _Chunk:
    keys = _py_values(cols.key_offsets, cols.key_data, cols.key_valid)
    values = _py_values(cols.value_offsets, cols.value_data, cols.value_valid)
    headers = _py_headers(cols)
    offsets, ts = cols.offsets.tolist(), cols.timestamps.tolist()
    nbytes = int(len(cols.key_data) + len(cols.value_data))
    if mask is not None:
        idx = np.flatnonzero(mask).tolist()
        keys, values, offsets, ts = ([x[i] for i in idx] for x in (keys, values, offsets, ts))
        headers = None if headers is None else [headers[i] for i in idx]
    return _Chunk(src, offsets, ts, keys, values, headers, nbytes)


class _ReadAhead:
    """Decodes the selected segments on a thread (the codecs and kernels free the GIL) while
    the caller produces; at most :data:`READ_AHEAD_BYTES` of records wait. Each batch's CRC-32
    is checked before its records are decoded, so no record of a corrupt batch is produced; an
    error ends the stream after the records before it."""

    _END = object()

    def __init__(self, ds: KbsDataset) -> None:
        self.ds = ds
        self.items: queue.Queue = queue.Queue()
        self.budget = threading.Condition()
        self.waiting = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kbs-restore-read", daemon=True)

    def __iter__(self) -> Iterator[_Chunk]:
        self.thread.start()
        try:
            while True:
                item = self.items.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                with self.budget:
                    self.waiting -= item.nbytes
                    self.budget.notify_all()
                yield item
        finally:
            self.stop.set()
            with self.budget:
                self.budget.notify_all()
            self.thread.join()

    def _run(self) -> None:
        sf = self.ds.scan_filter
        try:
            for ref in self.ds.fragments():
                src = (ref.topic, ref.partition)
                for cols in self.ds.backup.iter_columns(ref, threads=1, max_chunk_bytes=CHUNK_BYTES,
                                                        bounds=sf.segment_bounds(ref)):
                    if self.stop.is_set():
                        return
                    mask = sf.row_mask(ref.topic, ref.partition, cols.offsets, cols.timestamps)
                    if mask is not None and not mask.any():
                        continue
                    chunk = chunk_of_columns(src, cols, mask)
                    with self.budget:
                        while self.waiting > READ_AHEAD_BYTES and not self.stop.is_set():
                            self.budget.wait()
                        self.waiting += chunk.nbytes
                    self.items.put(chunk)
            self.items.put(self._END)
        except BaseException as e:  # handed to the producing thread, raised there in order
            self.items.put(e)


def _produce_run(produce: Callable, poll: Callable, dst: str, part: int, values: list, keys: list,
                 timestamps: list, headers: list, start: int, stop: int, handed: list[int] | None = None) -> None:
    """``produce()`` records ``start:stop`` in order, driven by C-level ``map`` (no Python
    statement per record; the positional arguments are ``produce``'s: topic, value, key,
    partition, on_delivery, callback, timestamp, headers). When the producer's queue is full
    (``BufferError``) it is drained a little and the record that failed is produced again.
    ``handed[0]`` ends as the index after the last record handed to the producer, also when
    ``produce()`` raises anything else (a record above ``message.max.bytes``, ...)."""
    i = start
    while i < stop:
        its = [iter(x) for x in (values, keys, timestamps, headers)]
        for it in its:
            it.__setstate__(i)  # list iterators start at i
        vi = its[0]
        try:
            deque(map(produce, repeat(dst), islice(vi, stop - i), its[1], repeat(part), repeat(None), repeat(None),
                      its[2], its[3]), maxlen=0)
            if handed is not None:
                handed[0] = stop
            return
        except BufferError:
            # map took the failed record from every iterator: it is the one before vi's position.
            i = len(values) - length_hint(vi) - 1
            poll(0.05)
        except BaseException:
            if handed is not None:
                handed[0] = len(values) - length_hint(vi) - 1
            raise


class _Sender:
    """Produces chunks in order and keeps what a stopped restore must report: per source
    partition the range sent, and the deliveries the cluster refused."""

    def __init__(self, producer: Any, mapping: dict[str, str], with_headers: bool, style: str) -> None:
        self.producer = producer
        self.mapping = mapping
        self.with_headers = with_headers
        self.style = style
        self.sent: dict[tuple[str, int], tuple[int, int]] = {}  # src -> (first, last) offset sent
        self.failed: dict[tuple[str, int], int] = {}  # (target topic, partition) -> refused records
        self.errors: list[str] = []
        self.records = self.bytes = 0
        self.polled = 0.0

    def on_error(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        key = (msg.topic(), msg.partition())
        self.failed[key] = self.failed.get(key, 0) + 1
        if len(self.errors) < 10:
            self.errors.append(f"{key[0]}/{key[1]}: {err.str() if hasattr(err, 'str') else err}")

    def send(self, c: _Chunk, markers: dict[int, Callable[[Any, Any], None]]) -> None:
        """Produce one chunk; ``markers``: record index -> its own delivery callback."""
        dst, part = self.mapping.get(c.src[0], c.src[0]), c.src[1]
        n = len(c.offsets)
        hdrs = c.headers if c.headers is not None else [None] * n
        if self.with_headers:
            hdrs = [(h or []) + offset_headers(self.style, o, t, part)
                    for h, o, t in zip(hdrs, c.offsets, c.timestamps, strict=True)]
        produce, poll = self.producer.produce, self.producer.poll
        start = 0
        handed = [0]  # records handed to the producer, in order
        try:
            for stop in [*sorted(markers), n]:
                _produce_run(produce, poll, dst, part, c.values, c.keys, c.timestamps, hdrs, start, stop, handed)
                if stop < n:
                    while True:
                        try:
                            produce(dst, c.values[stop], c.keys[stop], part, timestamp=c.timestamps[stop],
                                    headers=hdrs[stop], on_delivery=markers[stop])
                            break
                        except BufferError:
                            poll(0.05)
                    handed[0] = stop + 1
                start = stop + 1
        finally:
            # Also when produce() raised part-way: the stop report names exactly these records.
            i = handed[0]
            if i > 0:
                first = self.sent.get(c.src, (c.offsets[0], 0))[0]
                self.sent[c.src] = (first, c.offsets[i - 1])
                self.records += i
                self.bytes += c.nbytes if i == n else c.nbytes * i // n
        now = time.monotonic()
        if now - self.polled > 0.2:  # serve failure reports now and then (each poll waits for the GIL)
            poll(0)
            self.polled = now

    def incomplete(self, cause: str, unacknowledged: int) -> RestoreIncompleteError:
        """What reached the target, once the producer was flushed."""
        reached: dict[tuple[str, int], int] = {}
        uncertain: dict[tuple[str, int], tuple[int, int]] = {}
        for src, (first, last) in self.sent.items():
            target = (self.mapping.get(src[0], src[0]), src[1])
            if self.failed.get(target) or unacknowledged:
                uncertain[src] = (first, last)
            else:
                reached[src] = last
        return RestoreIncompleteError(cause, reached, uncertain)
