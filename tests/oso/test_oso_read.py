"""Reading the oso-native conformance vectors through every reading entry point but Spark/fs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import fsspec_kbs
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import IncompleteBackupError, ManifestError
from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import list_backups, open_backup
from fsspec_kbs.store.oso_backup import OsoBackup
from tests.conftest import load_expected, table_rows
from tests.oso.helpers import CODECS, copy_vector, manifest, vector

pytestmark = pytest.mark.conformance


@pytest.mark.parametrize("codec", CODECS)
def test_read_table_matches_expected(conformance: Path, codec: str) -> None:
    backup = vector(conformance, codec)
    expected = load_expected(backup.parent / "expected.jsonl")
    table = fsspec_kbs.read_table(str(backup))
    assert table.schema == fsspec_kbs.KAFKA_SCHEMA
    assert table_rows(table) == expected
    # the vectors carry null header values; they must survive as nulls
    assert any(v is None for r in expected for _, v in r["headers"])


@pytest.mark.parametrize("codec", CODECS)
def test_layout_detected_and_segments_from_manifest(conformance: Path, codec: str) -> None:
    backup = open_backup(str(vector(conformance, codec)))
    assert isinstance(backup, OsoBackup) and backup.layout == "oso"
    m = manifest(vector(conformance, codec))
    refs = backup.segments()
    assert len(refs) == sum(len(p["segments"]) for t in m["topics"] for p in t["partitions"])
    for ref in refs:
        assert ref.layout == "oso" and ref.codec == codec
        assert ref.min_timestamp is None and ref.max_timestamp is None  # first/last are not bounds
        assert Path(ref.path).is_file()


@pytest.mark.parametrize("codec", CODECS)
def test_filters_and_offset_pruning(conformance: Path, codec: str) -> None:
    url = str(vector(conformance, codec))
    expected = load_expected(vector(conformance, codec).parent / "expected.jsonl")
    ds = fsspec_kbs.KbsDataset.open(url).filter(topics="orders", partitions=0, start_offset=400, end_offset=500)
    frags = ds.fragments()
    assert len(frags) == 1 and frags[0].first_offset <= 400 <= frags[0].last_offset
    want = [r for r in expected if r["topic"] == "orders" and r["partition"] == 0 and 400 <= r["offset"] < 500]
    assert table_rows(ds.to_table()) == want
    # time filters filter rows but cannot prune on first/last timestamps
    t0 = sorted(r["timestamp"] for r in expected)[len(expected) // 2]
    got = table_rows(fsspec_kbs.read_table(url, start_time=t0))
    assert got == [r for r in expected if r["timestamp"] >= t0]


@pytest.mark.parametrize("codec", CODECS)
def test_cli_cat_describe_validate(conformance: Path, codec: str) -> None:
    url = str(vector(conformance, codec))
    expected = (vector(conformance, codec).parent / "expected.jsonl").read_text().splitlines()
    runner = CliRunner()
    res = runner.invoke(cli, ["cat", url])
    assert res.exit_code == 0, res.output
    assert [json.loads(line) for line in res.stdout.splitlines()] == [json.loads(line) for line in expected]

    res = runner.invoke(cli, ["describe", url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["layout"] == "oso" and doc["records"] == len(expected) and doc["gaps"] == []
    assert doc["compression"] == {"algorithm": codec}
    res = runner.invoke(cli, ["describe", url])
    assert res.exit_code == 0 and "oso" in res.stdout

    for args in (["validate", url], ["validate", url, "--deep", "--json"]):
        res = runner.invoke(cli, args)
        assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["records_checked"] == len(expected)


def test_describe_reports_gaps_and_ignores_unknown_fields(conformance: Path, tmp_path: Path) -> None:
    backup = copy_vector(conformance, "zstd", tmp_path)
    m = manifest(backup)
    m["topics"][1]["original_partition_count"] = 3
    m["topics"][1]["partitions"][0]["gaps"] = [
        {"start_offset": 0, "end_offset": 1, "reason": "retention", "detected_at": 1761991200000}]
    m["future_field"] = {"x": 1}
    (backup / "manifest.json").write_text(json.dumps(m))
    info = open_backup(str(backup)).describe()
    assert info.gaps == [{"topic": "orders", "partition": 0, "start_offset": 0, "end_offset": 1,
                             "reason": "retention", "detected_at": 1761991200000}]
    res = CliRunner().invoke(cli, ["describe", str(backup)])
    assert res.exit_code == 0 and "retention" in res.output
    assert fsspec_kbs.read_table(str(backup)).num_rows == 815


def test_list_backups_marks_oso_complete(conformance: Path, tmp_path: Path) -> None:
    copy_vector(conformance, "lz4", tmp_path)
    found = list_backups(str(tmp_path / "lz4"))
    assert [(b.backup_id, b.complete) for b in found] == [("oso-backup-1", True)]


def test_incomplete_oso_backup(conformance: Path, tmp_path: Path) -> None:
    backup = copy_vector(conformance, "zstd", tmp_path)
    expected = load_expected(vector(conformance, "zstd").parent / "expected.jsonl")
    (backup / "manifest.json").unlink()
    with pytest.raises(IncompleteBackupError, match="no manifest.json"):
        fsspec_kbs.read_table(str(backup))
    b = open_backup(str(backup), allow_incomplete=True)
    assert b.layout == "oso" and not b.complete
    assert table_rows(fsspec_kbs.read_table(str(backup), allow_incomplete=True)) == expected


def test_manifest_key_relative_to_root_even_if_renamed(conformance: Path, tmp_path: Path) -> None:
    """Keys start with the backup id; a copy under another directory name still resolves."""
    backup = copy_vector(conformance, "none", tmp_path)
    moved = backup.rename(backup.parent / "renamed-copy")
    assert fsspec_kbs.read_table(str(moved)).num_rows == 815


def test_bad_manifest_fields(conformance: Path, tmp_path: Path) -> None:
    backup = copy_vector(conformance, "none", tmp_path)
    m = manifest(backup)
    m["topics"][0]["partitions"][0]["segments"][0]["key"] = "oso-backup-1/../../etc/passwd"
    (backup / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="illegal segment key"):
        open_backup(str(backup))
    m = manifest(vector(conformance, "none"))
    del m["topics"][1]["partitions"][0]["segments"][1]["start_offset"]
    (backup / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="start_offset"):
        open_backup(str(backup))


@pytest.mark.s3
def test_s3(conformance: Path, s3_root: str, s3_storage_options: dict) -> None:
    """The same vector on a real (moto) S3 server: detection and reading over fsspec."""
    import fsspec

    fs = fsspec.filesystem("s3", **s3_storage_options)
    src = vector(conformance, "lz4")
    fs.put(str(src), f"{s3_root}/oso-backup-1", recursive=True)
    url = f"{s3_root}/oso-backup-1"
    expected = load_expected(src.parent / "expected.jsonl")
    assert table_rows(fsspec_kbs.read_table(url, storage_options=s3_storage_options)) == expected
    report = validate_backup(url, s3_storage_options, deep=True)
    assert report.ok and report.records_checked == len(expected)
