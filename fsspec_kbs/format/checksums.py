"""CRC-32 (ISO-HDLC) per batch and CRC-64/XZ per segment.

Both come from fastcrc (Rust, SIMD folding): here ~13 GB/s over segments that are not in
cache and far more over cached batches, against ~8 GB/s for table-driven CRC-64 and ~5 GB/s
for ``zlib.crc32``. It releases the GIL, so checks on several decoding threads run at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from fastcrc import crc32 as _crc32
from fastcrc import crc64 as _crc64

from fsspec_kbs.format.kernels import kernel


def crc32(data: bytes | memoryview, value: int = 0) -> int:
    """CRC-32/ISO-HDLC, equal to ``zlib.crc32(data, value)``."""
    return _crc32.iso_hdlc(data, value) if value else _crc32.iso_hdlc(data)


def crc64_xz(data: bytes | memoryview, value: int | None = None) -> int:
    """CRC-64/XZ (ECMA-182, reflected); pass the previous result as ``value`` to continue."""
    if value is None:
        return _crc64.xz(data)
    return _crc64.xz(data, value)


# CRC combination (as zlib's crc32_combine): the CRC-64 of a concatenation from the CRC-64s
# of its parts, so that decoding threads check their chunks' shares while the bytes are in
# cache and the consumer joins the shares in order. Polynomials are reflected: bit 63 is x^0.
_POLY64 = np.uint64(0xC96C5795D7870F42)
_X0 = np.uint64(1 << 63)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


@kernel
def _mult_mod_p(a, b):  # type: ignore[no-untyped-def]
    """a(x) * b(x) modulo the CRC-64/XZ polynomial (a != 0)."""
    m = _X0
    p = _ZERO
    while True:
        if a & m:
            p ^= b
            if (a & (m - _ONE)) == _ZERO:
                break
        m >>= _ONE
        b = (b >> _ONE) ^ _POLY64 if b & _ONE else b >> _ONE
    return p


@functools.cache  # computed on first use (it compiles _mult_mod_p), then shared
def _powers() -> np.ndarray:
    """x^(2^k) modulo the polynomial, for k = 0..63."""
    table = np.zeros(64, dtype=np.uint64)
    table[0] = np.uint64(1 << 62)  # x^1
    for k in range(1, 64):
        table[k] = _mult_mod_p(table[k - 1], table[k - 1])
    return table


@kernel
def _combine(crc1, crc2, len2, table):  # type: ignore[no-untyped-def]
    p = _X0
    n = len2
    k = 3  # x^(8 * len2): one byte is eight shifts
    while n:
        if n & 1:
            p = _mult_mod_p(table[k & 63], p)
        n >>= 1
        k += 1
    return _mult_mod_p(p, crc1) ^ crc2


def crc64_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-64/XZ of ``A + B`` from ``crc64_xz(A)``, ``crc64_xz(B)`` and ``len(B)``."""
    if len2 <= 0:
        return crc1
    return int(_combine(np.uint64(crc1), np.uint64(crc2), np.int64(len2), _powers()))


@kernel
def _join_all(shares, lengths, table):  # type: ignore[no-untyped-def]
    crc = _ZERO
    for i in range(len(shares)):
        if lengths[i] > 0:
            crc = _combine(crc, shares[i], lengths[i], table)
    return crc


def crc64_join(shares: Sequence[int], lengths: Sequence[int]) -> int:
    """CRC-64/XZ of consecutive parts from each part's ``crc64_xz`` and length, in one call
    (a segment's chunks are joined once, at its end, not chunk by chunk on the consumer)."""
    if not shares:
        return 0
    return int(_join_all(np.array(shares, dtype=np.uint64), np.array(lengths, dtype=np.int64), _powers()))
