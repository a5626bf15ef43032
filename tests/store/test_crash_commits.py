"""kill -9 at every step of a commit: a reader sees exactly the old or the new backup, or
CommitInProgressError, after which ``repair`` yields exactly the new one.

The child kills itself with SIGKILL from the ``fault`` hook at one named step (cycling
through all of them), so every window of the protocol is hit on each run. Rounds per case:
``KBS_CRASH_ROUNDS_LOCAL`` (default 12) and ``KBS_CRASH_ROUNDS_S3`` (default 6).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fsspec_kbs.errors import CommitInProgressError
from fsspec_kbs.store import BackupWriter
from fsspec_kbs.store.txn import repair
from tests.store.helpers import cols, rows, store

STEPS = ["before-claim", "claimed", "manifest-removed", "moved", "deleted", "publishing", "published", "none"]
ROOT = Path(__file__).resolve().parents[2]

OLD = sorted([("t", 0, o, f"old-{o}".encode()) for o in range(10)] + [("t", 2, 0, b"old-0")])
NEW = {
    "overwrite": sorted([("t", 0, o, f"new-{o}".encode()) for o in range(6)]
                        + [("u", 1, o, f"new-{o}".encode()) for o in range(9)]),
    "append": sorted(OLD + [("t", 0, o, f"new-{o}".encode()) for o in range(100, 110)]),
    "adopt": sorted(OLD + [("t", 0, o, f"new-{o}".encode()) for o in range(100, 111)]),
}


def _seed(url: str, so: dict) -> None:
    w = BackupWriter(url, so, segment_max_records=4)
    w.write_columns("t", 0, cols(list(range(10)), "old"))
    w.write_columns("t", 2, cols([0], "old"))
    w.commit()


def _crash_round(url: str, so: dict, scenario: str, step: str) -> str:
    _seed(url, so)
    proc = subprocess.run([sys.executable, "-m", "tests.store.crash_child", url, json.dumps(so), scenario, step],
                          cwd=ROOT, capture_output=True, timeout=120)
    killed = proc.returncode == -signal.SIGKILL
    assert killed or proc.returncode == 0, proc.stderr.decode()[-2000:]
    try:
        got = rows(url, so)
    except CommitInProgressError:
        report = repair(url, so)
        assert report.rolled_forward is not None
        assert rows(url, so) == NEW[scenario]
        return "in-progress, repaired"
    assert got in (OLD, NEW[scenario]), (step, got)
    outcome = "old" if got == OLD else "new"
    # A later writer finishes nothing more, and repair is a no-op.
    assert repair(url, so).rolled_forward is None
    assert rows(url, so) == got
    return outcome


def _run(request: pytest.FixtureRequest, tmp_path: Path, store_name: str, scenario: str, rounds: int) -> None:
    outcomes: dict[str, int] = {}
    for i in range(rounds):
        root, so = store(request, tmp_path / f"r{i}", store_name)
        step = STEPS[i % len(STEPS)]
        out = _crash_round(f"{root}/b{i}", so, scenario, step)
        outcomes[f"{step}: {out}"] = outcomes.get(f"{step}: {out}", 0) + 1
    print(scenario, store_name, outcomes)
    # Killed before the claim: the old backup; after it: the new one (maybe after repair).
    assert any("before-claim: old" in k for k in outcomes)
    assert not any(k.startswith("before-claim") and not k.endswith("old") for k in outcomes)


@pytest.mark.parametrize("scenario", ["overwrite", "append", "adopt"])
def test_kill9_local(request: pytest.FixtureRequest, tmp_path: Path, scenario: str) -> None:
    _run(request, tmp_path, "local", scenario, int(os.environ.get("KBS_CRASH_ROUNDS_LOCAL", "7")))


@pytest.mark.parametrize("scenario", ["overwrite", "append", "adopt"])
def test_kill9_s3(request: pytest.FixtureRequest, tmp_path: Path, scenario: str) -> None:
    _run(request, tmp_path, "s3", scenario, int(os.environ.get("KBS_CRASH_ROUNDS_S3", "7")))
