"""Read a Kafka broker's log directory (``<topic>-<partition>/NNNNNNNNNNNNNNNNNNNN.log`` …) on fsspec.

Reading a partition follows what Kafka itself does:

* segments in base-offset order, each batch's CRC-32C checked;
* at the first cut-off or corrupt batch the partition ends there, like Kafka's log recovery
  truncates the segment and deletes every later one; the caller gets a :class:`TailReport`
  (file, byte position, bytes dropped, later segments dropped);
* control batches are never returned, and batches of aborted transactions are dropped exactly as a
  ``read_committed`` consumer drops them. Aborted transactions come from the ``.txnindex`` files
  and from the transaction markers in the log (an ABORT marker closes its producer's open
  transaction); a transaction still open where the log ends is dropped with a warning, because its
  records were never committed;
* ``start_offset`` / ``start_time`` seek with the sparse ``.index`` / ``.timeindex``: the entry at
  or before the target (for time, strictly before it, which stays exact for out-of-order
  CreateTime timestamps), then a forward scan.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import fsspec
from fsspec.core import url_to_fs

from fsspec_kbs.errors import BackupNotFoundError, SegmentFormatError, TruncatedSegmentError
from fsspec_kbs.format.kafka_log import (
    BATCH_HEADER_STRUCT,
    CONTROL_ABORT,
    DEFAULT_MAX_UNCOMPRESSED,
    KAFKA_BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    AbortedTxn,
    KafkaBatchHeader,
    KafkaColumns,
    LogTail,
    ReadCommittedFilter,
    TxnTracker,
    control_type,
    decode_batches,
    lookup_offset,
    lookup_time,
    parse_offset_index,
    parse_time_index,
    parse_txn_index,
    walk_batches,
)

log = logging.getLogger(__name__)

_PARTITION_DIR = re.compile(r"(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>0|[1-9][0-9]*)")
_SEGMENT_FILE = re.compile(r"(?P<base>\d{20})\.(?P<ext>log|index|timeindex|txnindex)")
#: Kafka's internal topics; skipped unless asked for (their records are broker state, not data).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata",
                             "__share_group_state"})


#: Records decoded into one chunk at most (bounds memory for highly compressed batches).
CHUNK_RECORDS = 256 * 1024


class KafkaLogWarning(UserWarning):
    """Something in a Kafka log directory was skipped or truncated; the message says what."""


@dataclass(frozen=True)
class LogSegmentFile:
    """One segment of a partition: the ``.log`` file and its index files (None when absent)."""

    base_offset: int
    path: str
    size: int
    index: str | None = None
    timeindex: str | None = None
    txnindex: str | None = None


@dataclass(frozen=True)
class LogPartition:
    topic: str
    partition: int
    path: str
    segments: tuple[LogSegmentFile, ...]


@dataclass
class TailReport:
    """Where a partition's log stops being valid and how much was left out."""

    topic: str
    partition: int
    path: str
    position: int
    dropped_bytes: int
    reason: str
    dropped_segments: list[str] = field(default_factory=list)
    dropped_segment_bytes: int = 0

    @property
    def message(self) -> str:
        text = (f"{self.topic}-{self.partition}: {self.path} is not a valid log from byte {self.position} "
                f"({self.reason}); dropped the last {self.dropped_bytes} bytes of that file")
        if self.dropped_segments:
            text += (f" and {len(self.dropped_segments)} later segment(s), {self.dropped_segment_bytes} bytes "
                     f"({', '.join(p.rsplit('/', 1)[-1] for p in self.dropped_segments)})")
        return text + ", as Kafka's log recovery would"

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "path": self.path, "position": self.position,
                "dropped_bytes": self.dropped_bytes, "reason": self.reason,
                "dropped_segments": self.dropped_segments, "dropped_segment_bytes": self.dropped_segment_bytes}


