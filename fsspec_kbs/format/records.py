"""Records of a batch <-> :class:`RecordColumns`, via the kernels in :mod:`.kernels`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from fsspec_kbs.format import kernels as k
from fsspec_kbs.format.columns import RecordColumns, ViewColumns

_MESSAGES = {
    k.E_VARINT: "malformed varint (longer than 10 bytes or cut off)",
    k.E_TRUNCATED: "field runs past the end of the batch",
    k.E_LENGTH: "negative length other than -1",
    k.E_OFFSET_ORDER: "offset deltas must start at 0 and strictly increase",
    k.E_HEADER_COUNT: "negative header count",
    k.E_HEADER_KEY_NULL: "header key is null",
    k.E_TRAILING: "trailing bytes after the last record",
    k.E_OFFSET_RANGE: "record offset exceeds 2^63-1",
    k.E_TIMESTAMP_RANGE: "timestamp delta takes the timestamp past the int64 range",
}


class RecordDecodeError(ValueError):
    """Malformed record data; ``batch`` indexes the payload list, ``position`` the byte in it."""

    def __init__(self, batch: int, code: int, position: int) -> None:
        self.batch = batch
        self.code = code
        self.position = position
        self.reason = _MESSAGES.get(code, f"record error {code}")
        super().__init__(f"batch {batch}, byte {position} of its records: {self.reason}")


@dataclass(frozen=True)
class Payload:
    """Uncompressed records of one batch."""

    data: np.ndarray  # uint8
    base_offset: int
    count: int


def as_uint8(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(data, np.ndarray):  # as it is when it is one: a view would hide its base buffer
        return data if data.dtype == np.uint8 else data.view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def empty_array(n: int, dtype: type | np.dtype) -> np.ndarray:
    """``np.empty(n, dtype)`` taken from Arrow's memory pool (mimalloc by default).

    Decoded chunks are large, short-lived and freed by whoever holds the Arrow batch, often on
    another thread. The pool hands the same pages out again, already mapped: fresh anonymous
    memory costs a page fault per 4 KiB (the copy then runs at ~2 GB/s instead of ~9), and
    glibc's heap fragments under this pattern until a long scan's RSS creeps up by hundreds
    of MB. Memory in use shows in ``pyarrow.total_allocated_bytes()``.
    """
    import pyarrow as pa  # a reader's: a process that only writes never loads it

    dt = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(max(1, n * dt.itemsize)), dtype=dt, count=n)


class ColumnsBuilder:
    """Decodes batches into one :class:`RecordColumns`: each is checked on :meth:`add`,
    all are copied by :meth:`finish` into arrays of exactly the size they need.

    Checking first gives exact sizes, so no upper-bound buffer is ever handed to Arrow (a
    batch's memory is what its rows hold). ``scan`` and ``fill`` are the kernels to use
    (tests pass the interpreted ones).
    """

    def __init__(self, scan: Callable = k.scan_records, fill: Callable = k.fill_records) -> None:
        self._scan = scan
        self._fill = fill
        self._pending: list[Payload] = []
        self.records = 0
        self.headers = 0
        self._used = (0, 0, 0, 0)  # key, value, header key, header value bytes

    def add(self, p: Payload) -> None:
        """Check one batch (raises :class:`RecordDecodeError`, ``batch`` = its index)."""
        code, pos, kb, vb, nh, hkb, hvb = self._scan(p.data, 0, len(p.data), p.count, p.base_offset)
        if code != k.OK:
            raise RecordDecodeError(len(self._pending), code, pos)
        u = self._used
        used = (u[0] + kb, u[1] + vb, u[2] + hkb, u[3] + hvb)
        if max(used) >= 2**31 or self.headers + nh >= 2**31:
            raise ValueError("more than 2 GiB of variable-length data in one chunk; read smaller chunks")
        self._pending.append(p)
        self._used = used
        self.records += p.count
        self.headers += nh

    def finish(self) -> RecordColumns:
        """The decoded rows of every batch added since the last call, in order."""
        n, h = self.records, self.headers
        kb, vb, hkb, hvb = self._used
        e = empty_array
        c = RecordColumns(
            offsets=e(n, np.int64), timestamps=e(n, np.int64),
            key_offsets=e(n + 1, np.int32), key_data=e(kb, np.uint8), key_valid=e(n, np.bool_),
            value_offsets=e(n + 1, np.int32), value_data=e(vb, np.uint8), value_valid=e(n, np.bool_),
            header_offsets=e(n + 1, np.int32),
            header_key_offsets=e(h + 1, np.int32), header_key_data=e(hkb, np.uint8),
            header_value_offsets=e(h + 1, np.int32), header_value_data=e(hvb, np.uint8),
            header_value_valid=e(h, np.bool_),
        )
        for arr in (c.key_offsets, c.value_offsets, c.header_offsets, c.header_key_offsets,
                    c.header_value_offsets):
            arr[0] = 0
        row = hrow = 0
        for p in self._pending:
            self._fill(
                p.data, 0, p.count, p.base_offset, row, hrow,
                c.offsets, c.timestamps,
                c.key_offsets, c.key_data, c.key_valid,
                c.value_offsets, c.value_data, c.value_valid,
                c.header_offsets, c.header_key_offsets, c.header_key_data,
                c.header_value_offsets, c.header_value_data, c.header_value_valid,
            )
            row += p.count
            hrow = int(c.header_offsets[row])
        self._pending.clear()  # empty again, ready for the next group
        self.records = self.headers = 0
        self._used = (0, 0, 0, 0)
        return c


#: The smallest encoded record: five one-byte varints (offset and time deltas, null key,
#: null value, no headers). A batch of ``n`` bytes holds at most ``n // 5`` records.
MIN_RECORD_BYTES = 5


class ViewsBuilder:
    """Decodes batches into one :class:`ViewColumns` of at most ``capacity`` records.

    Each batch is checked and its views written on :meth:`add`, right after it was
    decompressed (no sizes are needed up front: a view is 16 bytes whatever the field; header
    views are sized per batch by its scan). ``scan`` and ``fill`` are the kernels to use
    (tests pass the interpreted ones).
    """

    def __init__(self, capacity: int, scan: Callable = k.scan_records, fill: Callable = k.fill_views) -> None:
        self._scan = scan
        self._fill = fill
        e = empty_array
        n = capacity
        self._offsets, self._timestamps = e(n, np.int64), e(n, np.int64)
        self._key_views, self._key_valid = e(16 * n, np.uint8), e(n, np.bool_)
        self._value_views, self._value_valid = e(16 * n, np.uint8), e(n, np.bool_)
        self._header_offsets = e(n + 1, np.int32)
        self._header_offsets[0] = 0
        self._headers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per batch
        self._buffers: list[np.ndarray] = []
        self.records = 0

    def add(self, p: Payload) -> None:
        """Check one batch and write its views (raises :class:`RecordDecodeError`)."""
        index = len(self._buffers)
        code, pos, _kb, _vb, nh, _hkb, _hvb = self._scan(p.data, 0, len(p.data), p.count, p.base_offset)
        if code != k.OK:
            raise RecordDecodeError(index, code, pos)
        row = self.records
        if row + p.count > len(self._offsets):
            raise ValueError(f"batch {index} holds more records than the {len(self._offsets)} announced")
        if int(self._header_offsets[row]) + nh >= 2**31:
            raise ValueError("more than 2^31 headers in one chunk; read smaller chunks")
        hkv, hvv, hvalid = empty_array(16 * nh, np.uint8), empty_array(16 * nh, np.uint8), empty_array(nh, np.bool_)
        self._fill(
            p.data, index, p.count, p.base_offset, row, 0, self._offsets, self._timestamps,
            self._key_views.view(np.int32), self._key_valid, self._value_views.view(np.int32), self._value_valid,
            self._header_offsets, hkv.view(np.int32), hvv.view(np.int32), hvalid,
        )
        self._headers.append((hkv, hvv, hvalid))
        self._buffers.append(p.data)
        self.records = row + p.count

    def finish(self) -> ViewColumns:
        """The rows of every batch added (call once)."""
        n = self.records

        def joined(i: int) -> np.ndarray:
            parts = [h[i] for h in self._headers]
            return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else empty_array(0, np.uint8)

        return ViewColumns(
            offsets=self._offsets[:n], timestamps=self._timestamps[:n],
            key_views=self._key_views[: 16 * n], key_valid=self._key_valid[:n],
            value_views=self._value_views[: 16 * n], value_valid=self._value_valid[:n],
            header_offsets=self._header_offsets[: n + 1], header_key_views=joined(0),
            header_value_views=joined(1), header_value_valid=joined(2).astype(np.bool_, copy=False),
            buffers=self._buffers,
        )


def decode_payloads(payloads: Sequence[Payload]) -> RecordColumns:
    """Decode several batches' records into one :class:`RecordColumns`."""
    builder = ColumnsBuilder()
    for p in payloads:
        builder.add(p)
    return builder.finish()


@dataclass(frozen=True)
class EncodedBatch:
    """Uncompressed records of one batch, ready to compress, with their statistics."""

    data: np.ndarray  # uint8
    base_offset: int
    last_offset: int
    count: int
    min_timestamp: int
    max_timestamp: int


def delta_runs(timestamps: np.ndarray) -> list[tuple[int, int]]:
    """Runs ``(start, stop)`` of records whose consecutive timestamps differ by less than the
    int64 range. Within a batch each timestamp is stored as a delta from the previous one
    (§2.3), so a batch must start where a delta would wrap; a batch's first timestamp is
    stored whole."""
    n = len(timestamps)
    if n < 2 or int(timestamps.max()) - int(timestamps.min()) <= 2**63 - 1:
        return [(0, n)]  # no difference between two of them can leave int64
    diffs = np.diff(timestamps.astype(object))
    cuts = (np.flatnonzero((diffs > 2**63 - 1) | (diffs < -(2**63))) + 1).tolist()
    edges = [0, *cuts, n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def plan_encode(cols: RecordColumns, max_bytes: int, max_records: int = 2**31 - 1) -> list[Callable[[], EncodedBatch]]:
    """Split ``cols`` into batches of at most ``max_bytes`` uncompressed bytes: one call per
    batch, in order, that encodes it.

    Encoding each batch only when it is about to be compressed keeps one batch per thread in
    memory instead of the whole input a second time, and the batch is still in cache when
    the compressor reads it. Offsets must strictly increase (the caller checks; the codec
    would produce invalid deltas otherwise).
    """
    if len(cols) == 0:
        return []
    runs = delta_runs(cols.timestamps)
    if len(runs) > 1:
        return [f for a, b in runs for f in plan_encode(cols.slice(a, b), max_bytes, max_records)]
    cuts = np.empty(len(cols) + 1, dtype=np.int64)
    sizes = np.empty(len(cols) + 1, dtype=np.int64)
    nb = k.plan_batches(
        cols.offsets, cols.timestamps,
        cols.key_offsets, cols.key_valid, cols.value_offsets, cols.value_valid,
        cols.header_offsets, cols.header_key_offsets, cols.header_value_offsets,
        cols.header_value_valid, max_bytes, max_records, cuts, sizes,
    )
    return [partial(_encode_batch, cols, int(cuts[b]), int(cuts[b + 1]), int(sizes[b])) for b in range(nb)]


def _encode_batch(cols: RecordColumns, r0: int, r1: int, size: int) -> EncodedBatch:
    buf = np.empty(size, np.uint8)  # compressed (or, uncompressed, written as is), never handed to Arrow
    end = k.encode_records(
        r0, r1, buf, cols.offsets, cols.timestamps,
        cols.key_offsets, cols.key_data, cols.key_valid,
        cols.value_offsets, cols.value_data, cols.value_valid,
        cols.header_offsets, cols.header_key_offsets, cols.header_key_data,
        cols.header_value_offsets, cols.header_value_data, cols.header_value_valid,
    )
    if end != len(buf):  # pragma: no cover - plan and encode disagree: a bug, not bad data
        raise AssertionError(f"batch encoded to {end} bytes, planned {len(buf)}")
    ts = cols.timestamps[r0:r1]
    return EncodedBatch(
        data=buf,
        base_offset=int(cols.offsets[r0]),
        last_offset=int(cols.offsets[r1 - 1]),
        count=r1 - r0,
        min_timestamp=int(ts.min()),
        max_timestamp=int(ts.max()),
    )


def encode_batches(cols: RecordColumns, max_bytes: int, max_records: int = 2**31 - 1) -> list[EncodedBatch]:
    """Every batch of :func:`plan_encode`, encoded."""
    return [encode() for encode in plan_encode(cols, max_bytes, max_records)]
