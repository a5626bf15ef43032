"""Worker threads shared by the process: the one place where work runs beside its caller.

Decoding, encoding, compressing and checksumming release the GIL (codecs, CRCs, compiled
kernels), so threads speed them up. Every such use goes through a :class:`WorkerPool`:

- :func:`run_in_order` maps decode tasks in order on the compute pool (reads);
- :meth:`WorkerPool.submit` returns a future (the writer's compression queue, reads opening
  segments ahead on the I/O pool).

Pools are daemon threads created on first use, one per (kind, size), and kept: readers and
writers come and go, threads stay. A forked child starts its own.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsspec_kbs.errors import KbsError

#: Threads decoding chunks of one read that does not say (two cores are the common case).
DECODE_THREADS = max(1, min(2, os.cpu_count() or 1))
#: Chunks of one segment in flight per decoding thread. With one each, a thread that finished
#: early sat idle until the consumer took the chunk before it (1.35-1.55x on two cores); with
#: two, 1.65-1.7x, for a few more MB in flight (2 MiB chunks).
CHUNKS_AHEAD_PER_THREAD = 2


class _Run:
    """One :func:`run_in_order` call: where its results arrive; ``closed`` once it is abandoned."""

    __slots__ = ("closed", "results")

    def __init__(self) -> None:
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False


_STOP = object()  # a task that ends the thread taking it


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class WorkerPool:
    """Daemon threads taking tasks off one queue.

    Lighter than an executor for ordered maps: a :func:`run_in_order` task is a tuple on the
    queue and its result a tuple on its run's queue, with no future, lock or condition per
    task (those held the GIL for a few % of a threaded scan, and the GIL is what limits two
    decoding threads). :meth:`submit` gives a :class:`concurrent.futures.Future` where the
    caller needs one.
    """

    def __init__(self, name: str, threads: int) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"kbs-{name}-{i}", daemon=True)
                        for i in range(threads)]
        self.stopping = False
        for t in self.threads:
            t.start()

    def stop(self, timeout: float) -> None:
        """Skip what is queued, let running tasks finish (for at most ``timeout`` seconds in
        all), end the threads. At interpreter exit: a daemon thread still inside a library's
        C++ code when the interpreter finalizes is killed there, and the process aborts."""
        self.stopping = True
        for _ in self.threads:
            self.tasks.put((_STOP, None, None))
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def submit(self, fn: Callable[[], Any]) -> cf.Future:
        """Run ``fn()`` on the pool; a future cancelled before it starts never runs."""
        future: cf.Future = cf.Future()
        self.tasks.put((None, future, fn))
        return future

    def _work(self) -> None:
        get = self.tasks.get
        while True:
            run, tag, fn = get()
            if run is _STOP:
                return
            if self.stopping:
                if run is None:
                    tag.cancel()
                else:
                    run.results.put((tag, _Raised(KbsError("the interpreter is exiting"))))
            elif run is None:  # submit(): tag is the future
                if tag.set_running_or_notify_cancel():
                    try:
                        tag.set_result(fn())
                    except BaseException as e:
                        tag.set_exception(e)
            elif not run.closed:  # else its consumer went away: skip what it left queued
                try:
                    result = fn()
                except BaseException as e:  # raised by the consumer, in order
                    result = _Raised(e)
                run.results.put((tag, result))
                result = None
            run = tag = fn = None  # hold nothing of a task while waiting for the next


_pools: dict[tuple[str, int], WorkerPool] = {}
_lock = threading.Lock()


def worker_pool(kind: str, threads: int) -> WorkerPool:
    """The process's pool of ``threads`` threads for ``kind`` of work: ``"compute"`` (work that
    releases the GIL: decoding, compressing) or ``"io"`` (waiting on storage)."""
    with _lock:
        pool = _pools.get((kind, threads))
        if pool is None:
            pool = _pools[(kind, threads)] = WorkerPool(kind, threads)
        return pool


def _forget_pools() -> None:
    global _lock
    _pools.clear()  # a forked child has none of the parent's threads,
    _lock = threading.Lock()  # and a lock another thread held at the fork stays held there


#: Seconds the interpreter's exit waits, all pools together, for tasks still running (a read
#: hung on a store must not keep a Ctrl-C'd command alive for long).
EXIT_WAIT = 10.0


@atexit.register
def _stop_pools() -> None:
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    deadline = time.monotonic() + EXIT_WAIT
    for pool in pools:
        pool.stop(timeout=max(0.0, deadline - time.monotonic()))


if hasattr(os, "register_at_fork"):  # Unix
    os.register_at_fork(after_in_child=_forget_pools)


def run_in_order(tasks: Iterable[tuple[Any, Callable[[], Any] | None]],
                 threads: int | None = None) -> Iterator[tuple[Any, Any]]:
    """``(key, fn)`` pairs -> ``(key, fn())`` pairs, in order.

    With ``threads`` > 1 (default: :data:`DECODE_THREADS`) up to ``threads *``
    :data:`CHUNKS_AHEAD_PER_THREAD` of the ``fn`` run ahead on the compute pool (whose size is
    ``max(2, DECODE_THREADS)`` whatever ``threads``: it sets the window, not the threads). A ``None`` fn
    passes its key through in its place (result ``None``) without taking a slot. An error
    raised by an ``fn``, or by the iteration of ``tasks`` itself, is raised in its place too:
    after the results before it.
    """
    threads = DECODE_THREADS if threads is None else threads
    if threads <= 1:
        for key, fn in tasks:
            yield key, None if fn is None else fn()
        return
    put = worker_pool("compute", max(2, DECODE_THREADS)).tasks.put
    run = _Run()
    limit = threads * CHUNKS_AHEAD_PER_THREAD
    pending: deque[tuple[Any, int | _Raised | None]] = deque()  # key, and its task's number
    done: dict[int, Any] = {}  # results that arrived before the ones ahead of them
    running = seq = 0
    it: Iterator[tuple[Any, Callable[[], Any] | None]] | None = iter(tasks)

    def fill() -> None:
        nonlocal running, seq, it
        while it is not None and running < limit:
            try:
                key, fn = next(it)
            except StopIteration:
                it = None
                return
            except Exception as e:
                pending.append((None, _Raised(e)))
                it = None
                return
            if fn is None:
                pending.append((key, None))
            else:
                put((run, seq, fn))
                pending.append((key, seq))
                seq += 1
                running += 1

    try:
        fill()
        while pending:
            key, n = pending.popleft()
            if isinstance(n, _Raised):
                raise n.error
            if n is None:
                yield key, None
                continue
            while n not in done:
                got, value = run.results.get()
                done[got] = value
            result = done.pop(n)
            running -= 1
            fill()
            if isinstance(result, _Raised):
                raise result.error
            yield key, result
    finally:
        run.closed = True
