"""Records of a batch <-> :class:`RecordColumns`, via the kernels in :mod:`.kernels`."""

from __future__ import annotations

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


def decode_payloads(payloads: Sequence[Payload]) -> RecordColumns:
    """Decode several batches' records into one :class:`RecordColumns`."""
    totals = np.zeros(5, dtype=np.int64)
    for b, p in enumerate(payloads):
        code, pos, kb, vb, nh, hkb, hvb = k.scan_records(p.data, 0, len(p.data), p.count, p.base_offset)
        if code != k.OK:
            raise RecordDecodeError(b, code, pos)
        totals += (kb, vb, nh, hkb, hvb)
    n = sum(p.count for p in payloads)
    kb, vb, nh, hkb, hvb = (int(x) for x in totals)
    if max(kb, vb, hkb, hvb) >= 2**31:
        raise ValueError("more than 2 GiB of variable-length data in one chunk; read smaller chunks")
    cols = RecordColumns(
        offsets=np.empty(n, np.int64),
        timestamps=np.empty(n, np.int64),
        key_offsets=np.empty(n + 1, np.int32),
        key_data=np.empty(kb, np.uint8),
        key_valid=np.empty(n, np.bool_),
        value_offsets=np.empty(n + 1, np.int32),
        value_data=np.empty(vb, np.uint8),
        value_valid=np.empty(n, np.bool_),
        header_offsets=np.empty(n + 1, np.int32),
        header_key_offsets=np.empty(nh + 1, np.int32),
        header_key_data=np.empty(hkb, np.uint8),
        header_value_offsets=np.empty(nh + 1, np.int32),
        header_value_data=np.empty(hvb, np.uint8),
        header_value_valid=np.empty(nh, np.bool_),
    )
    for arr in (cols.key_offsets, cols.value_offsets, cols.header_offsets,
                cols.header_key_offsets, cols.header_value_offsets):
        arr[0] = 0
    row = 0
    hrow = 0
    for p in payloads:
        k.fill_records(
            p.data, 0, p.count, p.base_offset, row, hrow,
            cols.offsets, cols.timestamps,
            cols.key_offsets, cols.key_data, cols.key_valid,
            cols.value_offsets, cols.value_data, cols.value_valid,
            cols.header_offsets, cols.header_key_offsets, cols.header_key_data,
            cols.header_value_offsets, cols.header_value_data, cols.header_value_valid,
        )
        row += p.count
        hrow = int(cols.header_offsets[row])
    return cols


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
