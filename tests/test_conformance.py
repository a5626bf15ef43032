"""The shared conformance vectors: valid backups read exactly; corrupt ones fail clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fsspec_kbs
from fsspec_kbs.errors import (
    BadMagicError,
    ChecksumError,
    DecompressionError,
    IncompleteBackupError,
    InvalidNameError,
    KbsError,
    TruncatedSegmentError,
    UnsupportedCodecError,
    UnsupportedVersionError,
)
from fsspec_kbs.maintenance.validate import validate_backup
from tests.conftest import CONFORMANCE, load_expected, table_rows

pytestmark = pytest.mark.conformance

VALID = sorted(p.name for p in (CONFORMANCE / "valid").iterdir()) if (CONFORMANCE / "valid").is_dir() else []
CORRUPT_SEGMENT_CASES = {
    "bad-magic": (BadMagicError, 0),
    "bad-codec": (UnsupportedCodecError, 5),
    "batch-crc": (ChecksumError, None),
    "segment-crc": (ChecksumError, 24),
    "truncated": (TruncatedSegmentError, None),
    "size-lie": (DecompressionError, None),
}


@pytest.mark.parametrize("case", VALID or ["<missing>"])
def test_valid_backup_reads_expected_records(conformance: Path, case: str) -> None:
    table = fsspec_kbs.read_table(str(conformance / "valid" / case / "backup-1"))
    assert table.schema == fsspec_kbs.KAFKA_SCHEMA
    assert table_rows(table) == load_expected(conformance / "valid" / case / "expected.jsonl")


@pytest.mark.parametrize("case", VALID or ["<missing>"])
def test_rewriting_with_same_settings_gives_same_records(conformance: Path, case: str, tmp_path: Path) -> None:
    src = conformance / "valid" / case / "backup-1"
    manifest = json.loads((src / "manifest.json").read_text())
    table = fsspec_kbs.read_table(str(src))
    out = tmp_path / "backup-1"
    written = fsspec_kbs.write_table(
        str(out), table, compression=manifest["compression"]["algorithm"],
        level=manifest["compression"]["level"] or None, segment_max_records=300, batch_max_bytes=16 * 1024)
    assert written.statistics["records"] == manifest["statistics"]["records"]
    assert [(t.name, [p.partition for p in t.partitions]) for t in written.topics] == \
        [(t["name"], [p["partition"] for p in t["partitions"]]) for t in manifest["topics"]]
    assert table_rows(fsspec_kbs.read_table(str(out))) == load_expected(conformance / "valid" / case / "expected.jsonl")
    assert validate_backup(str(out), deep=True).ok


@pytest.mark.parametrize("case", sorted(CORRUPT_SEGMENT_CASES))
def test_corrupt_segment_raises_clear_error(conformance: Path, case: str) -> None:
    error, offset = CORRUPT_SEGMENT_CASES[case]
    url = str(conformance / "corrupt" / case / "backup-1")
    with pytest.raises(error) as info:
        fsspec_kbs.read_table(url)
    message = str(info.value)
    assert "segment-" in message and ".kbs" in message, message
    assert info.value.path is not None and info.value.path.endswith(".kbs")
    assert info.value.offset is not None and f"at byte {info.value.offset}" in message
    if offset is not None:
        assert info.value.offset == offset
    report = validate_backup(url, deep=True)
    assert not report.ok and len(report.defects) == 1


def test_corrupt_segment_without_checksums_still_caught(conformance: Path) -> None:
    with pytest.raises(DecompressionError, match="at byte 32"):
        fsspec_kbs.read_table(str(conformance / "corrupt" / "size-lie" / "backup-1"), verify_checksums=False)


def test_no_manifest_is_refused_unless_asked(conformance: Path) -> None:
    url = str(conformance / "corrupt" / "no-manifest" / "backup-1")
    with pytest.raises(IncompleteBackupError, match="manifest.json"):
        fsspec_kbs.read_table(url)
    table = fsspec_kbs.read_table(url, allow_incomplete=True)
    assert table_rows(table) == load_expected(conformance / "valid" / "zstd-v1.1" / "expected.jsonl")


def test_topic_traversal_is_refused(conformance: Path) -> None:
    with pytest.raises(InvalidNameError, match=r"\.\./\.\./etc") as info:
        fsspec_kbs.read_table(str(conformance / "corrupt" / "topic-traversal" / "backup-1"))
    assert "manifest.json" in str(info.value)


def test_future_version_is_refused(conformance: Path) -> None:
    with pytest.raises(UnsupportedVersionError, match="2.0") as info:
        fsspec_kbs.read_table(str(conformance / "corrupt" / "future-version" / "backup-1"))
    assert "manifest.json" in str(info.value)


def test_every_listed_case_is_covered(conformance: Path) -> None:
    cases = {c["case"] for c in json.loads((conformance / "corrupt" / "CASES.json").read_text())}
    assert cases == set(CORRUPT_SEGMENT_CASES) | {"no-manifest", "topic-traversal", "future-version"}


def test_skip_corrupt_segments_reports_them(conformance: Path, tmp_path: Path) -> None:
    src = conformance / "corrupt" / "batch-crc" / "backup-1"
    ds = fsspec_kbs.KbsDataset.open(str(src))
    scanner = ds.scanner(on_error="skip")
    table = scanner.to_table()
    assert table.num_rows == 1470 - 300
    assert len(scanner.errors) == 1 and isinstance(scanner.errors[0], KbsError)


def test_partial_manifest_version_1_0_prunes_by_headers(conformance: Path, tmp_path: Path) -> None:
    src = conformance / "valid" / "none-v1.0" / "backup-1"
    shutil.copytree(src, tmp_path / "backup-1")
    ds = fsspec_kbs.KbsDataset.open(str(tmp_path / "backup-1"))
    frags = ds.filter(topics="orders", partitions=0, start_offset=748).fragments()
    assert [f.seq for f in frags] == [2]
