"""BackupWriter: rolling, segment_index, statistics, modes, name checks, atomic manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import fsspec_kbs
from fsspec_kbs.errors import CommitConflictError, InvalidNameError, OffsetOrderError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.store import BackupWriter, KbsBackup
from tests.conftest import table_rows


def cols(offsets: list[int], size: int = 100, ts0: int = 1_000) -> RecordColumns:
    return RecordColumns.from_records([
        {"offset": o, "timestamp": ts0 + i, "key": f"k{o}".encode(), "value": bytes([o % 256]) * size, "headers": []}
        for i, o in enumerate(offsets)
    ])


def test_rolls_by_record_count_and_indexes_segments(tmp_path: Path) -> None:
    w = BackupWriter(str(tmp_path / "b"), segment_max_records=40, batch_max_bytes=1000)
    w.write_columns("t", 0, cols(list(range(0, 100))))
    w.write_columns("t", 0, cols(list(range(200, 250)), ts0=500))
    m = w.commit()
    p = m.topics[0].partitions[0]
    assert [s.records for s in p.segment_index] == [40, 40, 40, 30]
    assert [s.file for s in p.segment_index] == [f"segment-0000000{i}.kbs" for i in range(4)]
    assert p.segment_index[2].first_offset == 80 and p.segment_index[2].last_offset == 219
    assert (p.first_offset, p.last_offset, p.records) == (0, 249, 150)
    assert m.time_range == {"earliest_timestamp": 500, "latest_timestamp": 1099}
    files = sorted((tmp_path / "b/topics/t/0").glob("*.kbs"))
    assert [f.stat().st_size for f in files] == [s.size_bytes for s in p.segment_index]
    # A batch index (kbs-format.md §7) beside each segment, named by the manifest's index_crc32.
    indexes = sorted((tmp_path / "b/topics/t/0").glob("*.index"))
    assert [f.name for f in indexes] == [f"segment-0000000{i}.index" for i in range(4)]
    assert [crc32(f.read_bytes()) for f in indexes] == [s.index_crc32 for s in p.segment_index]
    assert m.statistics["compressed_bytes"] == sum(s.size_bytes for s in p.segment_index)
    doc = json.loads((tmp_path / "b/manifest.json").read_text())
    assert doc["version"] == "1.2" and doc["statistics"]["records"] == 150


def test_rolls_by_size(tmp_path: Path) -> None:
    w = BackupWriter(str(tmp_path / "b"), compression="none", segment_max_bytes=5000, batch_max_bytes=1000)
    w.write_columns("t", 3, cols(list(range(200))))
    m = w.commit()
    sizes = [s.size_bytes for s in m.topics[0].partitions[0].segment_index]
    assert len(sizes) > 3 and all(s < 5000 + 1100 for s in sizes)


def test_offsets_must_increase(tmp_path: Path) -> None:
    w = BackupWriter(str(tmp_path / "b"))
    w.write_columns("t", 0, cols([5, 6]))
    with pytest.raises(OffsetOrderError):
        w.write_columns("t", 0, cols([6]))
    with pytest.raises(OffsetOrderError):
        w.write_columns("t", 1, cols([3, 2]))


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", ".", "..", "x" * 250, "nul\0"])
def test_illegal_topic_names_rejected_on_write(tmp_path: Path, bad: str) -> None:
    w = BackupWriter(str(tmp_path / "b"))
    with pytest.raises(InvalidNameError):
        w.write_columns(bad, 0, cols([1]))
    with pytest.raises(InvalidNameError):
        fsspec_kbs.write_table(str(tmp_path / "c"), pa.table({"value": [b"x"]}), topic=bad)


def test_illegal_backup_id_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError):
        BackupWriter(str(tmp_path / "bad id"))


def test_modes(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    t1 = pa.table({"value": [b"a", b"b"]})
    fsspec_kbs.write_table(url, t1, topic="t")
    with pytest.raises(CommitConflictError):
        fsspec_kbs.write_table(url, t1, topic="t")
    fsspec_kbs.write_table(url, pa.table({"value": [b"c"]}), topic="t", mode="append")
    rows = table_rows(fsspec_kbs.read_table(url))
    assert [(r["offset"], r["value"]) for r in rows] == [(0, b"a"), (1, b"b"), (2, b"c")]
    m = KbsBackup.open(url).manifest
    assert m.topics[0].partitions[0].segments == 2
    with pytest.raises(OffsetOrderError):
        fsspec_kbs.write_table(url, pa.table({"value": [b"d"], "offset": [1]}), topic="t", mode="append")
    fsspec_kbs.write_table(url, pa.table({"value": [b"z"]}), topic="u", mode="overwrite")
    rows = table_rows(fsspec_kbs.read_table(url))
    assert [(r["topic"], r["value"]) for r in rows] == [("u", b"z")]
    assert not (tmp_path / "b/topics/t").exists()


def test_unknown_manifest_fields_survive_append(tmp_path: Path) -> None:
    url = tmp_path / "b"
    fsspec_kbs.write_table(str(url), pa.table({"value": [b"a"]}), topic="t")
    doc = json.loads((url / "manifest.json").read_text())
    doc["x-custom"] = {"keep": True}
    (url / "manifest.json").write_text(json.dumps(doc))
    fsspec_kbs.write_table(str(url), pa.table({"value": [b"b"]}), topic="t", mode="append")
    assert json.loads((url / "manifest.json").read_text())["x-custom"] == {"keep": True}


def test_abort_removes_written_segments(tmp_path: Path) -> None:
    url = tmp_path / "b"
    with pytest.raises(RuntimeError), BackupWriter(str(url), segment_max_records=10) as w:
        w.write_columns("t", 0, cols(list(range(50))))
        raise RuntimeError("boom")
    assert not (url / "manifest.json").exists()
    assert list((url / "topics/t/0").glob("*.kbs")) == []


def test_resume_adopts_segments_of_incomplete_backup(tmp_path: Path) -> None:
    url = str(tmp_path / "b")
    w = BackupWriter(url, segment_max_records=10)
    w.write_columns("t", 0, cols(list(range(25))))
    w.flush()  # 3 segments staged, no manifest: like a killed backup
    # The resumed run continues the same transaction (kbs backup keeps its id in the checkpoint).
    w2 = BackupWriter(url, mode="resume", segment_max_records=10, txn_id=w.txn_id)
    assert w2.last_offset("t", 0) == 24
    w2.write_columns("t", 0, cols(list(range(25, 30)), ts0=9000))
    m = w2.commit()
    assert m.statistics["records"] == 30 and m.statistics["segments"] == 4
    assert m.time_range["earliest_timestamp"] == 1000 and m.time_range["latest_timestamp"] == 9004
    assert [r["offset"] for r in table_rows(fsspec_kbs.read_table(url))] == list(range(30))
    assert m.statistics["uncompressed_bytes"] == sum(
        b.uncompressed_size for ref in KbsBackup.open(url).segments()
        for b in KbsBackup.open(url).open_segment(ref).batches())


def test_write_table_from_pandas_with_strings(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"key": ["a", None], "value": ["héllo", "x"], "partition": [1, 1],
                       "timestamp": pd.to_datetime([1_700_000_000_000, 1_700_000_000_001], unit="ms", utc=True)})
    fsspec_kbs.write_table(str(tmp_path / "b"), df, topic="strings")
    out = fsspec_kbs.read_pandas(str(tmp_path / "b"))
    assert out["value"].tolist() == ["héllo".encode(), b"x"]
    assert out["key"].tolist() == [b"a", None]
    assert out["partition"].tolist() == [1, 1]
    assert out["timestamp"].iloc[0] == pd.Timestamp(1_700_000_000_000, unit="ms", tz="UTC")


def test_large_offsets(tmp_path: Path) -> None:
    big = 2**62
    w = BackupWriter(str(tmp_path / "b"))
    w.write_columns("t", 0, cols([big, big + 2**40]))
    w.commit()
    assert fsspec_kbs.read_table(str(tmp_path / "b")).column("offset").to_pylist() == [big, big + 2**40]


def test_deep_validate_checks_batch_crc_under_a_valid_crc64(tmp_path: Path) -> None:
    import struct

    from fsspec_kbs.format.checksums import crc64_xz
    from fsspec_kbs.maintenance.validate import validate_backup

    url = tmp_path / "b"
    fsspec_kbs.write_table(str(url), pa.table({"value": [b"a" * 50, b"b" * 50]}), topic="t")
    seg = url / "topics/t/0/segment-00000000.kbs"
    buf = bytearray(seg.read_bytes())
    struct.pack_into("<I", buf, 32 + 20, 0xDEADBEEF)  # wrong CRC-32 of batch 0 ...
    crc = crc64_xz(bytes(buf[32:-16]))
    struct.pack_into("<Q", buf, 24, crc)  # ... under a CRC-64 that matches
    seg.write_bytes(bytes(buf))
    doc = json.loads((url / "manifest.json").read_text())
    doc["topics"][0]["partitions"][0]["segment_index"][0]["crc64"] = crc
    (url / "manifest.json").write_text(json.dumps(doc))
    assert validate_backup(str(url)).ok  # quick: sizes, headers and footers agree
    report = validate_backup(str(url), deep=True)
    assert [d.error for d in report.defects] == ["ChecksumError"]
    assert "CRC-32" in report.defects[0].message and "at byte 52" in report.defects[0].message


def test_compression_threads_write_the_same_bytes(tmp_path: Path) -> None:
    """Batches encoded and compressed on the pool come back in order: same files as one thread."""
    data = cols(list(range(0, 3000, 3)), size=700)
    for threads in (1, 3):
        with BackupWriter(str(tmp_path / f"b{threads}"), batch_max_bytes=4000, segment_max_bytes=3000,
                          compress_threads=threads) as w:
            w.write_columns("t", 0, data)
    one = sorted((tmp_path / "b1/topics/t/0").iterdir())
    three = sorted((tmp_path / "b3/topics/t/0").iterdir())
    assert len(one) > 3 and [f.name for f in one] == [f.name for f in three]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(one, three, strict=True))


def test_a_failed_compression_breaks_the_writer_instead_of_leaving_a_hole(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A batch lost to an error must never be committed around: the writer refuses to commit
    (and to take more records) until it is aborted."""
    import fsspec_kbs.store.writer as writer_mod
    from fsspec_kbs.errors import KbsError
    from fsspec_kbs.format import RecordColumns

    real, calls = writer_mod.compress_batch, {"n": 0}

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_mod, "compress_batch", flaky)
    for codec, threads in (("none", 1), ("zstd", 2)):
        calls["n"] = 0
        w = writer_mod.BackupWriter(str(tmp_path / codec), compression=codec, compress_threads=threads)
        raised = False
        for i in range(4):
            recs = [dict(offset=10 * i + j, timestamp=1, key=b"k", value=b"v" * 10, headers=[]) for j in range(10)]
            try:
                w.write_columns("t", 0, RecordColumns.from_records(recs))
            except (MemoryError, KbsError):
                raised = True
        with pytest.raises((MemoryError, KbsError)):
            w.commit()
        assert raised or calls["n"] >= 2
        with pytest.raises(KbsError, match="failed earlier"):
            w.commit()
        w.abort()
        assert not (tmp_path / codec / "manifest.json").exists()
