"""Records of a batch <-> :class:`RecordColumns`, via the kernels in :mod:`.kernels`."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fsspec_kbs.format import kernels as k
from fsspec_kbs.format.columns import RecordColumns

_MESSAGES = {
    k.E_VARINT: "malformed varint (longer than 10 bytes or cut off)",
    k.E_TRUNCATED: "field runs past the end of the batch",
    k.E_LENGTH: "negative length other than -1",
    k.E_OFFSET_ORDER: "offset deltas must start at 0 and strictly increase",
    k.E_HEADER_COUNT: "negative header count",
    k.E_HEADER_KEY_NULL: "header key is null",
    k.E_TRAILING: "trailing bytes after the last record",
    k.E_OFFSET_RANGE: "record offset exceeds 2^63-1",
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
    if isinstance(data, np.ndarray):
        return data.view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


#: Arrays at least this large get their own anonymous memory map (see :func:`empty_array`).
MMAP_MIN_BYTES = 1 << 20


def empty_array(n: int, dtype: type | np.dtype, huge_pages: bool = False) -> np.ndarray:
    """``np.empty(n, dtype)``; large arrays get their own anonymous memory map.

    Decoded chunks are large, short-lived and freed by whoever holds the Arrow batch, often on
    another thread. From malloc's heap they fragment it and a long scan's RSS creeps up by
    hundreds of MB; a private mapping goes back to the OS as soon as the last view dies, and
    pages never written (the capacity of an upper-bound allocation) are never backed at all.
    ``huge_pages`` asks for 2 MiB pages (fewer page faults) for arrays that will be filled:
    a huge page is backed whole as soon as one byte of it is written.
    """
    dt = np.dtype(dtype)
    nbytes = n * dt.itemsize
    if nbytes < MMAP_MIN_BYTES:
        return np.empty(n, dt)
    m = mmap.mmap(-1, nbytes)
    if huge_pages and hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # kernels without transparent huge pages
            m.madvise(mmap.MADV_HUGEPAGE)  # fewer page faults, as numpy does for its own
    return np.frombuffer(m, dtype=dt, count=n)


class ColumnsBuilder:
    """Decodes batches one at a time into columns sized for ``records`` rows.

    Each batch is scanned and copied right after it was decompressed, while it is still in
    the CPU cache; scanning every batch of a chunk first and filling afterwards would read
    all of them from memory twice. The data buffers are allocated at an upper bound (the
    batches' uncompressed size): pages never written are never touched, so they cost
    address space, not memory.

    Parameters
    ----------
    records : int
        Total records of the batches to come.
    max_bytes : int
        Total uncompressed size of the batches to come.
    """

    def __init__(self, records: int, max_bytes: int) -> None:
        cap = max(0, int(max_bytes))
        hcap = cap // 2  # a header takes at least 2 bytes (two varints)
        self.capacity = cap
        self.records = records
        self.row = 0
        self.hrow = 0
        self.batches = 0
        self._used = np.zeros(4, dtype=np.int64)  # key, value, header key, header value bytes
        e = empty_array
        self.cols = RecordColumns(
            offsets=e(records, np.int64),
            timestamps=e(records, np.int64),
            key_offsets=e(records + 1, np.int32),
            key_data=e(cap, np.uint8),
            key_valid=e(records, np.bool_),
            value_offsets=e(records + 1, np.int32),
            value_data=e(cap, np.uint8, huge_pages=True),
            value_valid=e(records, np.bool_),
            header_offsets=e(records + 1, np.int32),
            header_key_offsets=e(hcap + 1, np.int32),
            header_key_data=e(cap, np.uint8),
            header_value_offsets=e(hcap + 1, np.int32),
            header_value_data=e(cap, np.uint8),
            header_value_valid=e(hcap, np.bool_),
        )
        c = self.cols
        for arr in (c.key_offsets, c.value_offsets, c.header_offsets, c.header_key_offsets,
                    c.header_value_offsets):
            arr[0] = 0

    def add(self, p: Payload) -> None:
        """Check and decode one batch (raises :class:`RecordDecodeError`, ``batch`` = its index)."""
        b = self.batches
        self.batches += 1
        code, pos, kb, vb, nh, hkb, hvb = k.scan_records(p.data, 0, len(p.data), p.count, p.base_offset)
        if code != k.OK:
            raise RecordDecodeError(b, code, pos)
        used = self._used + (kb, vb, hkb, hvb)
        if self.row + p.count > self.records or int(used.max()) > self.capacity \
                or self.hrow + nh > len(self.cols.header_value_valid):
            # Only a caller passing sizes that do not match the payloads gets here.
            raise ValueError("batches hold more records or bytes than the builder was sized for")
        if int(used.max()) >= 2**31:
            raise ValueError("more than 2 GiB of variable-length data in one chunk; read smaller chunks")
        c = self.cols
        k.fill_records(
            p.data, 0, p.count, p.base_offset, self.row, self.hrow,
            c.offsets, c.timestamps,
            c.key_offsets, c.key_data, c.key_valid,
            c.value_offsets, c.value_data, c.value_valid,
            c.header_offsets, c.header_key_offsets, c.header_key_data,
            c.header_value_offsets, c.header_value_data, c.header_value_valid,
        )
        self._used = used
        self.row += p.count
        self.hrow += nh

    def finish(self) -> RecordColumns:
        """The decoded rows (views trimmed to what was written)."""
        c, n, h = self.cols, self.row, self.hrow
        kb, vb, hkb, hvb = (int(x) for x in self._used)
        return RecordColumns(
            offsets=c.offsets[:n], timestamps=c.timestamps[:n],
            key_offsets=c.key_offsets[: n + 1], key_data=c.key_data[:kb], key_valid=c.key_valid[:n],
            value_offsets=c.value_offsets[: n + 1], value_data=c.value_data[:vb],
            value_valid=c.value_valid[:n],
            header_offsets=c.header_offsets[: n + 1],
            header_key_offsets=c.header_key_offsets[: h + 1], header_key_data=c.header_key_data[:hkb],
            header_value_offsets=c.header_value_offsets[: h + 1],
            header_value_data=c.header_value_data[:hvb], header_value_valid=c.header_value_valid[:h],
        )


def decode_payloads(payloads: Sequence[Payload]) -> RecordColumns:
    """Decode several batches' records into one :class:`RecordColumns`."""
    builder = ColumnsBuilder(sum(p.count for p in payloads), sum(len(p.data) for p in payloads))
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


def encode_batches(cols: RecordColumns, max_bytes: int, max_records: int = 2**31 - 1) -> list[EncodedBatch]:
    """Split ``cols`` into batches of at most ``max_bytes`` uncompressed bytes and encode each.

    Offsets must strictly increase (the caller checks; the codec would produce invalid
    deltas otherwise).
    """
    if len(cols) == 0:
        return []
    cuts, sizes = k.plan_batches(
        cols.offsets, cols.timestamps,
        cols.key_offsets, cols.key_valid, cols.value_offsets, cols.value_valid,
        cols.header_offsets, cols.header_key_offsets, cols.header_value_offsets,
        cols.header_value_valid, max_bytes, max_records,
    )
    out = []
    for b in range(len(sizes)):
        r0, r1 = int(cuts[b]), int(cuts[b + 1])
        buf = np.empty(int(sizes[b]), dtype=np.uint8)
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
        out.append(
            EncodedBatch(
                data=buf,
                base_offset=int(cols.offsets[r0]),
                last_offset=int(cols.offsets[r1 - 1]),
                count=r1 - r0,
                min_timestamp=int(ts.min()),
                max_timestamp=int(ts.max()),
            )
        )
    return out
