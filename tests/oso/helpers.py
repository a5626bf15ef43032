"""Shared helpers of the oso-native tests."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

CODECS = ("none", "lz4", "zstd")


def vector(conformance: Path, codec: str) -> Path:
    return conformance / "oso-native" / codec / "oso-backup-1"


def copy_vector(conformance: Path, codec: str, dst: Path) -> Path:
    """A writable copy of a vector backup (same backup id)."""
    out = dst / codec / "oso-backup-1"
    shutil.copytree(vector(conformance, codec), out)
    for p in out.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    out.chmod(0o755)
    return out


def manifest(backup: Path) -> dict:
    return json.loads((backup / "manifest.json").read_text())


def segment_files(backup: Path) -> list[Path]:
    m = manifest(backup)
    return [backup.parent / s["key"] for t in m["topics"] for p in t["partitions"] for s in p["segments"]]


def refresh_crc(data: bytearray) -> bytearray:
    """Recompute the CRC-32 footer, so that a deliberate defect gets past the checksum."""
    data[-8:-4] = zlib.crc32(bytes(data[:-8])).to_bytes(4, "little")
    return data
