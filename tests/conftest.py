"""Shared fixtures: conformance vectors, moto S3, fake GCS, Azurite; service fixtures live in tests/fixtures/."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

# gcsfs >= 2025 probes every bucket over gRPC for "hierarchical namespace" support, which a
# fake-gcs-server cannot answer (60 s time-outs per call); the plain JSON API is what we test.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import pytest

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.spark",
    "tests.fixtures.kafka",
    "tests.fixtures.gcs",
    "tests.fixtures.azure",
]

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CONFORMANCE = SHARED / "conformance"


@pytest.fixture(scope="session")
def conformance() -> Path:
    """``../shared/conformance``; tests using it skip (saying why) where it is absent."""
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance vectors not found at {CONFORMANCE} (CI has ../shared beside the clone)")
    return CONFORMANCE


def load_expected(path: Path) -> list[dict]:
    """expected.jsonl rows, bytes decoded from base64."""
    rows = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        rows.append({
            "topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "timestamp": r["timestamp"],
            "key": None if r["key"] is None else base64.b64decode(r["key"]),
            "value": None if r["value"] is None else base64.b64decode(r["value"]),
            "headers": [(k, None if v is None else base64.b64decode(v)) for k, v in r["headers"]],
        })
    return rows


def table_rows(table) -> list[dict]:  # type: ignore[no-untyped-def]
    """Rows of a Kafka-schema Arrow table in the form of :func:`load_expected`, sorted."""
    ts = table.column("timestamp").cast("int64").to_pylist()
    rows = []
    for i, r in enumerate(table.to_pylist()):
        rows.append({
            "topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "timestamp": ts[i],
            "key": r["key"], "value": r["value"],
            "headers": [(h["key"], h["value"]) for h in (r["headers"] or [])],
        })
    rows.sort(key=lambda r: (r["topic"], r["partition"], r["offset"]))
    return rows
