"""Concurrent writers on one backup: no lost update, no overwritten segment, on every store.

Writers are prepared (state read, segments staged) and then released together on a barrier,
so that they all commit against the same base: the case that used to lose data.
"""

from __future__ import annotations

import threading
from pathlib import Path

import fsspec
import pytest

from fsspec_kbs.errors import CommitConflictError
from fsspec_kbs.store import BackupWriter, KbsBackup
from tests.store.helpers import STORES, cols, rows, store


def _run_together(writers: list[BackupWriter]) -> list[BaseException | None]:
    """Commit every writer at the same moment, each on its own thread."""
    barrier = threading.Barrier(len(writers))
    results: list[BaseException | None] = [None] * len(writers)

    def go(i: int) -> None:
        barrier.wait()
        try:
            writers[i].commit()
        except BaseException as e:  # noqa: BLE001 - collected and checked by the test
            results[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _expected(items: list[tuple[int, list[int], str]]) -> list[tuple[str, int, int, bytes]]:
    return sorted(("t", p, o, f"{tag}-{o}".encode()) for p, offsets, tag in items for o in offsets)


def _no_staging_left(url: str, so: dict) -> bool:
    fs, path = fsspec.core.url_to_fs(url, **so)
    fs.invalidate_cache()
    try:
        return not [f for f in fs.find(f"{path}/_staging")]
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_appends_all_land(request: pytest.FixtureRequest, tmp_path: Path, store_name: str,
                                     n: int) -> None:
    """N appends to N partitions of one backup, committed at once: every record is there."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    seed = BackupWriter(url, so, segment_max_records=5)
    seed.write_columns("t", 0, cols(list(range(10)), "seed"))
    seed.commit()
    writers = []
    for i in range(n):
        w = BackupWriter(url, so, mode="append", segment_max_records=5)
        w.write_columns("t", i, cols(list(range(100, 112)), f"w{i}"))  # 3 segments each
        writers.append(w)
    assert _run_together(writers) == [None] * n
    expect = _expected([(0, list(range(10)), "seed")] + [(i, list(range(100, 112)), f"w{i}") for i in range(n)])
    assert rows(url, so) == expect
    m = KbsBackup.open(url, so).manifest
    assert m.extra["commit"]["version"] == n  # seed = commit 0, then one per writer
    assert _no_staging_left(url, so)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_appends_same_partition(request: pytest.FixtureRequest, tmp_path: Path, store_name: str,
                                           n: int) -> None:
    """N appends to one partition: a writer whose offsets follow the winner's rebases; one
    whose offsets would go backwards gets CommitConflictError. Never a lost record."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    writers = []
    for i in range(n):
        w = BackupWriter(url, so, mode="append", segment_max_records=4)
        w.write_columns("t", 0, cols(list(range(i * 100, i * 100 + 10)), f"w{i}"))
        writers.append(w)
    results = _run_together(writers)
    assert all(r is None or isinstance(r, CommitConflictError) for r in results), results
    won = [i for i, r in enumerate(results) if r is None]
    assert won
    assert rows(url, so) == _expected([(0, list(range(i * 100, i * 100 + 10)), f"w{i}") for i in won])
    assert _no_staging_left(url, so)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_creates_one_wins_intact(request: pytest.FixtureRequest, tmp_path: Path, store_name: str,
                                            n: int) -> None:
    """N creates of one backup id: one wins, the others get CommitConflictError, and the
    winner's segments (same names as the losers' would have had) read back whole."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    writers = []
    for i in range(n):
        w = BackupWriter(url, so, segment_max_records=3)
        w.write_columns("t", 0, cols(list(range(10 + i)), f"w{i}"))
        writers.append(w)
    results = _run_together(writers)
    won = [i for i, r in enumerate(results) if r is None]
    assert len(won) == 1, results
    assert all(isinstance(r, CommitConflictError) for i, r in enumerate(results) if i not in won)
    w = won[0]
    assert rows(url, so) == _expected([(0, list(range(10 + w)), f"w{w}")])
    backup = KbsBackup.open(url, so)
    for ref in backup.segments():
        backup.open_segment(ref)  # CRC-64 checked: no loser wrote over a winner's file
    assert _no_staging_left(url, so)


@pytest.mark.parametrize("store_name", ["local", "memory", "s3"])
def test_overwrite_against_append_conflicts(request: pytest.FixtureRequest, tmp_path: Path,
                                            store_name: str) -> None:
    """An overwrite and an append racing: whichever loses gets CommitConflictError."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    seed = BackupWriter(url, so)
    seed.write_columns("t", 0, cols(list(range(5)), "seed"))
    seed.commit()
    a = BackupWriter(url, so, mode="append")
    a.write_columns("t", 0, cols([10, 11], "a"))
    o = BackupWriter(url, so, mode="overwrite")
    o.write_columns("t", 1, cols([0, 1, 2], "o"))
    results = _run_together([a, o])
    assert sum(r is None for r in results) == 1
    assert all(r is None or isinstance(r, CommitConflictError) for r in results)
    if results[0] is None:
        assert rows(url, so) == _expected([(0, list(range(5)), "seed"), (0, [10, 11], "a")])
    else:
        assert rows(url, so) == _expected([(1, [0, 1, 2], "o")])


@pytest.mark.parametrize("store_name", ["local", "memory"])
def test_a_publisher_that_lost_the_race_puts_the_latest_manifest_back(
        request: pytest.FixtureRequest, tmp_path: Path, store_name: str) -> None:
    """Writer A checked that no later commit exists, and before it wrote its manifest, B
    claimed and published the next commit: A's write put the older manifest back. A must
    notice and publish B's commit again; else readers see "commit in progress" after both
    writers returned (1 run in ~3,600 of two racing appends did)."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    seed = BackupWriter(url, so)
    seed.write_columns("t", 0, cols(list(range(5)), "seed"))
    seed.commit()
    b = BackupWriter(url, so, mode="append")
    b.write_columns("t", 1, cols([0, 1], "b"))
    b_done: list[bool] = []

    def b_commits_meanwhile(step: str) -> None:
        if step == "publishing" and not b_done:
            b_done.append(True)
            b.commit()  # claims commit 2 and publishes it before A writes commit 1's manifest

    a = BackupWriter(url, so, mode="append", fault=b_commits_meanwhile)
    a.write_columns("t", 0, cols([10, 11], "a"))
    a.commit()
    assert b_done
    assert KbsBackup.open(url, so).manifest.extra["commit"]["version"] == 2
    assert rows(url, so) == _expected([(0, list(range(5)), "seed"), (0, [10, 11], "a"), (1, [0, 1], "b")])


@pytest.mark.parametrize("store_name", ["local", "memory"])
def test_a_slow_overwrite_does_not_remove_a_later_commits_manifest(
        request: pytest.FixtureRequest, tmp_path: Path, store_name: str) -> None:
    """Overwrite A claimed commit 1; before A applied it, another writer finished commit 1 for
    A and published commit 2 on top. A's late roll forward must not remove commit 2's
    manifest (readers would see "commit in progress" with both writers done)."""
    root, so = store(request, tmp_path, store_name)
    url = f"{root}/b"
    seed = BackupWriter(url, so)
    seed.write_columns("t", 0, cols(list(range(5)), "seed"))
    seed.commit()
    c_done: list[bool] = []

    def another_writer_meanwhile(step: str) -> None:
        if step == "claimed" and not c_done:
            c_done.append(True)
            c = BackupWriter(url, so, mode="append")  # rolls commit 1 forward, on top of it
            c.write_columns("t", 1, cols([0, 1], "c"))
            c.commit()

    a = BackupWriter(url, so, mode="overwrite", fault=another_writer_meanwhile)
    a.write_columns("t", 0, cols([10, 11], "a"))
    a.commit()
    assert c_done
    assert KbsBackup.open(url, so).manifest.extra["commit"]["version"] == 2
    assert rows(url, so) == _expected([(0, [10, 11], "a"), (1, [0, 1], "c")])
