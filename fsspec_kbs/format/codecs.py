"""Batch compression codecs (none / LZ4 frame / zstd frame) with a decompression-bomb guard."""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import cramjam
import lz4.frame
import numpy as np
import zstandard

from fsspec_kbs.errors import DecompressionError, UnsupportedCodecError

if TYPE_CHECKING:
    import pyarrow as pa


class Codec(enum.IntEnum):
    """Compression codes of the KBS segment header."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2


class CodecFunctions(NamedTuple):
    """One codec of the registry: its name (manifests, options, CLI), default level, and the
    two functions every batch goes through."""

    name: str
    default_level: int
    compress: Callable[[bytes | memoryview, int], bytes]
    decompress: Callable[[bytes | memoryview, int], bytes | memoryview | np.ndarray]


#: THE codec registry: every list of codecs (manifest model, options, CLI choices) is read from
#: it. Adding a codec: a ``Codec`` member, its entry here (filled in at the end of this module,
#: once its functions exist), its kernel, and tests.
REGISTRY: dict[Codec, CodecFunctions] = {}

# zstd contexts are not thread-safe; keep one per thread and level.
_local = threading.local()
class _Arrow(NamedTuple):
    """Arrow's codecs and the pool payloads are decoded into: imported on the first read, so a
    process that only writes (``kbs backup``) never loads pyarrow (~30 MB resident)."""

    #: Arrow's zstd decompresses into a buffer of an Arrow memory pool, which hands the same
    #: mapped pages out again. python-zstandard returns a fresh ``bytes`` each time: once a
    #: chunk's few payloads are freed together glibc trims them off the heap, and zstd then
    #: takes a page fault every 4 KiB of output (in a new process, ~32,000 faults and ~25 % of
    #: a 128 MB scan's time). Arrow also checks that the frame fills the buffer exactly.
    #: Builds of pyarrow without zstd fall back to python-zstandard (None here).
    zstd: Any
    #: Arrow's LZ4 frame decoder ran 1.5x faster than cramjam here. It reports no output size,
    #: but liblz4 fails a frame that does not decode to the content size in its header: frames
    #: that declare the batch's size go to Arrow, any other frame to cramjam, which counts.
    lz4: Any
    #: The memory pool decompressed batches come from: jemalloc, where pyarrow has it
    #: (mimalloc kept ~20 MB more of these short-lived buffers mapped through a long scan).
    pool: pa.MemoryPool


@functools.cache
def arrow() -> _Arrow:
    """Arrow's codecs and payload pool (pyarrow imported on first use)."""
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        pool = pa.default_memory_pool()
    return _Arrow(pa.Codec("zstd") if pa.Codec.is_available("zstd") else None,
                  pa.Codec("lz4") if pa.Codec.is_available("lz4") else None, pool)


def payload_pool() -> pa.MemoryPool:
    """The memory pool decompressed batches (and pooled file reads) come from."""
    return arrow().pool


def __getattr__(name: str) -> Any:
    if name == "PAYLOAD_POOL":  # the name docs/api.md gave before pyarrow loaded lazily
        return arrow().pool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def codec_from_code(code: int) -> Codec:
    try:
        return Codec(code)
    except ValueError:
        raise UnsupportedCodecError(f"unknown compression code {code} (known: 0 none, 1 lz4, 2 zstd)") from None


def codec_from_name(name: str) -> Codec:
    try:
        return CODEC_BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unknown compression {name!r}; use one of {sorted(CODEC_BY_NAME)}") from None


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = _local.__dict__.setdefault("zc", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "zd", None)
    if dctx is None:
        dctx = _local.zd = zstandard.ZstdDecompressor()
    return dctx


def compress(codec: Codec, data: bytes | memoryview, level: int | None = None) -> bytes:
    """Compress ``data`` as one complete frame of ``codec``."""
    return _registered(codec).compress(data, DEFAULT_LEVELS[codec] if level is None else level)


def decompress(codec: Codec, frame: bytes | memoryview, expected_size: int) -> bytes | memoryview | np.ndarray:
    """Decompress one frame, allocating at most ``expected_size`` bytes.

    For ``Codec.NONE`` the frame itself is returned (a memoryview stays a view: no copy).
    Raises :class:`DecompressionError` (without location; the caller adds it) if the frame is
    invalid or holds any other amount of data than ``expected_size``.
    """
    return _registered(codec).decompress(frame, expected_size)


def _registered(codec: Codec) -> CodecFunctions:
    try:
        return REGISTRY[codec]
    except KeyError:
        raise UnsupportedCodecError(f"no codec registered for compression code {codec!r}") from None


def _none_compress(data: bytes | memoryview, level: int) -> bytes:
    return bytes(data)


def _none_decompress(frame: bytes | memoryview, expected_size: int) -> bytes | memoryview:
    if len(frame) != expected_size:
        raise DecompressionError(f"uncompressed batch is {len(frame)} bytes but its header says {expected_size}")
    return frame


def _zstd_compress(data: bytes | memoryview, level: int) -> bytes:
    return _zstd_compressor(level).compress(data)


def _lz4_compress(data: bytes | memoryview, level: int) -> bytes:
    return lz4.frame.compress(data, compression_level=level, store_size=True)


