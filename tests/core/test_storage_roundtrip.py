"""The same contract on every storage: memory://, a local dir, moto S3, fake GCS."""

from __future__ import annotations

import uuid

import fsspec
import pyarrow as pa
import pytest

import fsspec_kbs
from fsspec_kbs.arrow.schema import HEADER_TYPE
from fsspec_kbs.validate import validate_backup
from tests.conftest import table_rows


def sample_table(n: int = 2000) -> pa.Table:
    rows = {
        "topic": ["orders" if i % 3 else "user.events-v2" for i in range(n)],
        "partition": [i % 2 for i in range(n)],
        "key": [None if i % 7 == 0 else f"user-{i % 50}".encode() for i in range(n)],
        "value": [None if i % 11 == 0 else (b"x" * (i % 300)) for i in range(n)],
        "timestamp": pa.array([1_700_000_000_000 + (i * 37) % 5000 - 2500 for i in range(n)],
                              pa.timestamp("ms", tz="UTC")),
        "headers": pa.array(
            [[{"key": "trace", "value": str(i).encode()}, {"key": "n", "value": None}] if i % 5 == 0 else []
             for i in range(n)], pa.list_(HEADER_TYPE)),
    }
    return pa.table(rows)


@pytest.fixture(params=["memory", "local", "s3", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    if request.param == "memory":
        return f"memory://kbs-{uuid.uuid4().hex}", {}
    if request.param == "local":
        return str(tmp_path), {}
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
        return request.getfixturevalue("s3_root"), request.getfixturevalue("s3_storage_options")
    request.applymarker(pytest.mark.gcs)
    return request.getfixturevalue("gcs_root"), request.getfixturevalue("gcs_storage_options")


def test_write_read_identical(root: tuple[str, dict]) -> None:
    base, opts = root
    table = sample_table()
    url = f"{base}/backup-1"
    manifest = fsspec_kbs.write_table(url, table, storage_options=opts, segment_max_records=250,
                                      batch_max_bytes=4096)
    assert manifest.statistics["records"] == table.num_rows
    assert manifest.statistics["segments"] > 4
    back = fsspec_kbs.read_table(url, storage_options=opts)
    rows = table_rows(back)
    assert len(rows) == table.num_rows
    # offsets were assigned densely per partition, in input order
    for (t, p) in {(r["topic"], r["partition"]) for r in rows}:
        offs = [r["offset"] for r in rows if (r["topic"], r["partition"]) == (t, p)]
        assert offs == list(range(len(offs)))
    want = table.to_pylist()
    got_values = sorted((r["key"] or b"", r["value"] or b"") for r in rows)
    assert got_values == sorted((r["key"] or b"", r["value"] or b"") for r in want)
    assert validate_backup(url, opts, deep=True).ok
    listing = fsspec_kbs.list_backups(base, opts)
    assert [(b.backup_id, b.complete) for b in listing] == [("backup-1", True)]


def test_reader_streams_batches(root: tuple[str, dict]) -> None:
    base, opts = root
    url = f"{base}/backup-2"
    fsspec_kbs.write_table(url, sample_table(3000), storage_options=opts, segment_max_records=500)
    reader = fsspec_kbs.open_reader(url, topics="orders", storage_options=opts, batch_size=100)
    assert isinstance(reader, pa.RecordBatchReader)
    sizes = [b.num_rows for b in reader]
    assert max(sizes) <= 100 and sum(sizes) == 2000


def test_interrupted_write_leaves_no_manifest(root: tuple[str, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    base, opts = root
    url = f"{base}/backup-3"
    from fsspec_kbs.store import writer as writer_mod

    calls = {"n": 0}
    real = writer_mod.put_file

    def failing_put(fs, path, data):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("injected: storage went away")
        real(fs, path, data)

    monkeypatch.setattr(writer_mod, "put_file", failing_put)
    with pytest.raises(OSError, match="injected"):
        fsspec_kbs.write_table(url, sample_table(), storage_options=opts, segment_max_records=100)
    fs, path = fsspec.core.url_to_fs(url, **opts)
    assert not fs.exists(f"{path}/manifest.json")
    with pytest.raises(fsspec_kbs.BackupNotFoundError):
        fsspec_kbs.read_table(url, storage_options=opts)
