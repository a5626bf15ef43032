"""The inspection commands: ls, describe, validate (exit codes), cat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsspec_kbs.cli.main import cli
from tests.conftest import load_expected


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_console_script_is_installed() -> None:
    proc = subprocess.run([sys.executable, "-m", "fsspec_kbs.cli.main", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "validate" in proc.stdout and "describe" in proc.stdout


def test_describe_and_ls(conformance: Path) -> None:
    url = str(conformance / "valid" / "zstd-v1.1" / "backup-1")
    code, out, _ = run("describe", "--json", url)
    assert code == 0
    doc = json.loads(out)
    assert doc["records"] == 1470 and doc["complete"] is True
    assert [(p["topic"], p["partition"], p["records"]) for p in doc["partitions"]] == [
        ("orders", 0, 900), ("orders", 1, 450), ("user.events-v2", 0, 120)]
    assert doc["compression_ratio"] > 1
    code, out, _ = run("describe", url)
    assert code == 0 and "orders" in out and "1,470" in out
    code, out, _ = run("ls", "--json", str(conformance / "valid" / "zstd-v1.1"))
    assert json.loads(out)[0]["backup_id"] == "backup-1"


@pytest.mark.parametrize("deep", [False, True])
def test_validate_exit_codes(conformance: Path, deep: bool) -> None:
    flags = ["--deep"] if deep else []
    code, out, _ = run("validate", *flags, str(conformance / "valid" / "lz4-v1.1" / "backup-1"))
    assert code == 0 and "OK" in out
    for case in ("truncated", "bad-magic", "future-version", "topic-traversal", "no-manifest"):
        code, out, err = run("validate", *flags, str(conformance / "corrupt" / case / "backup-1"))
        assert code == 1, (case, out, err)
        assert "FAILED" in out and "DEFECT" in err


def test_validate_deep_finds_what_quick_cannot(conformance: Path) -> None:
    url = str(conformance / "corrupt" / "batch-crc" / "backup-1")
    assert run("validate", url)[0] == 0  # sizes, headers and footers are intact
    code, out, err = run("validate", "--deep", "--json", url)
    assert code == 1
    doc = json.loads(out)
    assert doc["defects"][0]["error"] == "ChecksumError" and "segment-00000001.kbs at byte" in doc["defects"][0]["message"]


def test_cat_with_filters_matches_expected(conformance: Path) -> None:
    url = str(conformance / "valid" / "zstd-v1.1" / "backup-1")
    code, out, _ = run("cat", url, "-t", "orders", "-p", "1", "--start-offset", "1100", "--end-offset", "1200")
    assert code == 0
    got = [json.loads(line) for line in out.splitlines()]
    want_all = [json.loads(line) for line in (conformance / "valid" / "zstd-v1.1" / "expected.jsonl").read_text().splitlines()]
    want = [r for r in want_all if r["topic"] == "orders" and r["partition"] == 1 and 1100 <= r["offset"] < 1200]
    assert got == want and len(got) > 10
    code, out, _ = run("cat", url, "-n", "3")
    assert len(out.splitlines()) == 3
    assert load_expected  # same encoding as expected.jsonl: base64 with null as null


def test_cat_reports_corruption_with_location(conformance: Path) -> None:
    code, _, err = run("cat", str(conformance / "corrupt" / "bad-magic" / "backup-1"))
    assert code == 2 and "segment-00000001.kbs at byte 0" in err.replace("\n", "")
