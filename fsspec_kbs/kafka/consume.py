"""The consuming half of ``kbs backup``: read partitions up to the cut in bulk and hand the records
over in bounded chunks, as columns.

One ``consume()`` call returns many messages; they are cut into runs of one partition, each run
checked as a whole (offsets as an array), and a chunk's columns are built with C-level ``map``
calls over its messages: no Python statement runs per record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import is_not, itemgetter
from typing import Any

import numpy as np

from fsspec_kbs.errors import KafkaClusterError, KafkaOptionError, KbsError
from fsspec_kbs.format import RecordColumns

#: Consumer errors no retry can fix (others are retried by librdkafka; see the stall timeout).
_FATAL_NAMES = ("TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
                "SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION", "_SSL", "UNSUPPORTED_VERSION")
#: Errors after which librdkafka goes on *past* records it did not deliver: a batch failing its CRC
#: or not decodable is skipped, a fetch position out of range (records deleted by retention or
#: DeleteRecords, a truncated log) is reset. Ignoring them completes a backup with a silent gap.
_SKIPPED_NAMES = (
    "_BAD_MSG",
    "_BAD_COMPRESSION",
    "_NOT_IMPLEMENTED",
    "_AUTO_OFFSET_RESET",
    "_LOG_TRUNCATION",
    "OFFSET_OUT_OF_RANGE",
    "UNSUPPORTED_COMPRESSION_TYPE",
)
def _codes(names: tuple[str, ...]) -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


@dataclass
class BackupMemory:
    """What a backup holds in memory at most, beyond the interpreter and its libraries.

    None of it grows with the number of records or partitions: each is a bound in bytes, and
    a bound that is reached makes the backup wait (or write a segment early), not grow.
    """

    #: librdkafka's queue of fetched, not yet consumed records (``queued.max.messages.kbytes``;
    #: one queue for all partitions). ``-X queued.max.messages.kbytes=…`` overrides it.
    fetch_queue_bytes: int = 16 * 1024 * 1024
    #: Records of one partition handed to the compressing threads together.
    chunk_bytes: int = 4 * 1024 * 1024
    #: Records consumed and not yet handed over, all partitions together: beyond it the
    #: partition holding most is handed over early (so many partitions do not multiply it).
    buffer_bytes: int = 16 * 1024 * 1024
    #: Records handed over and queued for compression, not compressed yet (the compressing
    #: threads' work ahead; ``BackupWriter(compress_ahead_bytes=…)``): beyond it consuming waits.
    compress_ahead_bytes: int = 32 * 1024 * 1024
    #: Compressed data of unfinished segments, all partitions together: beyond it the largest
    #: is written early as a smaller segment (``BackupWriter(buffer_max_bytes=…)``). Writing a
    #: segment holds it a second time, briefly. With many partitions, raise it for larger segments.
    segment_buffer_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("fetch_queue_bytes", "chunk_bytes", "buffer_bytes", "compress_ahead_bytes",
                     "segment_buffer_bytes"):
            if getattr(self, name) <= 0:
                raise KafkaOptionError(f"BackupMemory.{name} must be positive")


def _message_methods() -> tuple[Callable, ...]:
    from confluent_kafka import Message

    return (Message.error, Message.topic, Message.partition, Message.offset, Message.key, Message.value,
            Message.headers, Message.timestamp)


def _pack(values: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(values)
    nulls = values.count(None)  # identity comparisons in C; usually none
    if nulls:
        valid = np.fromiter(map(is_not, values, repeat(None)), dtype=np.bool_, count=n)
        present = [v for v in values if v is not None]
    else:
        valid, present = np.ones(n, dtype=np.bool_), values
    lens = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
    offs = np.zeros(n + 1, dtype=np.int64)
    if not nulls:
        np.cumsum(lens, out=offs[1:])
    else:
        full = np.zeros(n, dtype=np.int64)
        full[valid] = lens
        np.cumsum(full, out=offs[1:])
    if offs[-1] > np.iinfo(np.int32).max:
        raise KbsError("a chunk of records exceeds 2 GiB")  # chunks are bounded far below this
    data = np.frombuffer(b"".join(present), dtype=np.uint8)
    return offs.astype(np.int32), data, valid


def columns_of_messages(msgs: list[Any], offsets: np.ndarray) -> RecordColumns:
    """RecordColumns of consumed messages (one partition, increasing ``offsets``), field by field
    with C-level ``map`` calls: no Python work per record beyond what the columns need."""
    _, _, _, _, key, value, headers, timestamp = _message_methods()
    return columns_of_fields(offsets, list(map(key, msgs)), list(map(value, msgs)),
                             np.fromiter(map(itemgetter(1), map(timestamp, msgs)), dtype=np.int64,
                                         count=len(msgs)),
                             list(map(headers, msgs)))


def columns_of_fields(offsets: np.ndarray, keys: list[bytes | None], values: list[bytes | None],
                      timestamps: np.ndarray, hdrs: list[list | None]) -> RecordColumns:
    """RecordColumns of records given field by field (what :func:`columns_of_messages` reads
    from the messages), in C-level maps; the arrays have the types, and so the compiled
    kernels' signatures, of a backup's columns."""
    koffs, kdata, kvalid = _pack(keys)
    voffs, vdata, vvalid = _pack(values)
    n = len(keys)
    hoffs = np.zeros(n + 1, dtype=np.int32)
    flat: list = []
    if hdrs.count(None) != n:
        has = np.fromiter(map(bool, hdrs), dtype=np.bool_, count=n)  # None and [] alike: no headers
        with_h = list(filter(None, hdrs))
        counts = np.zeros(n, dtype=np.int64)
        counts[has] = np.fromiter(map(len, with_h), dtype=np.int64, count=len(with_h))
        np.cumsum(counts, out=hoffs[1:], dtype=np.int32)
        flat = list(chain.from_iterable(with_h))
    hkeys = list(map(itemgetter(0), flat))
    try:
        hkb = list(map(str.encode, hkeys))  # confluent-kafka gives str keys: UTF-8
    except TypeError:
        hkb = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in hkeys]
    hkoffs, hkdata, _ = _pack(hkb)
    hvoffs, hvdata, hvvalid = _pack(list(map(itemgetter(1), flat)))  # bytes or None
    return RecordColumns(
        offsets=offsets, timestamps=timestamps,
        key_offsets=koffs, key_data=kdata, key_valid=kvalid,
        value_offsets=voffs, value_data=vdata, value_valid=vvalid,
        header_offsets=hoffs, header_key_offsets=hkoffs, header_key_data=hkdata,
        header_value_offsets=hvoffs, header_value_data=hvdata, header_value_valid=hvvalid,
    )


@dataclass
class _Pending:
    """Consumed records of one partition not handed over yet (the Message objects themselves:
    their fields are read in bulk when the chunk is built)."""

    msgs: list[Any] = field(default_factory=list)
    offsets: list[np.ndarray] = field(default_factory=list)
    nbytes: int = 0


class _Buffers:
    """Per-partition chunks being filled, bounded per partition and all together
    (:class:`BackupMemory`); full chunks go to ``emit(key, msgs, offsets)``."""

    def __init__(self, memory: BackupMemory, chunk_records: int,
                 emit: Callable[[tuple[str, int], list[Any], np.ndarray], None]) -> None:
        self.memory = memory
        self.chunk_records = chunk_records
        self.emit = emit
        self.parts: dict[tuple[str, int], _Pending] = {}
        self.total = 0

    def add(self, key: tuple[str, int], msgs: list[Any], offsets: np.ndarray, nbytes: int) -> None:
        pend = self.parts.get(key)
        if pend is None:
            pend = self.parts[key] = _Pending()
        pend.msgs.extend(msgs)
        pend.offsets.append(offsets)
        pend.nbytes += nbytes
        self.total += nbytes
        if pend.nbytes >= self.memory.chunk_bytes or len(pend.msgs) >= self.chunk_records:
            self.flush(key)
        while self.total > self.memory.buffer_bytes:
            self.flush(max(self.parts, key=lambda k: self.parts[k].nbytes))

    def last_offset(self, key: tuple[str, int]) -> int | None:
        pend = self.parts.get(key)
        return int(pend.offsets[-1][-1]) if pend else None

    def flush(self, key: tuple[str, int]) -> None:
        pend = self.parts.pop(key, None)
        if pend is None:
            return
        self.total -= pend.nbytes
        offs = pend.offsets[0] if len(pend.offsets) == 1 else np.concatenate(pend.offsets)
        self.emit(key, pend.msgs, offs)

    def flush_all(self) -> None:
        for key in list(self.parts):
            self.flush(key)

class _CutReader:
    """Consumes every partition from its position up to the cut and hands the records over in
    chunks. One ``consume()`` call returns many messages; they are cut into runs of one
    partition and each run is checked and buffered as a whole (offsets as an array)."""

    def __init__(self, consumer: Any, cut: dict[tuple[str, int], tuple[int, int]],
                 positions: dict[tuple[str, int], int], buffers: _Buffers, *, consume_batch: int,
                 timeout: float, on_chunk: Callable[[], None] | None,
                 release: Callable[[list[Any]], None] | None = None) -> None:
        self.consumer = consumer
        #: Takes each consume() result once buffered, to drop it elsewhere (the writing thread
        #: frees the messages there, not on the consuming thread).
        self.release = release
        self.cut = cut
        self.positions = positions
        self.active = {k: cut[k][1] for k, v in positions.items() if v < cut[k][1]}  # key -> end offset
        self.buffers = buffers
        self.consume_batch = consume_batch
        self.timeout = timeout
        self.on_chunk = on_chunk
        self.last_error: str | None = None

    def remaining(self) -> int:
        return sum(end - self.positions[k] for k, end in self.active.items())

    def run(self, every: float, periodic: Callable[[], None]) -> None:
        """Read until every partition reached the cut; ``periodic`` every ``every`` seconds."""
        from confluent_kafka import TopicPartition

        if self.active:
            self.consumer.assign([TopicPartition(t, p, self.positions[(t, p)]) for (t, p) in sorted(self.active)])
        last_tick = last_progress = time.monotonic()
        # librdkafka retries retriable errors (leader moves, a broker down) by itself; give up
        # only when nothing at all arrives for this long, so --resume can take over later.
        stall_timeout = max(4 * self.timeout, 60.0)
        while self.active:
            # consume() waits for num_messages or the timeout: ask for no more than can still
            # come (plus one EOF event per partition) so the tail does not wait out the timeout.
            want = self.remaining() + len(self.active)
            msgs = self.consumer.consume(num_messages=max(1, min(self.consume_batch, want)), timeout=0.5)
            now = time.monotonic()
            took = self.take(msgs)
            if self.release is not None:
                self.release(msgs)
            del msgs
            if took:
                last_progress = now
            elif now - last_progress > stall_timeout:
                raise KafkaClusterError(f"no record arrived for {stall_timeout:.0f} s with {len(self.active)} partition(s) "
                               f"unfinished (last error: {self.last_error}); continue later with --resume")
            if self.on_chunk is not None:
                self.on_chunk()
            if now - last_tick > every:
                periodic()
                last_tick = time.monotonic()
        self.buffers.flush_all()

    def take(self, msgs: list[Any]) -> bool:
        """Buffer one consume() result; True when it held a record or an end-of-partition."""
        error, topic, partition, offset, *_ = _message_methods()
        if not msgs:
            return False
        errs = list(map(error, msgs))
        eofs: list[Any] = []
        if any(map(is_not, errs, repeat(None))):  # (KafkaError == None raises: no count())
            eofs = self._errors(msgs, errs)
            msgs = [m for m, e in zip(msgs, errs, strict=True) if e is None]
        if msgs:
            parts = np.fromiter(map(partition, msgs), dtype=np.int64, count=len(msgs))
            topics = list(map(topic, msgs))
            if topics.count(topics[0]) != len(topics):
                ids = {t: i for i, t in enumerate(sorted(set(topics)))}
                parts = parts + (1 << 32) * np.array([ids[t] for t in topics], dtype=np.int64)
            bounds = [0, *(np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist(), len(msgs)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                m0 = msgs[a]
                self._take_run((topic(m0), partition(m0)), msgs[a:b], offset)
        for m in eofs:  # after the records that came before them
            key = (topic(m), partition(m))
            if key in self.active and offset(m) >= self.active[key]:
                self._finish(key)
        return bool(msgs) or bool(eofs)

    def _take_run(self, key: tuple[str, int], run: list[Any], offset: Callable) -> None:
        end = self.active.get(key)
        if end is None:
            return  # a partition already finished (records past the cut)
        offs = np.fromiter(map(offset, run), dtype=np.int64, count=len(run))
        if offs[-1] >= end:
            k = int(np.searchsorted(offs, end))
            run, offs = run[:k], offs[:k]
        if len(run):
            self.buffers.add(key, run, offs, _run_bytes(run))
            self.positions[key] = int(offs[-1]) + 1
        if self.positions[key] >= end:
            self._finish(key)

    def _errors(self, msgs: list[Any], errs: list[Any]) -> list[Any]:
        """Raise on errors a backup cannot go past; return the end-of-partition events."""
        from confluent_kafka import KafkaError

        fatal, skipped = _codes(_FATAL_NAMES), _codes(_SKIPPED_NAMES)
        eofs = []
        for m, err in zip(msgs, errs, strict=True):
            if err is None:
                continue
            key = (m.topic(), m.partition())
            if err.code() == KafkaError._PARTITION_EOF:
                eofs.append(m)
            elif err.fatal() or err.code() in fatal:
                raise KafkaClusterError(f"consuming {key[0]}/{key[1]} failed: {err.str()}")
            elif key in self.active and err.code() in skipped:
                at = self.buffers.last_offset(key)
                at = self.positions[key] if at is None else at + 1
                raise KafkaClusterError(
                    f"records of {key[0]}/{key[1]} from about offset {at} cannot be "
                    f"read ({err.name()}: {err.str()}): deleted from the broker "
                    "(retention, DeleteRecords) after the backup planned them, or "
                    "corrupt; the backup would miss them"
                )
            else:
                self.last_error = err.str()
        return eofs

    def _finish(self, key: tuple[str, int]) -> None:
        """The partition reached the cut: hand over what it holds and stop fetching it."""
        from confluent_kafka import TopicPartition

        del self.active[key]
        self.buffers.flush(key)
        self.consumer.incremental_unassign([TopicPartition(*key)])


_HKEY, _HVALUE = itemgetter(0), itemgetter(1)


def _run_bytes(run: list[Any]) -> int:
    """Bytes a run of messages holds: values, keys and headers (``len(message)`` is only the
    value's, so a topic of tombstones with large keys or headers would not count at all).
    C-level maps over the unbound methods (a third of ``methodcaller``'s cost): this runs on
    the consuming thread."""
    _, _, _, _, key, _, headers, _ = _message_methods()
    values = sum(map(len, run))
    keys = sum(map(len, filter(None, map(key, run))))
    hdrs = list(filter(None, map(headers, run)))
    if not hdrs:
        return values + keys
    flat = list(chain.from_iterable(hdrs))
    # header keys are str: their length in characters, close enough for a memory bound
    return (values + keys + sum(map(len, map(_HKEY, flat)))
            + sum(map(len, filter(None, map(_HVALUE, flat)))))
