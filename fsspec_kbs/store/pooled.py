"""Read file bytes into Arrow memory-pool buffers instead of new ``bytes`` objects.

A new ``bytes`` above 128 KB is, under glibc's default settings, a fresh memory map, and
every 4 KiB of it faults when the read fills it: 40 thread-pool scans of a 128 MB backup took
~250,000 page faults reading into ``bytes``, ~30,000 (mostly start-up) reading into the pool,
which hands out the same, already mapped pages again. Scans used to avoid most of this by
accident: a segment-sized temporary array, freed early, raised glibc's map threshold.
"""

from __future__ import annotations

from typing import IO

from fsspec_kbs.format.codecs import payload_pool


def read_pooled(f: IO[bytes], n: int, prefix: bytes = b"") -> memoryview:
    """``prefix`` then up to ``n`` bytes from ``f`` (fewer only at its end) in a pool buffer."""
    import pyarrow as pa  # a reader's: writers never load it

    buf = pa.allocate_buffer(len(prefix) + n, payload_pool())
    view = memoryview(buf).cast("B")  # plain bytes, whatever format the buffer exports
    got = len(prefix)
    view[:got] = prefix
    n += got
    while got < n:
        more = f.readinto(view[got:])
        if not more:
            break
        got += more
    return view[:got]
