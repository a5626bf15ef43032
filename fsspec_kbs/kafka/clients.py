"""librdkafka clients as ``kbs backup``/``kbs restore`` create them: logging through Python
:mod:`logging`, and a first contact with the cluster that fails within a timeout, in one line.

librdkafka writes its log lines to stderr by itself (``%6|…|BGQUEUE|…``, and ~40 ``FAIL …
Connection refused`` lines a second while a broker is unreachable). Here every client logs to
the ``fsspec_kbs.kafka.librdkafka`` logger instead, at the level that logger is enabled for
(WARNING unless the application or ``kbs -v`` lowers it), and a line repeated within
:data:`REPEAT_SECONDS` is dropped.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any

from fsspec_kbs.errors import KafkaClusterError

LOGGER = logging.getLogger("fsspec_kbs.kafka.librdkafka")
#: Default of ``connect_timeout``: how long the first metadata request may take.
CONNECT_TIMEOUT = 15.0
#: A log line equal to one logged this recently is dropped (reconnect loops repeat themselves).
REPEAT_SECONDS = 30.0


class _DropRepeats(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # librdkafka's messages start with the client instance ("[thrd:…]: "): compare what follows.
        text = record.getMessage().split("]: ", 1)[-1]
        now = time.monotonic()
        last = self.seen.get(text)
        if last is not None and now - last < REPEAT_SECONDS:
            return False
        if len(self.seen) > 1000:
            self.seen.clear()
        self.seen[text] = now
        return True


LOGGER.addFilter(_DropRepeats())


def _syslog_level() -> int:
    """librdkafka's ``log_level`` (syslog numbering) for what :data:`LOGGER` lets through."""
    level = LOGGER.getEffectiveLevel()
    if level <= logging.DEBUG:
        return 7
    if level <= logging.INFO:
        return 6
    if level <= logging.WARNING:
        return 4
    return 3


def _on_error(err: Any) -> None:
    # Transport errors are retried by librdkafka and reported by our timeouts in one line.
    LOGGER.debug("client error: %s", err)


def client_config(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` plus logging to :data:`LOGGER` (an explicit ``log_level``/``logger`` is kept)."""
    return {"log_level": _syslog_level(), "logger": LOGGER, "error_cb": _on_error, **conf}


def admin_client(conf: dict[str, Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(conf))


def cluster_metadata(admin: Any, conf: dict[str, Any], timeout: float) -> Any:
    """The cluster's metadata, or :class:`KbsError` in one line when it does not answer in time."""
    from confluent_kafka import KafkaException

    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as e:
        err = e.args[0] if e.args else e
        why = err.str() if hasattr(err, "str") else str(err)
        raise KafkaClusterError(f"cannot reach the Kafka cluster at {conf.get('bootstrap.servers')} within "
                       f"{timeout:g} s ({why}); check --bootstrap-servers and the network, or raise "
                       "--connect-timeout") from None


def fix_mmap_threshold(nbytes: int) -> None:
    """Fix glibc's mmap threshold at ``nbytes`` (at most 32 MiB) for the whole process, for
    good (no effect elsewhere than glibc).

    By default glibc raises the threshold to the size of each large buffer freed, up to 32 MiB;
    a backup's buffers (chunks, encoded batches, librdkafka's fetches) are allocated on one
    thread and freed on another, and per-thread heaps then kept them: peak RSS grew with the
    run (+70 to +110 MB on 150 MB of records with 14 MB configured). A fixed threshold ends
    that, and one above a chunk keeps the buffers below it on the heaps, reused: at 128 KiB
    every chunk and every librdkafka fetch was a fresh mapping, a page fault per 4 KiB of it
    (~0.4 s of a 2.3 s backup of 447 MB).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # glibc refuses (returns 0, sets nothing) a threshold above its maximum, 32 MiB on 64-bit
        libc.mallopt(-3, min(int(nbytes), 32 * 1024 * 1024))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Cyclic garbage collection seldom while records stream through (restored after).

    A backup holds thousands of consumed Message objects (tracked by the collector, in no
    cycle) and a restore makes lists and header tuples by the thousand: with the default
    threshold (a collection every 700 allocations) the collector ran over them again and
    again, ~11 % of a backup's CPU time. Collections still run (every 100,000 allocations), so
    garbage in cycles does not pile up; disabling the collector let it grow with the records.
    The objects alive on entry (the imported libraries: numba, pyarrow, … several hundred
    thousand) are frozen (:func:`gc.freeze`) meanwhile, so that the collections that do run
    do not walk them again each time.
    """
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(before[0], 100_000), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
