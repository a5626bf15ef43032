"""Records as JSON lines: the one rendering ``kbs cat`` prints and the ``kbs://`` view serves.

One object per record: topic, partition, offset, timestamp (Unix ms), key, value and headers
(``[[key, value], ...]``, ``[]`` for none), with keys, values and header values encoded as
base64 (default), hex or UTF-8 text (invalid bytes replaced), null as null.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from fsspec_kbs.arrow.convert import batch_to_columns, check_header_keys, timestamps_of
from fsspec_kbs.format import RecordColumns


def _b64(b: memoryview) -> str:
    # base64 and hex never need JSON escaping: skip json.dumps (about 3x faster per record).
    return '"' + base64.b64encode(b).decode("ascii") + '"'


def _hex(b: memoryview) -> str:
    return '"' + b.hex() + '"'


def _utf8(b: memoryview) -> str:
    return json.dumps(bytes(b).decode("utf-8", errors="replace"))


#: ``--binary`` choices of ``kbs cat``: bytes -> a JSON string literal.
ENCODERS: dict[str, Callable[[memoryview], str]] = {"base64": _b64, "hex": _hex, "utf8": _utf8}


def jsonl_lines(cols: RecordColumns, topic: str, partition: int, binary: str = "base64",
                path: str | None = None) -> bytes:
    """JSON lines for decoded records, byte-identical to ``json.dumps`` of each record's dict.

    Header keys must be UTF-8 (``RecordFormatError`` naming ``path`` otherwise), as on every
    path that hands records on.
    """
    enc = ENCODERS[binary]
    check_header_keys(cols, path)
    prefix = '{"topic": ' + json.dumps(topic) + ', "partition": ' + str(partition) + ', "offset": '
    kdata, vdata = memoryview(cols.key_data), memoryview(cols.value_data)
    hkdata, hvdata = memoryview(cols.header_key_data), memoryview(cols.header_value_data)
    koffs, voffs = cols.key_offsets.tolist(), cols.value_offsets.tolist()
    kvalid, vvalid = cols.key_valid.tolist(), cols.value_valid.tolist()
    hoffs = cols.header_offsets.tolist()
    hkoffs, hvoffs = cols.header_key_offsets.tolist(), cols.header_value_offsets.tolist()
    hvvalid = cols.header_value_valid.tolist()
    offsets, timestamps = cols.offsets.tolist(), cols.timestamps.tolist()
    out = []
    for i in range(len(offsets)):
        key = enc(kdata[koffs[i]:koffs[i + 1]]) if kvalid[i] else "null"
        value = enc(vdata[voffs[i]:voffs[i + 1]]) if vvalid[i] else "null"
        if hoffs[i] == hoffs[i + 1]:
            headers = "[]"
        else:
            parts = []
            for h in range(hoffs[i], hoffs[i + 1]):
                hkey = json.dumps(bytes(hkdata[hkoffs[h]:hkoffs[h + 1]]).decode("utf-8"))
                hval = enc(hvdata[hvoffs[h]:hvoffs[h + 1]]) if hvvalid[h] else "null"
                parts.append(f"[{hkey}, {hval}]")
            headers = "[" + ", ".join(parts) + "]"
        out.append(f'{prefix}{offsets[i]}, "timestamp": {timestamps[i]}, "key": {key}, '
                   f'"value": {value}, "headers": {headers}}}\n')
    return "".join(out).encode("utf-8")


def batch_jsonl(batch: pa.RecordBatch, binary: str = "base64") -> Iterator[bytes]:
    """JSON lines of an Arrow batch in the Kafka schema, one chunk per run of (topic, partition)."""
    if not batch.num_rows:
        return
    topics = batch.column("topic").to_pylist()
    parts = batch.column("partition").to_numpy(zero_copy_only=False)
    change = [0, *(i for i in range(1, len(topics)) if topics[i] != topics[i - 1] or parts[i] != parts[i - 1]),
              len(topics)]
    offsets = batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64)
    timestamps = timestamps_of(batch)
    for start, stop in zip(change, change[1:], strict=False):
        part = batch.slice(start, stop - start)
        cols = batch_to_columns(part, offsets[start:stop], timestamps[start:stop])
        yield jsonl_lines(cols, topics[start], int(parts[start]), binary)
