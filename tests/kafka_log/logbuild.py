"""Build Kafka log directories the way a broker lays them out (segments + index files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fsspec_kbs.format.kafka_log import (
    AbortedTxn,
    encode_offset_index,
    encode_time_index,
    encode_txn_index,
    parse_batch_header,
)


@dataclass
class SegmentSpec:
    batches: list[bytes]
    aborted: list[AbortedTxn] = field(default_factory=list)


def write_segment(pdir: Path, batches: list[bytes], aborted: list[AbortedTxn] | None = None,
                  index_interval: int = 4096, pad_index: int = 0, base_offset: int | None = None) -> Path:
    """One segment: ``.log`` holding ``batches``, with ``.index``/``.timeindex`` entries written
    every ``index_interval`` bytes as ``LogSegment.append`` does, and a ``.txnindex``.

    ``pad_index`` appends that many zero entries, like the pre-allocated index of an active segment.
    """
    pdir.mkdir(parents=True, exist_ok=True)
    headers = []
    pos = 0
    for b in batches:
        headers.append(parse_batch_header(b, 0, None, pos))
        pos += len(b)
    base = base_offset if base_offset is not None else (headers[0].base_offset if headers else 0)
    name = f"{base:020d}"
    (pdir / f"{name}.log").write_bytes(b"".join(batches))
    offsets, times = [], []
    since = 0
    max_ts = -1
    for h in headers:
        if h.max_timestamp > max_ts:
            max_ts = h.max_timestamp
            max_ts_offset = h.last_offset
        if since > index_interval:
            offsets.append((h.last_offset, h.position))
            if not times or max_ts > times[-1][0]:
                times.append((max_ts, max_ts_offset))
            since = 0
        since += h.size
    (pdir / f"{name}.index").write_bytes(encode_offset_index(offsets, base) + b"\0" * 8 * pad_index)
    (pdir / f"{name}.timeindex").write_bytes(encode_time_index(times, base) + b"\0" * 12 * pad_index)
    if aborted:
        (pdir / f"{name}.txnindex").write_bytes(encode_txn_index(aborted))
    return pdir / f"{name}.log"
