"""CRC-32 (ISO-HDLC) per batch and CRC-64/XZ per segment."""

from __future__ import annotations

import zlib

import anycrc

_CRC64_XZ = anycrc.Model("CRC64-XZ")


def crc32(data: bytes | memoryview, value: int = 0) -> int:
    """CRC-32/ISO-HDLC, as ``zlib.crc32``."""
    return zlib.crc32(data, value)


def crc64_xz(data: bytes | memoryview, value: int | None = None) -> int:
    """CRC-64/XZ (ECMA-182, reflected); pass the previous result as ``value`` to continue."""
    if value is None:
        return _CRC64_XZ.calc(data)
    return _CRC64_XZ.calc(data, value)
