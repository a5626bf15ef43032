"""What a person meets on the command line: one-line errors, exit codes, times, option names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

import fsspec_kbs
from fsspec_kbs.cli.main import cli
from fsspec_kbs.times import parse_time

NOW = 1_764_000_000_000  # 2025-11-24T16:00:00Z


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def backup(tmp_path: Path) -> str:
    url = str(tmp_path / "root" / "backup-1")
    t = pa.table({"topic": ["orders"] * 6 + ["payments"] * 2, "partition": pa.array([0, 0, 0, 1, 1, 1, 0, 0], pa.int32()),
                  "value": [b"v%d" % i for i in range(8)],
                  "timestamp": pa.array([NOW + i * 1000 for i in range(8)], pa.timestamp("ms", tz="UTC"))})
    fsspec_kbs.write_table(url, t)
    return url


@pytest.mark.parametrize("text,expected", [
    ("1764000000000", NOW), ("2025-11-24T16:00:00Z", NOW), ("2025-11-24T17:00:00+01:00", NOW),
    ("2025-11-24 16:00", NOW), ("2025-11-24", NOW - 16 * 3_600_000), ("now", NOW), ("-2h", NOW - 7_200_000),
    ("-1d12h", NOW - 36 * 3_600_000), ("2h ago", NOW - 7_200_000), ("3 days ago", NOW - 3 * 86_400_000),
    ("now-30m", NOW - 1_800_000), ("now+15min", NOW + 900_000), ("today", NOW - 16 * 3_600_000),
    ("yesterday", NOW - 40 * 3_600_000), ("Tomorrow", NOW + 8 * 3_600_000),
])
def test_times(text: str, expected: int) -> None:
    assert parse_time(text, now_ms=NOW) == expected


@pytest.mark.parametrize("text", ["yesterdayy", "01/02/2026", "-2x", "2026-13-01", "", "soon ago"])
def test_bad_times_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time(text, now_ms=NOW)


def test_bad_time_is_one_line_usage_error(backup: str) -> None:
    code, out, err = run("cat", backup, "--start-time", "yesterdayy")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--start-time" in err and "ISO 8601" in err


def test_relative_time_works(backup: str) -> None:
    code, out, _ = run("cat", backup, "--start-time", "2025-11-24T16:00:05Z", "--end-time", "now")
    assert code == 0 and [json.loads(x)["offset"] for x in out.splitlines()] == [2, 0, 1]


def test_missing_backup_is_one_line(tmp_path: Path) -> None:
    code, out, err = run("describe", str(tmp_path / "nope"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(tmp_path / "nope") in err and "check the URL" in err and "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fsspec_kbs.cli.main", "describe", str(tmp_path / "nope")]
    plain = subprocess.run(cmd, capture_output=True, text=True)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and len(plain.stderr.strip().splitlines()) == 1
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "BackupNotFoundError" in debug.stderr


def test_no_credentials_is_one_line_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # a closed port: whatever botocore tries, it fails fast and says so in one line
    code, _, err = run("describe", "s3://bucket/backups/b1", "-S", "endpoint_url=http://127.0.0.1:9",
                       "-S", 'config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1}')
    assert code == 3, err
    assert len(err.strip().splitlines()) == 1 and "s3://bucket/backups/b1" in err


def test_azure_without_account_is_one_line() -> None:
    pytest.importorskip("adlfs")
    code, _, err = run("ls", "az://container/backups")
    assert code in (2, 3) and len(err.strip().splitlines()) == 1, err
    assert "az://container/backups" in err and "AZURE_STORAGE_CONNECTION_STRING" in err


def test_existing_destination_names_the_flag(backup: str, tmp_path: Path) -> None:
    dst = str(tmp_path / "out" / "b2")
    assert run("convert", backup, dst, "--layout", "oso")[0] == 0
    code, _, err = run("convert", backup, dst, "--layout", "oso")
    assert code == 2 and "--overwrite" in err and "overwrite=True" not in err
    assert len(err.strip().splitlines()) == 1


def test_old_spellings_still_work_with_a_note(backup: str, tmp_path: Path) -> None:
    code, _, err = run("convert", backup, str(tmp_path / "o"), "--to", "oso", "-D", "auto_mkdir=true")
    assert code == 0, err
    assert "--to is deprecated" in err and "--layout" in err and "--dest-storage-option" in err
    code, _, err = run("convert", backup, str(tmp_path / "o2"))
    assert code == 2 and "--layout" in err


def test_hidden_aliases_stay_out_of_help() -> None:
    for cmd, old in (("convert", "--dst-storage-option"), ("compact", "--to-storage-option"),
                     ("restore", "--from-time"), ("backup", "--topics")):
        code, out, _ = run(cmd, "--help")
        assert code == 0 and old not in out and "--debug" in out


def test_one_vocabulary_across_commands() -> None:
    for cmd in ("cat", "restore"):
        out = run(cmd, "--help")[1]
        for opt in ("--topic", "--topic-pattern", "--partition", "--start-time", "--end-time"):
            assert opt in out, (cmd, opt)
    assert "--topic-pattern" in run("backup", "--help")[1]
    for cmd in ("convert", "compact", "retain", "import-log"):
        out = run(cmd, "--help")[1]
        assert "--dest-storage-option" in out and "-S, --storage-option" in out, cmd


def test_filters_matching_nothing_warn(backup: str) -> None:
    code, out, err = run("cat", backup, "--topic", "ordrs")
    assert code == 0 and out == ""
    assert "ordrs" in err and "orders" in err and "warning" in err
    code, out, err = run("cat", backup, "--topic", "orders", "--partition", "7")
    assert "partition 7" in err
    code, out, err = run("cat", backup, "--start-time", "2020-01-01", "--end-time", "2020-01-02")
    assert out == "" and "no record" in err


def test_validate_quick_ok_mentions_deep(backup: str) -> None:
    code, out, err = run("validate", backup)
    assert code == 0 and "--deep" in out + err


def test_warnings_print_once(tmp_path: Path) -> None:
    src = str(tmp_path / "s" / "b")
    fsspec_kbs.write_table(src, pa.table({"key": pa.array([None, b"k"], pa.binary()), "value": [b"1", b"2"]}),
                           topic="t")
    code, _, err = run("compact", src, "--to", str(tmp_path / "d" / "b"))
    assert code == 0, err
    lines = [x for x in err.splitlines() if "null key" in x]
    assert len(lines) == 1, err