@dataclass
class PartitionStats:
    """What reading one partition found."""

    topic: str
    partition: int
    records: int = 0
    batches: int = 0
    control_batches: int = 0
    aborted_batches: int = 0
    aborted_records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    timestamp_types: set[int] = field(default_factory=set)
    tail: TailReport | None = None
    open_transactions: list[AbortedTxn] = field(default_factory=list)

    def to_dict(self) -> dict:
        from fsspec_kbs.format.kafka_log import TIMESTAMP_TYPE_NAMES

        return {"topic": self.topic, "partition": self.partition, "records": self.records,
                "batches": self.batches, "control_batches": self.control_batches,
                "aborted_batches": self.aborted_batches, "aborted_records": self.aborted_records,
                "first_offset": self.first_offset, "last_offset": self.last_offset,
                "timestamp_types": sorted(TIMESTAMP_TYPE_NAMES[t] for t in self.timestamp_types),
                "tail": None if self.tail is None else self.tail.to_dict(),
                "open_transactions": [{"producer_id": t.producer_id, "first_offset": t.first_offset}
                                      for t in self.open_transactions]}


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, KafkaLogWarning, stacklevel=3)


@dataclass(frozen=True)
class _Bounds:
    """What one :meth:`KafkaLogDir.read_partition` reads, and in what pieces."""

    start_offset: int | None
    end_offset: int | None
    start_time: int | None
    max_batch_bytes: int
    chunk_bytes: int


@dataclass
class _Transactions:
    """The ``read_committed`` state of one partition read."""

    #: Decides which batches a ``read_committed`` consumer gets (aborted transactions so far).
    filter: ReadCommittedFilter
    #: Transactions opened and aborted in the log read so far.
    tracker: TxnTracker = field(default_factory=TxnTracker)
    #: (producer id, first offset) of open transactions whose marker was already looked for.
    resolved: set[tuple[int, int]] = field(default_factory=set)
    started: bool = False

    def track(self, data: bytes, pos: int, path: str, headers: list[KafkaBatchHeader]) -> dict[int, int]:
        """Feed a segment's batches (``data`` read from byte ``pos``) to the tracker; returns the
        control record type of each control batch by byte position."""
        if headers and not self.started:
            # Aborted transactions that ended before where reading starts are irrelevant (the
            # broker leaves them out of a fetch response for the same reason).
            self.filter.start_at(headers[0].base_offset)
            self.started = True
        controls: dict[int, int] = {}
        for h in headers:
            if h.is_control:
                controls[h.position] = control_type(data, h, h.position - pos, path)
            self.tracker.add(h, controls.get(h.position))
        self.filter.add(self.tracker.aborted)
        return controls


def _segments_from(segs: tuple[LogSegmentFile, ...], start_offset: int | None,
                   end_offset: int | None) -> list[LogSegmentFile]:
    """The segments that may hold offsets in ``[start_offset, end_offset)``: from the last one
    starting at or before ``start_offset``, up to ``end_offset``."""
    out = list(segs)
    if end_offset is not None:
        out = [s for s in out if s.base_offset < end_offset]
    if start_offset is not None:
        first = 0
        for i, s in enumerate(out):
            if s.base_offset <= start_offset:
                first = i
        out = out[first:]
    return out


def _corrupt_tail(part: LogPartition, seg: LogSegmentFile, tail: LogTail, on_corrupt_tail: str,
                  stats: PartitionStats) -> None:
    """The partition ends at ``tail`` (an invalid batch in ``seg``): raise with
    ``on_corrupt_tail="error"``, else report it in ``stats.tail`` and as a warning."""
    if on_corrupt_tail == "error":
        err = tail.error or SegmentFormatError(tail.reason, seg.path, tail.position)
        raise type(err)(f"{err.reason}; the log is not valid from byte {tail.position} on (the last "
                        f"{tail.dropped_bytes} bytes of the file)", seg.path,
                        err.offset if err.offset is not None else tail.position)
    later = [s for s in part.segments if s.base_offset > seg.base_offset]
    stats.tail = TailReport(part.topic, part.partition, seg.path, tail.position, tail.dropped_bytes,
                            tail.reason, [s.path for s in later], sum(s.size for s in later))
    _warn(stats.tail.message)


