"""Stores to run the commit tests on, and how to read a backup back as plain rows."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import fsspec_kbs
from fsspec_kbs.format import RecordColumns

#: Stores every commit test runs on, each a real server where it is remote.
STORES = ["local", "memory", "s3", "gcs", "azure"]


def store(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> tuple[str, dict]:
    """(root URL, storage options) of a fresh, empty location on store ``name``."""
    if name == "local":
        return str(tmp_path), {}
    if name == "memory":
        return f"memory://kbs-{uuid.uuid4().hex[:12]}", {}
    return request.getfixturevalue(f"{name}_root"), request.getfixturevalue(f"{name}_storage_options")


def cols(offsets: list[int], tag: str) -> RecordColumns:
    return RecordColumns.from_records([
        {"offset": o, "timestamp": 1_000 + o, "key": None, "value": f"{tag}-{o}".encode(), "headers": []}
        for o in offsets])


def rows(url: str, so: dict) -> list[tuple[str, int, int, bytes]]:
    """(topic, partition, offset, value) of every record, sorted."""
    t = fsspec_kbs.read_table(url, storage_options=so, columns=["topic", "partition", "offset", "value"])
    return sorted(zip(t.column("topic").to_pylist(), t.column("partition").to_pylist(),
                      t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))
