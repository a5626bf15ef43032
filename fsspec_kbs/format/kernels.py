"""Record (de)serialisation loops over numpy buffers, JIT-compiled with numba.

The very same functions run un-compiled when numba is missing or ``FSSPEC_KBS_NO_JIT=1``;
tests compare both paths. Every kernel is written so that the scan pass proves all reads are
in bounds before the fill pass copies anything (the fill pass does no checks).

Kernels allocate nothing (callers pass every output array), so they are compiled without
numba's runtime: with it, each array handed to a helper such as :func:`read_varint` was
reference-counted with atomic increments, ~65 ns per record, four times the record walk.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from typing import Any

import numpy as np

#: Whether kernels run compiled: numba is installed and ``FSSPEC_KBS_NO_JIT`` is not set.
#: numba itself is imported on the first kernel call, not here: ``import fsspec_kbs`` and
#: ``kbs --help`` stay fast, and compiled kernels come from numba's on-disk cache
#: (``cache=True``) after the first run in an environment.
JIT_ENABLED = (os.environ.get("FSSPEC_KBS_NO_JIT", "") not in ("1", "true", "yes")
               and importlib.util.find_spec("numba") is not None)

# ``_nrt=False``: no reference counting (see above); a kernel that allocated would fail to
# compile, not run slowly.
_OPTIONS = {"cache": True, "nogil": True, "_nrt": False}
_LAZY: list[_LazyKernel] = []
_lock = threading.RLock()
_compiled = False


class _LazyKernel:
    """A kernel until its first call: then numba is imported, every kernel defined so far gets
    its dispatcher, and each ``fsspec_kbs`` module global naming a lazy kernel is rebound to
    its dispatcher before anything compiles (a kernel calling another resolves it as a global
    at compile time). ``py_func`` is the plain Python function, as on a numba dispatcher."""

    def __init__(self, fn: Any, inline: bool, factory: Any = None) -> None:
        functools.update_wrapper(self, fn)
        self.py_func = fn
        self._inline = inline
        self._factory = factory  # builds the compiled function when it is not ``fn`` itself
        self._jit: Any = None
        _LAZY.append(self)

    def _build(self, numba: Any) -> Any:
        if self._factory is not None:
            return self._factory()
        options = dict(_OPTIONS, inline="always") if self._inline else _OPTIONS
        return numba.njit(**options)(self.py_func)

    def __call__(self, *args: Any) -> Any:
        if self._jit is None:
            compile_kernels()
        return self._jit(*args)

    def __getattr__(self, name: str) -> Any:  # numba dispatcher attributes (signatures, ...)
        if name.startswith("__") or name in ("_jit", "_factory", "_inline", "py_func"):
            raise AttributeError(name)
        if self._jit is None:
            compile_kernels()
        return getattr(self._jit, name)


def compile_kernels() -> None:
    """Import numba and turn every lazy kernel into its dispatcher (idempotent, thread-safe)."""
    global _compiled
    with _lock:
        if _compiled:
            return
        import numba

        for lazy in _LAZY:
            lazy._jit = lazy._build(numba)
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("fsspec_kbs"):
                space = mod.__dict__
                for name, value in list(space.items()):
                    if isinstance(value, _LazyKernel):
                        space[name] = value._jit
        _compiled = True


def _identity(fn):  # type: ignore[no-untyped-def]
    return fn


kernel = _identity
inline_kernel = _identity  # a small kernel inlined into its callers (per-field helpers)
if JIT_ENABLED:

    def kernel(fn):  # type: ignore[no-redef,no-untyped-def]
        if _compiled:
            import numba

            return numba.njit(**_OPTIONS)(fn)
        return _LazyKernel(fn, inline=False)

    def inline_kernel(fn):  # type: ignore[no-redef,no-untyped-def]
        if _compiled:
            import numba

            return numba.njit(inline="always", **_OPTIONS)(fn)
        return _LazyKernel(fn, inline=True)


def _copy_slices(dst, d0, src, s0, n):  # type: ignore[no-untyped-def]
    """``dst[d0:d0 + n] = src[s0:s0 + n]`` (the interpreted path: one numpy call)."""
    dst[d0 : d0 + n] = src[s0 : s0 + n]


def _compiled_copy_bytes():  # type: ignore[no-untyped-def]
    import numba
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _memcpy(typingctx, dst, d0, src, s0, n):  # type: ignore[no-untyped-def]
        # numba's slice assignment builds views and checks for overlap on each call, and
        # a byte loop does not vectorise (no alias information): both run at < 1 GB/s on
        # Kafka-sized fields. A plain memcpy of the range runs at memory speed.
        sig = numba.types.void(dst, d0, src, s0, n)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            dst_v, d0_v, src_v, s0_v, n_v = args
            d = context.make_array(signature.args[0])(context, builder, dst_v)
            s = context.make_array(signature.args[2])(context, builder, src_v)
            cgutils.raw_memcpy(builder, builder.gep(d.data, [d0_v]), builder.gep(s.data, [s0_v]), n_v, 1)

        return sig, codegen

    def copy_bytes(dst, d0, src, s0, n):  # type: ignore[no-untyped-def]
        """``dst[d0:d0 + n] = src[s0:s0 + n]`` for uint8 arrays; callers guarantee the bounds."""
        if n > 0:
            _memcpy(dst, np.int64(d0), src, np.int64(s0), np.int64(n))

    return numba.njit(inline="always", **_OPTIONS)(copy_bytes)


copy_bytes = _LazyKernel(_copy_slices, inline=True, factory=_compiled_copy_bytes) if JIT_ENABLED else _copy_slices

# Error codes returned by scan_records (the Python wrapper turns them into exceptions).
OK = 0
E_VARINT = 1
E_TRUNCATED = 2
E_LENGTH = 3
E_OFFSET_ORDER = 4
E_HEADER_COUNT = 5
E_HEADER_KEY_NULL = 6
E_TRAILING = 7
E_OFFSET_RANGE = 8
E_TIMESTAMP_RANGE = 9

INT64_MAX = 9223372036854775807
INT64_MIN = -9223372036854775807 - 1
_LOW63 = 0x7FFFFFFFFFFFFFFF
_LOW57 = 0x01FFFFFFFFFFFFFF


@inline_kernel
def read_varint(buf, pos, end):  # type: ignore[no-untyped-def]
    """Kafka zigzag varint at ``pos``; returns (value, next pos) or (0, -1) if malformed."""
    if pos < end:
        b = int(buf[pos])
        if b < 0x80:  # one byte: most deltas, counts and short lengths
            return (b >> 1) ^ -(b & 1), pos + 1
    result = 0
    shift = 0
    for i in range(10):
        if pos >= end:
            return 0, -1
        b = int(buf[pos])
        pos += 1
        if i == 9 and b > 1:
            return 0, -1  # more than 64 bits
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return ((result >> 1) & _LOW63) ^ -(result & 1), pos
        shift += 7
    return 0, -1


@kernel
def varint_size(v):  # type: ignore[no-untyped-def]
    v = int(v)  # int64 compiled; interpreted, keeps numpy int32 lengths from overflowing
    zz = (v << 1) ^ (v >> 63)
    n = 1
    while (zz & ~0x7F) != 0:
        zz = (zz >> 7) & _LOW57
        n += 1
    return n


@inline_kernel
def write_varint(out, pos, v):  # type: ignore[no-untyped-def]
    v = int(v)
    zz = (v << 1) ^ (v >> 63)
    while (zz & ~0x7F) != 0:
        out[pos] = (zz & 0x7F) | 0x80
        pos += 1
        zz = (zz >> 7) & _LOW57
    out[pos] = zz
    return pos + 1


@inline_kernel
def put_field(data, offsets, valid, r, buf, pos, n):  # type: ignore[no-untyped-def]
    """Row ``r`` of a nullable field: the ``n`` bytes at ``buf[pos]``, or null when ``n`` < 0.

    Fills ``data``, ``offsets[r + 1]`` and ``valid[r]``; returns the position after the bytes.
    Bounds are the caller's scan pass's job.
    """
    a = offsets[r]
    if n >= 0:
        copy_bytes(data, a, buf, pos, n)
        offsets[r + 1] = a + n
        valid[r] = True
        return pos + n
    offsets[r + 1] = a
    valid[r] = False
    return pos


@inline_kernel
def _signed32(w):  # type: ignore[no-untyped-def]
    """``w`` (0 <= w < 2^32) as the int32 with the same bits."""
    return w - ((w >> 31) << 32)


@inline_kernel
def _view_word(buf, at, last, keep):  # type: ignore[no-untyped-def]
    """The 4 bytes at ``buf[at]`` as a little-endian int32, only the first ``keep`` (any int,
    clamped to 0-4) kept. Reads clamp to ``buf[last]``, so a field at the end of the batch
    needs no separate (and slow: it kept LLVM from optimising the loop) tail path."""
    keep = min(max(keep, 0), 4)
    w = (int(buf[min(at, last)]) | (int(buf[min(at + 1, last)]) << 8)
         | (int(buf[min(at + 2, last)]) << 16) | (int(buf[min(at + 3, last)]) << 24))
    return _signed32(w & ((1 << (8 * keep)) - 1))


@inline_kernel
def put_view(views32, valid, r, buf, buf_index, pos, n):  # type: ignore[no-untyped-def]
    """Row ``r`` of a nullable ``binary_view`` field: the ``n`` bytes at ``buf[pos]``, or null.

    An Arrow view is 16 bytes (``views32[4r:4r + 4]``): the length, then the bytes inline
    (zero-padded) when at most 12, else a 4-byte prefix, the index of the data buffer
    (``buf_index``) and the offset in it. Written without branching on the length: which
    way a field goes is random, and a mispredicted branch here stalls the whole varint
    chain (it doubled the time per record). Returns the position after the bytes.
    """
    m = max(n, 0)
    last = len(buf) - 1
    v = 4 * r
    valid[r] = n >= 0
    views32[v] = m
    views32[v + 1] = _view_word(buf, pos, last, m)
    inline = m <= 12
    w2 = _view_word(buf, pos + 4, last, m - 4)
    w3 = _view_word(buf, pos + 8, last, m - 8)
    views32[v + 2] = w2 if inline else buf_index
    views32[v + 3] = w3 if inline else pos
    return pos + m


@kernel
def scan_records(buf, start, end, count, base_offset):  # type: ignore[no-untyped-def]
    """Validate ``count`` records in ``buf[start:end]`` and size their variable-length parts.

    Returns (code, error position, key bytes, value bytes, headers, header key bytes,
    header value bytes).
    """
    pos = start
    kb = 0
    vb = 0
    nh = 0
    hkb = 0
    hvb = 0
    prev_delta = -1
    ts = 0
    for i in range(count):
        rec = pos
        delta, pos = read_varint(buf, pos, end)
        if pos < 0:
            return E_VARINT, rec, 0, 0, 0, 0, 0
        if (i == 0 and delta != 0) or delta <= prev_delta:
            return E_OFFSET_ORDER, rec, 0, 0, 0, 0, 0
        if delta > INT64_MAX - base_offset:
            return E_OFFSET_RANGE, rec, 0, 0, 0, 0, 0
        prev_delta = delta
        at = pos
        d, pos = read_varint(buf, pos, end)
        if pos < 0:
            return E_VARINT, at, 0, 0, 0, 0, 0
        # Timestamps are running sums of deltas: a sum past int64 would wrap in the fill pass.
        if i > 0 and ((d > 0 and ts > INT64_MAX - d) or (d < 0 and ts < INT64_MIN - d)):
            return E_TIMESTAMP_RANGE, at, 0, 0, 0, 0, 0
        ts = d if i == 0 else ts + d
        for field in range(2):
            at = pos
            n, pos = read_varint(buf, pos, end)
            if pos < 0:
                return E_VARINT, at, 0, 0, 0, 0, 0
            if n < -1:
                return E_LENGTH, at, 0, 0, 0, 0, 0
            if n > 0:
                if n > end - pos:
                    return E_TRUNCATED, at, 0, 0, 0, 0, 0
                pos += n
                if field == 0:
                    kb += n
                else:
                    vb += n
        at = pos
        hc, pos = read_varint(buf, pos, end)
        if pos < 0:
            return E_VARINT, at, 0, 0, 0, 0, 0
        if hc < 0:
            return E_HEADER_COUNT, at, 0, 0, 0, 0, 0
        if hc > (end - pos) // 2:  # each header takes >= 2 bytes
            return E_TRUNCATED, at, 0, 0, 0, 0, 0
        for _h in range(hc):
            at = pos
            n, pos = read_varint(buf, pos, end)
            if pos < 0:
                return E_VARINT, at, 0, 0, 0, 0, 0
            if n == -1:
                return E_HEADER_KEY_NULL, at, 0, 0, 0, 0, 0
            if n < -1:
                return E_LENGTH, at, 0, 0, 0, 0, 0
            if n > end - pos:
                return E_TRUNCATED, at, 0, 0, 0, 0, 0
            pos += n
            hkb += n
            at = pos
            n, pos = read_varint(buf, pos, end)
            if pos < 0:
                return E_VARINT, at, 0, 0, 0, 0, 0
            if n < -1:
                return E_LENGTH, at, 0, 0, 0, 0, 0
            if n > 0:
                if n > end - pos:
                    return E_TRUNCATED, at, 0, 0, 0, 0, 0
                pos += n
                hvb += n
        nh += hc
    if pos != end:
        return E_TRAILING, pos, 0, 0, 0, 0, 0
    return OK, 0, kb, vb, nh, hkb, hvb


@inline_kernel
def put_record_head(buf, pos, i, r, base_offset, ts, offsets, timestamps):  # type: ignore[no-untyped-def]
    """Row ``r`` (record ``i`` of its batch): offset and timestamp from their deltas at ``pos``.

    ``ts`` is the previous record's timestamp (the first record's delta is absolute).
    Returns the position after both and the record's timestamp.
    """
    delta, pos = read_varint(buf, pos, pos + 10)
    offsets[r] = base_offset + delta
    d, pos = read_varint(buf, pos, pos + 10)
    ts = d if i == 0 else ts + d
    timestamps[r] = ts
    return pos, ts


@kernel
def fill_records(  # type: ignore[no-untyped-def]
    buf, start, count, base_offset, row, hrow,
    offsets, timestamps,
    key_offsets, key_data, key_valid,
    value_offsets, value_data, value_valid,
    header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid,
):
    """Decode records already validated by :func:`scan_records` into rows ``row…``.

    The ``*_offsets`` arrays must hold the running cursors at ``[row]`` / ``[hrow]``.
    """
    pos = start
    ts = 0
    for i in range(count):
        r = row + i
        pos, ts = put_record_head(buf, pos, i, r, base_offset, ts, offsets, timestamps)
        n, pos = read_varint(buf, pos, pos + 10)
        pos = put_field(key_data, key_offsets, key_valid, r, buf, pos, n)
        n, pos = read_varint(buf, pos, pos + 10)
        pos = put_field(value_data, value_offsets, value_valid, r, buf, pos, n)
        hc, pos = read_varint(buf, pos, pos + 10)
        for _h in range(hc):
            n, pos = read_varint(buf, pos, pos + 10)
            a = hkey_offsets[hrow]
            copy_bytes(hkey_data, a, buf, pos, n)
            pos += n
            hkey_offsets[hrow + 1] = a + n
            n, pos = read_varint(buf, pos, pos + 10)
            pos = put_field(hvalue_data, hvalue_offsets, hvalue_valid, hrow, buf, pos, n)
            hrow += 1
        header_offsets[r + 1] = header_offsets[r] + hc
    return pos


@kernel
def fill_views(  # type: ignore[no-untyped-def]
    buf, buf_index, count, base_offset, row, hrow,
    offsets, timestamps,
    key_views, key_valid,
    value_views, value_valid,
    header_offsets, hkey_views, hvalue_views, hvalue_valid,
):
    """:func:`fill_records` writing Arrow views into ``buf`` (data buffer ``buf_index``) instead
    of copying the bytes: records already validated by :func:`scan_records`, from ``buf[0]``.
    The ``*_views`` are int32 arrays, 4 entries per view.

    ``header_offsets[row]`` must hold the running header count.
    """
    pos = 0
    ts = 0
    for i in range(count):
        r = row + i
        pos, ts = put_record_head(buf, pos, i, r, base_offset, ts, offsets, timestamps)
        n, pos = read_varint(buf, pos, pos + 10)
        pos = put_view(key_views, key_valid, r, buf, buf_index, pos, n)
        n, pos = read_varint(buf, pos, pos + 10)
        pos = put_view(value_views, value_valid, r, buf, buf_index, pos, n)
        hc, pos = read_varint(buf, pos, pos + 10)
        for _h in range(hc):
            n, pos = read_varint(buf, pos, pos + 10)
            # Keys are never null: the validity written here is the value's, set next.
            pos = put_view(hkey_views, hvalue_valid, hrow, buf, buf_index, pos, n)
            n, pos = read_varint(buf, pos, pos + 10)
            pos = put_view(hvalue_views, hvalue_valid, hrow, buf, buf_index, pos, n)
            hrow += 1
        header_offsets[r + 1] = header_offsets[r] + hc
    return pos


@kernel
def _record_size(  # type: ignore[no-untyped-def]
    i, odelta, tdelta,
    key_offsets, key_valid, value_offsets, value_valid,
    header_offsets, hkey_offsets, hvalue_offsets, hvalue_valid,
):
    size = varint_size(odelta) + varint_size(tdelta)
    if key_valid[i]:
        n = key_offsets[i + 1] - key_offsets[i]
        size += varint_size(n) + n
    else:
        size += 1
    if value_valid[i]:
        n = value_offsets[i + 1] - value_offsets[i]
        size += varint_size(n) + n
    else:
        size += 1
    h0 = header_offsets[i]
    h1 = header_offsets[i + 1]
    size += varint_size(h1 - h0)
    for h in range(h0, h1):
        n = hkey_offsets[h + 1] - hkey_offsets[h]
        size += varint_size(n) + n
        if hvalue_valid[h]:
            n = hvalue_offsets[h + 1] - hvalue_offsets[h]
            size += varint_size(n) + n
        else:
            size += 1
    return size


@kernel
def plan_batches(  # type: ignore[no-untyped-def]
    offsets, timestamps,
    key_offsets, key_valid, value_offsets, value_valid,
    header_offsets, hkey_offsets, hvalue_offsets, hvalue_valid,
    max_bytes, max_records, cuts, sizes,
):
    """Greedy cut of rows into batches of at most ``max_bytes`` encoded bytes.

    Fills ``cuts`` and ``sizes`` (int64, ``len(offsets) + 1`` each) and returns the number
    of batches ``nb``: batch ``b`` holds rows ``cuts[b]:cuts[b + 1]`` and encodes to
    ``sizes[b]`` bytes. A single record larger than ``max_bytes`` gets a batch of its own.
    """
    n = len(offsets)
    nb = 0
    cuts[0] = 0
    start = 0
    cur = 0
    for i in range(n):
        if i == start:
            s = _record_size(i, 0, timestamps[i], key_offsets, key_valid, value_offsets,
                             value_valid, header_offsets, hkey_offsets, hvalue_offsets, hvalue_valid)
        else:
            s = _record_size(i, offsets[i] - offsets[start], timestamps[i] - timestamps[i - 1],
                             key_offsets, key_valid, value_offsets, value_valid,
                             header_offsets, hkey_offsets, hvalue_offsets, hvalue_valid)
            if cur + s > max_bytes or i - start >= max_records:
                sizes[nb] = cur
                nb += 1
                cuts[nb] = i
                start = i
                s = _record_size(i, 0, timestamps[i], key_offsets, key_valid, value_offsets,
                                 value_valid, header_offsets, hkey_offsets, hvalue_offsets,
                                 hvalue_valid)
                cur = 0
        cur += s
    if n > 0:
        sizes[nb] = cur
        nb += 1
        cuts[nb] = n
    return nb


@kernel
def encode_records(  # type: ignore[no-untyped-def]
    r0, r1, out,
    offsets, timestamps,
    key_offsets, key_data, key_valid,
    value_offsets, value_data, value_valid,
    header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid,
):
    """Encode rows ``r0:r1`` as one batch into ``out`` (sized by :func:`plan_batches`)."""
    pos = 0
    base = offsets[r0]
    for i in range(r0, r1):
        pos = write_varint(out, pos, offsets[i] - base)
        pos = write_varint(out, pos, timestamps[i] if i == r0 else timestamps[i] - timestamps[i - 1])
        if key_valid[i]:
            a = key_offsets[i]
            n = key_offsets[i + 1] - a
            pos = write_varint(out, pos, n)
            copy_bytes(out, pos, key_data, a, n)
            pos += n
        else:
            pos = write_varint(out, pos, -1)
        if value_valid[i]:
            a = value_offsets[i]
            n = value_offsets[i + 1] - a
            pos = write_varint(out, pos, n)
            copy_bytes(out, pos, value_data, a, n)
            pos += n
        else:
            pos = write_varint(out, pos, -1)
        h0 = header_offsets[i]
        h1 = header_offsets[i + 1]
        pos = write_varint(out, pos, h1 - h0)
        for h in range(h0, h1):
            a = hkey_offsets[h]
            n = hkey_offsets[h + 1] - a
            pos = write_varint(out, pos, n)
            copy_bytes(out, pos, hkey_data, a, n)
            pos += n
            if hvalue_valid[h]:
                a = hvalue_offsets[h]
                n = hvalue_offsets[h + 1] - a
                pos = write_varint(out, pos, n)
                copy_bytes(out, pos, hvalue_data, a, n)
                pos += n
            else:
                pos = write_varint(out, pos, -1)
    return pos