def _wanted(h: KafkaBatchHeader, keep: bool, stats: PartitionStats, bounds: _Bounds) -> bool:
    """Whether batch ``h`` is decoded: not a control batch, not aborted (``keep``: what the
    ``read_committed`` filter says; both counted in ``stats``), not empty, in the bounds."""
    if h.is_control:
        stats.control_batches += 1
        return False
    if not keep:
        stats.aborted_batches += 1
        stats.aborted_records += h.records_count
        return False
    if h.records_count == 0:
        return False  # compaction leaves empty batches behind to keep producer state
    if bounds.start_offset is not None and h.last_offset < bounds.start_offset:
        return False
    return not (bounds.start_time is not None and h.max_timestamp < bounds.start_time)


class KafkaLogDir:
    """A Kafka ``log.dirs`` entry on any fsspec URL.

    Parameters
    ----------
    url : str
        The log directory (the one holding ``<topic>-<partition>/`` directories).
    storage_options : dict, optional
        For the fsspec filesystem.
    include_internal : bool, default False
        Also read ``__consumer_offsets``, ``__transaction_state`` and the other internal topics.
    """

    def __init__(self, url: str, storage_options: dict | None = None, include_internal: bool = False,
                 fs: fsspec.AbstractFileSystem | None = None) -> None:
        if fs is None:
            fs, path = url_to_fs(url, **(storage_options or {}))
        else:
            path = url
        self.fs = fs
        self.path = path.rstrip("/")
        self.url = url
        self.include_internal = include_internal
        self._partitions: list[LogPartition] | None = None

    def partitions(self, topics: Iterable[str] | None = None, partitions: Iterable[int] | None = None,
                   topic_pattern: str | None = None) -> list[LogPartition]:
        """Partition directories, sorted by (topic, partition), optionally filtered."""
        if self._partitions is None:
            self._partitions = self._discover()
        tset = None if topics is None else set(topics)
        pset = None if partitions is None else set(partitions)
        rx = None if topic_pattern is None else re.compile(topic_pattern)
        return [p for p in self._partitions
                if (tset is None or p.topic in tset) and (pset is None or p.partition in pset)
                and (rx is None or rx.fullmatch(p.topic))]

    def _discover(self) -> list[LogPartition]:
        if not self.fs.isdir(self.path):
            raise BackupNotFoundError(f"no Kafka log directory at {self.url}")
        out = []
        for info in self.fs.ls(self.path, detail=True):
            if info["type"] != "directory":
                continue
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            # Skips `<topic>-<p>.<id>-delete`, `-future`, `-stray` and metadata dirs by shape.
            m = _PARTITION_DIR.fullmatch(name)
            if not m:
                continue
            topic = m.group("topic")
            if topic in INTERNAL_TOPICS and not self.include_internal:
                continue
            segs = self._segments(info["name"].rstrip("/"))
            out.append(LogPartition(topic, int(m.group("partition")), info["name"].rstrip("/"), segs))
        return sorted(out, key=lambda p: (p.topic, p.partition))

    def _segments(self, pdir: str) -> tuple[LogSegmentFile, ...]:
        files: dict[int, dict[str, tuple[str, int]]] = {}
        for info in self.fs.ls(pdir, detail=True):
            if info["type"] != "file":
                continue
            name = info["name"].rsplit("/", 1)[-1]
            m = _SEGMENT_FILE.fullmatch(name)
            if not m:
                if name.endswith((".swap", ".cleaned")):
                    _warn(f"{info['name']}: an unfinished log-cleaner file; ignored (Kafka would redo "
                          "the cleaning on start-up)")
                continue
            files.setdefault(int(m.group("base")), {})[m.group("ext")] = (info["name"], int(info.get("size") or 0))
        segs = []
        for base, exts in sorted(files.items()):
            if "log" not in exts:
                continue  # an index without its log is left over from a deleted segment
            segs.append(LogSegmentFile(base, exts["log"][0], exts["log"][1],
                                       *(exts[e][0] if e in exts else None for e in ("index", "timeindex", "txnindex"))))
        return tuple(segs)

    # -- reading ---------------------------------------------------------------------------------
    def read_partition(
        self,
        part: LogPartition,
        *,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: int | None = None,
        verify_crc: bool = True,
        on_corrupt_tail: str = "truncate",
        max_batch_bytes: int = DEFAULT_MAX_UNCOMPRESSED,
        chunk_bytes: int = 32 * 1024 * 1024,
        stats: PartitionStats | None = None,
    ) -> Iterator[KafkaColumns]:
        """Records of one partition, in offset order, as ``read_committed`` would return them.

        Batches wholly outside ``[start_offset, end_offset)`` or wholly before ``start_time`` are
        skipped; rows are not filtered (records of a partly matching batch are all returned).

        Parameters
        ----------
        on_corrupt_tail : {"truncate", "error"}, default "truncate"
            "truncate" ends the partition at the first invalid batch (reported in
            ``stats.tail`` and as a :class:`KafkaLogWarning`); "error" raises the
            :class:`~fsspec_kbs.errors.SegmentFormatError` instead.
        stats : PartitionStats, optional
            Filled in as the partition is read.
        """
        if on_corrupt_tail not in ("truncate", "error"):
            raise ValueError("on_corrupt_tail must be 'truncate' or 'error'")
        if stats is None:
            stats = PartitionStats(part.topic, part.partition)
        bounds = _Bounds(start_offset, end_offset, start_time, max_batch_bytes, chunk_bytes)
        txns = _Transactions(ReadCommittedFilter(self._txn_index_aborts(part)))
        for seg in _segments_from(part.segments, start_offset, end_offset):
            pos = self._seek(seg, start_offset, start_time)
            data = self.fs.cat_file(seg.path, start=pos) if pos else self.fs.cat_file(seg.path)
            headers, tail = walk_batches(data, pos, seg.path, verify_crc)
            if tail is not None:
                _corrupt_tail(part, seg, tail, on_corrupt_tail, stats)
            controls = txns.track(data, pos, seg.path, headers)
            # Transactions still open at the end of this segment: find their markers further on.
            later = [] if tail is not None else [s for s in part.segments if s.base_offset > seg.base_offset]
            self._close_open(part, later, txns, stats)
            yield from self._decode(data, pos, seg.path, headers, controls, txns.filter, stats, bounds)
            if tail is not None:
                return

    def _txn_index_aborts(self, part: LogPartition) -> list[AbortedTxn]:
        """The aborted transactions the partition's ``.txnindex`` files list."""
        aborted: list[AbortedTxn] = []
        for s in part.segments:
            if s.txnindex is not None:
                aborted.extend(parse_txn_index(self.fs.cat_file(s.txnindex), s.txnindex))
        return aborted

    def _close_open(self, part: LogPartition, later: list[LogSegmentFile], txns: _Transactions,
                    stats: PartitionStats) -> None:
        """Look for the markers of the transactions open at a segment's end in the ``later``
        segments (once per transaction, however many segments it spans); those without one
        where the log ends were never committed: left out, with a warning."""
        pending = {pid: first for pid, first in txns.tracker.open.items() if (pid, first) not in txns.resolved}
        if not pending:
            return
        found, still_open = self._lookahead(later, dict(pending))
        txns.filter.add(found)
        txns.resolved.update((pid, first) for pid, first in pending.items() if pid not in still_open)
        if not still_open:
            return
        unfinished = [AbortedTxn(first, pid) for pid, first in still_open.items()]
        new = [t for t in unfinished if t not in stats.open_transactions]
        if new:
            stats.open_transactions.extend(new)
            _warn(f"{part.topic}-{part.partition}: {len(new)} transaction(s) have no commit or abort "
                  f"marker where the log ends (producer ids {sorted(t.producer_id for t in new)}); "
                  "their records are left out")
        txns.filter.add(unfinished)

    def _decode(self, data: bytes, pos: int, path: str, headers: list[KafkaBatchHeader], controls: dict[int, int],
                filt: ReadCommittedFilter, stats: PartitionStats, bounds: _Bounds) -> Iterator[KafkaColumns]:
        group: list[KafkaBatchHeader] = []
        size = count = 0
        for h in headers:
            if bounds.end_offset is not None and h.base_offset >= bounds.end_offset:
                break
            if not _wanted(h, filt.keep(h, controls.get(h.position)), stats, bounds):
                continue
            group.append(h)
            size += h.size
            count += h.records_count
            # Compressed size alone would make huge chunks of well-compressed data; cap records too.
            if size >= bounds.chunk_bytes or count >= CHUNK_RECORDS:
                yield self._emit(data, pos, path, group, stats, bounds.max_batch_bytes)
                group, size, count = [], 0, 0
        if group:
            yield self._emit(data, pos, path, group, stats, bounds.max_batch_bytes)

    @staticmethod
    def _emit(data: bytes, pos: int, path: str, group: list[KafkaBatchHeader], stats: PartitionStats,
              max_batch_bytes: int) -> KafkaColumns:
        kc = decode_batches(data, group, pos, path, max_batch_bytes)
        n = len(kc)
        stats.batches += len(group)
        stats.records += n
        if n:
            if stats.first_offset is None:
                stats.first_offset = int(kc.columns.offsets[0])
            stats.last_offset = int(kc.columns.offsets[-1])
            stats.timestamp_types.update(int(t) for t in set(kc.timestamp_types.tolist()))
        return kc

    def _seek(self, seg: LogSegmentFile, start_offset: int | None, start_time: int | None) -> int:
        """Byte position in ``seg`` to start reading at for the start bounds (0 = the beginning)."""
        pos = 0
        try:
            if start_offset is not None and start_offset > seg.base_offset and seg.index is not None:
                entries = parse_offset_index(self.fs.cat_file(seg.index), seg.base_offset)
                pos = lookup_offset(entries, start_offset)
            if start_time is not None and seg.timeindex is not None:
                offset = lookup_time(parse_time_index(self.fs.cat_file(seg.timeindex), seg.base_offset), start_time)
                if offset is not None and seg.index is not None:
                    entries = parse_offset_index(self.fs.cat_file(seg.index), seg.base_offset)
                    pos = max(pos, lookup_offset(entries, offset))
        except FileNotFoundError:
            return 0
        if pos <= 0 or pos >= seg.size:
            return 0
        # An index can be stale (Kafka rebuilds them after an unclean shutdown): trust it only if
        # it points at a batch header.
        head = self.fs.cat_file(seg.path, start=pos, end=pos + KAFKA_BATCH_HEADER_SIZE)
        try:
            h = _header_only(head, seg.path, pos)
        except SegmentFormatError:
            h = None
        if h is None or h.base_offset < seg.base_offset:
            _warn(f"{seg.index}: index entry points at byte {pos}, which is not a batch; reading the segment "
                  "from its start")
            return 0
        return pos

    def _lookahead(self, segs: list[LogSegmentFile], pending: dict[int, int]
                   ) -> tuple[list[AbortedTxn], dict[int, int]]:
        """Find the markers of transactions still open at a segment boundary, reading headers only.

        Returns the aborted ones found and those still open where the log (or its valid part) ends.
        """
        found: list[AbortedTxn] = []
        for seg in segs:
            if not pending:
                break
            with self.fs.open(seg.path, "rb") as f:
                pos = 0
                while pending and pos < seg.size:
                    f.seek(pos)
                    try:
                        h = _header_only(f.read(KAFKA_BATCH_HEADER_SIZE), seg.path, pos)
                        if pos + h.size > seg.size:
                            raise SegmentFormatError("batch cut off", seg.path, pos)
                        ctype = None
                        if h.is_control and h.producer_id in pending:
                            f.seek(pos)
                            ctype = control_type(f.read(h.size), h, 0, seg.path)
                    except SegmentFormatError:
                        return found, pending  # the damaged tail; read_partition reports it there
                    if ctype is not None:
                        first = pending.pop(h.producer_id)
                        if ctype == CONTROL_ABORT:
                            found.append(AbortedTxn(first, h.producer_id, h.base_offset))
                    pos += h.size
        return found, pending


def _header_only(head: bytes, path: str, pos: int) -> KafkaBatchHeader:
    """Parse a batch header read on its own (without the batch body)."""
    if len(head) < KAFKA_BATCH_HEADER_SIZE:
        raise TruncatedSegmentError("batch header cut off", path, pos)
    h = KafkaBatchHeader(pos, *BATCH_HEADER_STRUCT.unpack_from(head, 0))
    if h.magic != 2 or h.batch_length < KAFKA_BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise SegmentFormatError("not a v2 batch header", path, pos)
    return h
