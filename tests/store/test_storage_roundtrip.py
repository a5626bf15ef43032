"""The same contract on every storage: memory://, a local dir, moto S3, fake GCS, Azurite."""

from __future__ import annotations

import json
import uuid

import fsspec
import pyarrow as pa
import pytest

import fsspec_kbs
from fsspec_kbs.arrow.schema import HEADER_TYPE
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import BackupWriter, KbsBackup
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


def _cols(offsets: range) -> RecordColumns:
    return RecordColumns.from_records([
        {"offset": o, "timestamp": 1_000 + o, "key": None, "value": str(o).encode(), "headers": []} for o in offsets])


# markers on the params (not applied in the fixture), so that -m s3/gcs/azure selects them
@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)])
def root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    if request.param == "memory":
        return f"memory://kbs-{uuid.uuid4().hex}", {}
    if request.param == "local":
        return str(tmp_path), {}
    if request.param == "s3":
        return request.getfixturevalue("s3_root"), request.getfixturevalue("s3_storage_options")
    if request.param == "gcs":
        return request.getfixturevalue("gcs_root"), request.getfixturevalue("gcs_storage_options")
    return request.getfixturevalue("azure_root"), request.getfixturevalue("azure_storage_options")


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


def test_modes_append_overwrite(root: tuple[str, dict]) -> None:
    """create refuses an existing backup; append adds a segment; overwrite drops what it replaces."""
    base, opts = root
    url = f"{base}/backup-4"
    t1 = pa.table({"value": [b"a", b"b"]})
    fsspec_kbs.write_table(url, t1, topic="t", storage_options=opts)
    with pytest.raises(fsspec_kbs.CommitConflictError):
        fsspec_kbs.write_table(url, t1, topic="t", storage_options=opts)
    fsspec_kbs.write_table(url, pa.table({"value": [b"c"]}), topic="t", mode="append", storage_options=opts)
    rows = table_rows(fsspec_kbs.read_table(url, storage_options=opts))
    assert [(r["offset"], r["value"]) for r in rows] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert KbsBackup.open(url, opts).manifest.topics[0].partitions[0].segments == 2
    fsspec_kbs.write_table(url, pa.table({"value": [b"z"]}), topic="u", mode="overwrite", storage_options=opts)
    rows = table_rows(fsspec_kbs.read_table(url, storage_options=opts))
    assert [(r["topic"], r["value"]) for r in rows] == [("u", b"z")]
    fs, path = fsspec.core.url_to_fs(url, **opts)
    assert not fs.find(f"{path}/topics/t")
    assert validate_backup(url, opts, deep=True).ok


def test_resume_adopts_flushed_segments(root: tuple[str, dict], request: pytest.FixtureRequest) -> None:
    base, opts = root
    url = f"{base}/backup-5"
    w = BackupWriter(url, storage_options=opts, segment_max_records=10)
    w.write_columns("t", 0, _cols(range(25)))
    w.flush()  # segments on storage, no manifest: like a killed backup
    assert [(b.backup_id, b.complete) for b in fsspec_kbs.list_backups(base, opts)] == [("backup-5", False)]
    # A resume continues one writer's transaction: its id names the staging to adopt.
    w2 = BackupWriter(url, storage_options=opts, mode="resume", segment_max_records=10, txn_id=w.txn_id)
    assert w2.last_offset("t", 0) == 24
    w2.write_columns("t", 0, _cols(range(25, 30)))
    m = w2.commit()
    assert m.statistics["records"] == 30
    rows = table_rows(fsspec_kbs.read_table(url, storage_options=opts))
    assert [r["value"] for r in rows] == [str(i).encode() for i in range(30)]
    assert [(b.backup_id, b.complete) for b in fsspec_kbs.list_backups(base, opts)] == [("backup-5", True)]


def test_listing_follows_writes(root: tuple[str, dict], request: pytest.FixtureRequest) -> None:
    """What a listing showed once must not hide what was written after it (listing caches)."""
    base, opts = root
    fsspec_kbs.write_table(f"{base}/backup-6", pa.table({"value": [b"a"]}), topic="t", storage_options=opts)
    assert [b.backup_id for b in fsspec_kbs.list_backups(base, opts)] == ["backup-6"]
    fsspec_kbs.write_table(f"{base}/backup-7", pa.table({"value": [b"b"]}), topic="t", storage_options=opts)
    assert [b.backup_id for b in fsspec_kbs.list_backups(base, opts)] == ["backup-6", "backup-7"]


def test_kbs_protocol_over_store(root: tuple[str, dict]) -> None:
    base, opts = root
    url = f"{base}/backup-8"
    fsspec_kbs.write_table(url, sample_table(600), storage_options=opts, segment_max_records=100)
    fs = fsspec.filesystem("kbs", fo=url, target_options=opts, skip_instance_cache=True)
    assert sorted(fs.ls("", detail=False)) == ["manifest.json", "orders", "user.events-v2"]
    assert fs.ls("orders", detail=False) == ["orders/0", "orders/1"]
    target, _ = fsspec.core.url_to_fs(url, **opts)
    for e in fs.ls("orders/0", detail=True):
        if e["kind"] == "segment":
            assert e["size"] == target.size(e["target"])
            assert fs.cat_file(e["name"], start=0, end=4) == b"KBS1"
    got = [json.loads(x) for x in fs.cat("orders/1/records.jsonl").decode().splitlines()]
    assert [r["offset"] for r in got] == list(range(len(got))) and got
