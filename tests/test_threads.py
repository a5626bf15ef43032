"""The process's worker pools (fsspec_kbs/threads.py): ordered maps and futures."""

from __future__ import annotations

import functools
import multiprocessing
import threading
import time
from typing import Any

import pytest

from fsspec_kbs.threads import CHUNKS_AHEAD_PER_THREAD, WorkerPool, run_in_order, worker_pool


def _squares_in_a_child(out: Any) -> None:
    out.put([r for _k, r in run_in_order(((i, functools.partial(pow, i, 2)) for i in range(20)), 2)])


def test_run_in_order_works_in_a_forked_child() -> None:
    """A child forked after the decode pool started has none of its threads: it starts its own."""
    assert [r for _k, r in run_in_order(((i, functools.partial(pow, i, 2)) for i in range(5)), 2)] == \
        [0, 1, 4, 9, 16]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_squares_in_a_child, args=(out,))
    child.start()
    try:
        assert out.get(timeout=60) == [i * i for i in range(20)]
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_run_in_order_keeps_order_bounds_the_window_and_raises_in_place() -> None:
    running = [0]
    peak = [0]
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002 * (i % 3))  # out-of-order completion
        with lock:
            running[0] -= 1
        return i * i

    def tasks(n: int, fail_at: int | None = None, break_at: int | None = None):  # type: ignore[no-untyped-def]
        for i in range(n):
            if i == break_at:
                raise ValueError("tasks broke")
            yield i, (None if i % 5 == 4 else functools.partial(work, i) if i != fail_at else _boom)

    for threads in (1, 2):
        out = list(run_in_order(tasks(40), threads))
        assert out == [(i, None if i % 5 == 4 else i * i) for i in range(40)]
    assert peak[0] <= 2  # the pool's two threads

    # An error of a task, or of the task iterator, comes after every result before it.
    for kwargs, message in (({"fail_at": 12}, "task failed"), ({"break_at": 12}, "tasks broke")):
        got = []
        with pytest.raises(ValueError, match=message):
            for key, _ in run_in_order(tasks(40, **kwargs), 2):
                got.append(key)
        assert got == list(range(12))

    # Tasks run ahead by at most threads * CHUNKS_AHEAD_PER_THREAD; closing early cancels the rest.
    started = []

    def slow(i: int) -> int:
        started.append(i)
        time.sleep(0.01)
        return i

    it = run_in_order(((i, functools.partial(slow, i)) for i in range(100)), 2)
    next(it)
    time.sleep(0.1)
    assert len(started) <= 2 * CHUNKS_AHEAD_PER_THREAD + 1
    it.close()
    time.sleep(0.1)
    assert len(started) <= 2 * CHUNKS_AHEAD_PER_THREAD + 1


def _boom() -> None:
    raise ValueError("task failed")


def test_submit_runs_returns_raises_and_honours_cancel() -> None:
    pool = worker_pool("compute", 2)
    assert worker_pool("compute", 2) is pool  # one pool per kind and size, kept
    assert pool.submit(lambda: 6 * 7).result(timeout=10) == 42
    with pytest.raises(ValueError, match="task failed"):
        pool.submit(_boom).result(timeout=10)

    one = WorkerPool("test-one", 1)
    gate = threading.Event()
    ran: list[int] = []
    blocker = one.submit(gate.wait)
    queued = one.submit(lambda: ran.append(1))
    assert queued.cancel()  # not started: it never runs
    gate.set()
    blocker.result(timeout=10)
    one.submit(lambda: None).result(timeout=10)  # the queue has drained past the cancelled task
    assert ran == []
    one.stop(10)


def test_pools_of_each_kind_are_separate() -> None:
    names = []
    worker_pool("io", 3).submit(lambda: names.append(threading.current_thread().name)).result(timeout=10)
    worker_pool("compute", 2).submit(lambda: names.append(threading.current_thread().name)).result(timeout=10)
    assert names[0].startswith("kbs-io-") and names[1].startswith("kbs-compute-")


def test_exit_waits_for_running_tasks_and_skips_queued_ones(tmp_path: Any) -> None:
    """At interpreter exit the pools finish what runs and drop what waits: a daemon thread
    still inside C++ code when the interpreter finalizes would abort the process."""
    import subprocess
    import sys

    code = f"""
import time
from pathlib import Path
from fsspec_kbs.threads import worker_pool
pool = worker_pool("io", 1)
def slow(name):
    time.sleep(0.5)
    Path({str(tmp_path)!r}, name).write_text("done")
pool.submit(lambda: slow("running"))
pool.submit(lambda: slow("queued"))
time.sleep(0.1)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "running").exists() and not (tmp_path / "queued").exists()