_ZSTD_MAGIC = 0xFD2FB528


def zstd_frame_length(frame: bytes | memoryview) -> int:
    """The length of the zstd frame at the start of ``frame`` (RFC 8878 §3.1.1), from its header
    and block headers; -1 if that is not a zstd frame header, or if the frame runs past the end."""
    data = memoryview(frame).cast("B") if not isinstance(frame, bytes) else frame
    n = len(data)
    if n < 6 or int.from_bytes(data[:4], "little") != _ZSTD_MAGIC:
        return -1
    fhd = data[4]
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if single else 0), 2, 4, 8)[fhd >> 6]
    while pos + 3 <= n:
        block = int.from_bytes(data[pos : pos + 3], "little")
        kind, size = (block >> 1) & 3, block >> 3
        pos += 3 + (1 if kind == 1 else size)  # an RLE block holds one byte
        if kind == 3 or pos > n:  # reserved block type, or cut off
            return -1
        if block & 1:  # the last block
            pos += 4 if fhd & 4 else 0  # content checksum
            return pos if pos <= n else -1
    return -1


def _zstd_decompress(frame: bytes | memoryview, expected_size: int) -> bytes | np.ndarray:
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise DecompressionError(f"invalid zstd frame: {e}") from e
    if declared not in (-1, expected_size):
        raise DecompressionError(
            f"zstd frame declares {declared} uncompressed bytes but the batch header says {expected_size}"
        )
    try:
        # The output buffer is the bound: without a declared size, any excess fails the call.
        arrow_zstd = arrow().zstd
        if arrow_zstd is not None:
            # Arrow's zstd takes whatever follows the frame (a skippable or an empty frame
            # does not change the size): check there is nothing.
            length = zstd_frame_length(frame)
            if 0 < length < len(frame):
                raise DecompressionError(
                    f"zstd batch is not one frame: {len(frame) - length} bytes follow its first frame")
            buf = arrow_zstd.decompress(frame, decompressed_size=expected_size, memory_pool=arrow().pool)
            return np.frombuffer(buf, np.uint8)
        out = _zstd_decompressor().decompress(
            frame, max_output_size=max(expected_size, 1), allow_extra_data=False)
    except (OSError, zstandard.ZstdError) as e:
        raise DecompressionError(
            f"zstd frame does not decompress to exactly the declared {expected_size} bytes: {e}"
        ) from e
    if len(out) != expected_size:
        raise DecompressionError(
            f"zstd frame decompressed to {len(out)} bytes but the batch header says {expected_size}"
        )
    return out


def _lz4_content_size(frame: bytes | memoryview) -> int:
    """The content size an LZ4 frame's header declares, or -1."""
    if len(frame) >= 15 and bytes(frame[:4]) == _LZ4_MAGIC and frame[4] & 0x08:
        return int.from_bytes(frame[6:14], "little")
    return -1


def _lz4_decompress(frame: bytes | memoryview, expected_size: int) -> np.ndarray:
    declared = _lz4_content_size(frame)
    if declared not in (-1, expected_size):
        raise DecompressionError(
            f"lz4 frame declares {declared} uncompressed bytes but the batch header says {expected_size}"
        )
    arrow_lz4 = arrow().lz4
    if declared == expected_size and arrow_lz4 is not None:
        try:
            buf = arrow_lz4.decompress(frame, decompressed_size=expected_size, memory_pool=arrow().pool)
        except OSError as e:
            raise DecompressionError(
                f"lz4 frame does not decompress to exactly the declared {expected_size} bytes: {e}"
            ) from e
        return np.frombuffer(buf, np.uint8)
    # cramjam decompresses straight into an array of the declared size and fails on more:
    # the bound is the buffer. (python-lz4's LZ4FrameDecompressor copied memoryview input
    # holding the GIL; cramjam releases it.) From glibc's heap: beside cramjam's own buffers,
    # payloads from jemalloc or mimalloc took a page fault every 4 KiB.
    import pyarrow as pa

    pool = pa.system_memory_pool()
    out = np.frombuffer(pa.allocate_buffer(max(1, expected_size), pool), np.uint8, count=expected_size)
    try:
        n = cramjam.lz4.decompress_into(frame, out)
    except cramjam.DecompressionError as e:
        raise DecompressionError(
            f"invalid lz4 frame, or one holding more than the declared {expected_size} bytes: {e}"
        ) from e
    if n != expected_size:
        raise DecompressionError(f"lz4 frame decompressed to {n} bytes but the batch header says {expected_size}")
    return out


REGISTRY.update({
    Codec.NONE: CodecFunctions("none", 0, _none_compress, _none_decompress),
    Codec.LZ4: CodecFunctions("lz4", 0, _lz4_compress, _lz4_decompress),
    Codec.ZSTD: CodecFunctions("zstd", 3, _zstd_compress, _zstd_decompress),
})
CODEC_NAMES = {codec: f.name for codec, f in REGISTRY.items()}
CODEC_BY_NAME = {name: codec for codec, name in CODEC_NAMES.items()}
DEFAULT_LEVELS = {codec: f.default_level for codec, f in REGISTRY.items()}
