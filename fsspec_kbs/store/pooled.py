"""Read file bytes into Arrow memory-pool buffers instead of new ``bytes`` objects.

A new ``bytes`` of a few hundred KB or more is, under glibc's default settings, a fresh
memory map, and every 4 KiB of it faults when the read fills it: a 128 MB scan took ~150,000
such faults (~10 % of its time on one core). The pool hands out the same, already mapped
pages again. Before, the scan avoided this only by accident (a large temporary array freed
early raised glibc's map threshold).
"""

from __future__ import annotations

from typing import IO

import pyarrow as pa

from fsspec_kbs.format.codecs import PAYLOAD_POOL


def read_pooled(f: IO[bytes], n: int) -> memoryview:
    """Up to ``n`` bytes from ``f`` (fewer only at its end) in a pool buffer."""
    buf = pa.allocate_buffer(n, PAYLOAD_POOL)
    view = memoryview(buf).cast("B")  # plain bytes, whatever format the buffer exports
    got = 0
    while got < n:
        more = f.readinto(view[got:])
        if not more:
            break
        got += more
    return view[:got]
