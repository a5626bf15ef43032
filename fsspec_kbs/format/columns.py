"""Columnar records: numpy buffers laid out the way Arrow wants them (offsets + data)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RecordColumns:
    """Decoded records of one or more batches, one entry per record.

    Variable-length fields are Arrow-style: ``*_offsets`` has ``n + 1`` int32 entries into
    ``*_data``; ``*_valid`` is False for a null. Headers are a list per record:
    record ``i`` owns headers ``header_offsets[i]:header_offsets[i + 1]``.
    """

    offsets: np.ndarray  # int64[n]
    timestamps: np.ndarray  # int64[n], Unix ms
    key_offsets: np.ndarray  # int32[n + 1]
    key_data: np.ndarray  # uint8
    key_valid: np.ndarray  # bool[n]
    value_offsets: np.ndarray
    value_data: np.ndarray
    value_valid: np.ndarray
    header_offsets: np.ndarray  # int32[n + 1]
    header_key_offsets: np.ndarray  # int32[h + 1]
    header_key_data: np.ndarray
    header_value_offsets: np.ndarray  # int32[h + 1]
    header_value_data: np.ndarray
    header_value_valid: np.ndarray  # bool[h]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def num_headers(self) -> int:
        return len(self.header_key_offsets) - 1

    def slice(self, start: int, stop: int) -> RecordColumns:
        """Rows ``start:stop`` as views (offset arrays stay absolute into the shared data)."""
        return RecordColumns(
            offsets=self.offsets[start:stop],
            timestamps=self.timestamps[start:stop],
            key_offsets=self.key_offsets[start : stop + 1],
            key_data=self.key_data,
            key_valid=self.key_valid[start:stop],
            value_offsets=self.value_offsets[start : stop + 1],
            value_data=self.value_data,
            value_valid=self.value_valid[start:stop],
            header_offsets=self.header_offsets[start : stop + 1],
            header_key_offsets=self.header_key_offsets,
            header_key_data=self.header_key_data,
            header_value_offsets=self.header_value_offsets,
            header_value_data=self.header_value_data,
            header_value_valid=self.header_value_valid,
        )

    def record(self, i: int) -> dict:
        """Record ``i`` as a plain dict (for tests and JSON output; slow)."""

        def field(offs: np.ndarray, data: np.ndarray, valid: np.ndarray, j: int) -> bytes | None:
            return bytes(data[offs[j] : offs[j + 1]]) if valid[j] else None

        headers = []
        for h in range(self.header_offsets[i], self.header_offsets[i + 1]):
            hkey = bytes(self.header_key_data[self.header_key_offsets[h] : self.header_key_offsets[h + 1]])
            headers.append(
                (
                    hkey.decode("utf-8"),
                    field(self.header_value_offsets, self.header_value_data, self.header_value_valid, h),
                )
            )
        return {
            "offset": int(self.offsets[i]),
            "timestamp": int(self.timestamps[i]),
            "key": field(self.key_offsets, self.key_data, self.key_valid, i),
            "value": field(self.value_offsets, self.value_data, self.value_valid, i),
            "headers": headers,
        }

    def records(self) -> list[dict]:
        return [self.record(i) for i in range(len(self))]

    @classmethod
    def from_records(cls, records: list[dict]) -> RecordColumns:
        """Build columns from dicts with offset, timestamp, key, value, headers (tests, small data)."""

        def pack(values: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            lens = np.array([0 if v is None else len(v) for v in values], dtype=np.int64)
            offs = np.zeros(len(values) + 1, dtype=np.int32)
            offs[1:] = np.cumsum(lens)
            data = np.frombuffer(b"".join(v for v in values if v is not None), dtype=np.uint8).copy()
            valid = np.array([v is not None for v in values], dtype=np.bool_)
            return offs, data, valid

        koffs, kdata, kvalid = pack([r.get("key") for r in records])
        voffs, vdata, vvalid = pack([r.get("value") for r in records])
        hdrs = [h for r in records for h in (r.get("headers") or [])]
        hoffs = np.zeros(len(records) + 1, dtype=np.int32)
        hoffs[1:] = np.cumsum([len(r.get("headers") or []) for r in records])
        hkoffs, hkdata, _ = pack([(k.encode("utf-8") if isinstance(k, str) else k) for k, _ in hdrs])
        hvoffs, hvdata, hvvalid = pack([v for _, v in hdrs])
        return cls(
            offsets=np.array([r["offset"] for r in records], dtype=np.int64),
            timestamps=np.array([r["timestamp"] for r in records], dtype=np.int64),
            key_offsets=koffs,
            key_data=kdata,
            key_valid=kvalid,
            value_offsets=voffs,
            value_data=vdata,
            value_valid=vvalid,
            header_offsets=hoffs,
            header_key_offsets=hkoffs,
            header_key_data=hkdata,
            header_value_offsets=hvoffs,
            header_value_data=hvdata,
            header_value_valid=hvvalid,
        )


@dataclass
class ViewColumns:
    """Decoded records whose variable-length fields are Arrow views into the batches' bytes.

    ``*_views`` hold 16 bytes per entry (``binary_view`` layout: length, then the bytes
    inline when at most 12, else a prefix, an index into ``buffers`` and an offset there).
    Nothing of the record data is copied; the views keep ``buffers`` (the decompressed
    batches) alive. Offsets, timestamps and header counts are as in :class:`RecordColumns`.
    """

    offsets: np.ndarray  # int64[n]
    timestamps: np.ndarray  # int64[n]
    key_views: np.ndarray  # uint8[16 n]
    key_valid: np.ndarray  # bool[n]
    value_views: np.ndarray
    value_valid: np.ndarray
    header_offsets: np.ndarray  # int32[n + 1]
    header_key_views: np.ndarray  # uint8[16 h]
    header_value_views: np.ndarray
    header_value_valid: np.ndarray  # bool[h]
    buffers: list[np.ndarray]  # uint8, one per batch

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def num_headers(self) -> int:
        return len(self.header_value_valid)

    def filter(self, mask: np.ndarray) -> ViewColumns:
        """The rows where ``mask`` is True (Arrow's ``filter`` does not take views yet)."""
        counts = np.diff(self.header_offsets)
        hmask = np.repeat(mask, counts)
        header_offsets = np.zeros(int(np.count_nonzero(mask)) + 1, dtype=np.int32)
        np.cumsum(counts[mask], out=header_offsets[1:])

        def rows(views: np.ndarray, keep: np.ndarray) -> np.ndarray:
            return views.reshape(-1, 16)[keep].reshape(-1)

        return ViewColumns(
            offsets=self.offsets[mask], timestamps=self.timestamps[mask],
            key_views=rows(self.key_views, mask), key_valid=self.key_valid[mask],
            value_views=rows(self.value_views, mask), value_valid=self.value_valid[mask],
            header_offsets=header_offsets,
            header_key_views=rows(self.header_key_views, hmask),
            header_value_views=rows(self.header_value_views, hmask),
            header_value_valid=self.header_value_valid[hmask], buffers=self.buffers,
        )
