"""Streaming source of the ``kbs`` data source: a growing backup read as a stream.

The stream's offset is, as in Spark's Kafka source, the next offset to read of every
partition: ``{"topic": {"0": 123}}``. Each trigger re-reads ``manifest.json``: segments any
writer appended since appear in the next micro-batch. A micro-batch ``[start, end)`` is
planned like a batch read (:func:`fsspec_kbs.spark.planning.input_partitions`, the same input
partitions and executor code), from the manifest only: segments outside the range are not
opened.

Offsets that were in the backup and are no longer (retention dropped leading segments, the
backup was replaced by one holding fewer offsets, a partition disappeared) are data loss: with
``failOnDataLoss`` (default) the query fails naming them; without it a warning is logged and
the stream goes on from what the backup holds, as the Kafka source does.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from fsspec_kbs.errors import (
    BackupNotFoundError,
    CommitInProgressError,
    IncompleteBackupError,
    UnsupportedVersionError,
)
from fsspec_kbs.spark.options import EARLIEST, LATEST, KbsOptions, _int, offsets_json, parse_options
from fsspec_kbs.spark.partition import KbsSegmentPartition, SegmentPiece
from fsspec_kbs.spark.planning import (
    input_partitions,
    open_for_planning,
    refs_by_partition,
    starting_offset_at,
)
from fsspec_kbs.spark.reader import KbsReader
from fsspec_kbs.store import Backup, SegmentRef

log = logging.getLogger("fsspec_kbs.spark")

#: ``{"topic": {"partition": next offset}}``: what Spark stores in its offset log.
Offsets = dict[str, dict[str, int]]
#: Read options of a batch read that have no meaning for a stream (as in the Kafka source).
_NOT_FOR_STREAMS = {
    "endingoffsets": "endingOffsets",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "endingtimestamp": "endingTimestamp",
}
_NOT_YET = {"minoffsetspertrigger": "minOffsetsPerTrigger", "maxtriggerdelay": "maxTriggerDelay"}
#: A commit being applied by another writer hides the manifest at most this long (an overwrite).
COMMIT_WAIT_S = 30.0


@dataclass(frozen=True)
class KbsStreamOptions:
    """A streaming read: the batch read options (topics, ``assign``, timestamps, grouping…)
    plus where the stream starts and how much a micro-batch takes."""

    read: KbsOptions
    #: ``"earliest"``, ``"latest"`` or per-partition offsets (-2 earliest, -1 latest).
    starting: str | Offsets = "latest"
    max_offsets_per_trigger: int | None = None


def parse_stream_options(options: Mapping[str, str]) -> KbsStreamOptions:
    """Spark's options of ``readStream.format("kbs")``; like :func:`parse_options` (mode ``read``)
    with the Kafka source's streaming rules: ``startingOffsets`` defaults to ``latest``,
    ``maxOffsetsPerTrigger`` bounds a micro-batch, ending offsets are refused."""
    rest: dict[str, str] = {}
    starting_text = max_text = None
    for key, value in options.items():
        low = str(key).lower()
        if low in _NOT_FOR_STREAMS:
            raise ValueError(f"option {_NOT_FOR_STREAMS[low]!r} is not valid in a streaming query (as with "
                             "Spark's Kafka source): a stream has no end; use a batch read to read a range")
        if low in _NOT_YET:
            raise ValueError(f"option {_NOT_YET[low]!r} is not supported by the kbs stream source yet; "
                             "use maxOffsetsPerTrigger and the query's trigger interval")
        if low == "startingoffsets":
            starting_text = value
        elif low == "maxoffsetspertrigger":
            max_text = value
        else:
            rest[key] = value
    read = parse_options(rest, "read")
    starting: str | Offsets = "latest"
    if starting_text is not None and starting_text.strip():
        text = starting_text.strip()
        word, offsets = offsets_json("startingOffsets", text, ending=False, stream=True)
        starting = word if word is not None else offsets
    given_time = read.starting_offsets_by_timestamp or read.starting_timestamp is not None
    if starting_text is not None and starting_text.strip() and given_time:
        raise ValueError("options 'startingOffsets' and 'startingOffsetsByTimestamp'/'startingTimestamp' "
                         "cannot be used together")
    return KbsStreamOptions(read, starting, _int("maxOffsetsPerTrigger", max_text, None, 1))


@dataclass
class _Snapshot:
    """One read of the manifest: the backup, its CRC, each wanted partition's refs and extent."""

    backup: Backup | None
    crc: int | None
    refs: dict[tuple[str, int], list[SegmentRef]]
    #: (first offset, next offset) per partition.
    extents: dict[tuple[str, int], tuple[int, int]]


def _key(topic: str, partition: int | str) -> tuple[str, int]:
    return str(topic), int(partition)


def _to_json(offsets: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def _from_json(doc: Mapping | None) -> dict[tuple[str, int], int]:
    return {_key(t, p): int(off) for t, parts in (doc or {}).items() for p, off in parts.items()}


def rate_limit(start: dict[tuple[str, int], int], latest: dict[tuple[str, int], int],
               limit: int) -> dict[tuple[str, int], int]:
    """At most ``limit`` offsets in total, shared by the partitions in proportion to what each
    has to read (Spark's ``KafkaMicroBatchStream.rateLimit``: small partitions are not starved)."""
    sizes = {k: max(0, end - start.get(k, end)) for k, end in latest.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(latest)
    out = {}
    for k, end in latest.items():
        begin = start.get(k)
        if begin is None or sizes[k] == 0:
            out[k] = end
            continue
        prorate = limit * (sizes[k] / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[k] = min(end, begin + step)
    return out


class KbsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a backup as a stream of micro-batches with the schema of Spark's Kafka source.

    Parameters
    ----------
    options : KbsStreamOptions
        Parsed options (:func:`parse_stream_options`).
    columns : list of str
        Output columns (the source's schema).
    """

    def __init__(self, options: KbsStreamOptions, columns: list[str]) -> None:
        self.stream = options
        self.options = options.read
        self._reader = KbsReader(options.read, columns)
        #: Trigger.AvailableNow: the offsets latest at the start, never read past.
        self._target: dict[tuple[str, int], int] | None = None
        self._latest: dict[tuple[str, int], int] | None = None
        self._snapshot: _Snapshot | None = None

    def __getstate__(self) -> dict:
        # Executors get the reader pickled: no backup object, nothing that grows with it.
        return {**self.__dict__, "_snapshot": None}

    # -- the manifest ------------------------------------------------------------------------------
    def _open(self) -> _Snapshot:
        """The backup as published now; none yet is an empty stream (as a topic not yet created)."""
        o = self.options
        deadline = time.monotonic() + COMMIT_WAIT_S
        while True:
            try:
                backup, crc = open_for_planning(o)
                break
            except CommitInProgressError:
                # Another writer is publishing (an append takes milliseconds): wait for it.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
            except (BackupNotFoundError, IncompleteBackupError) as e:
                log.info("kbs stream: no backup at %s yet (%s)", o.path, type(e).__name__)
                return _Snapshot(None, None, {}, {})
        sf = o.scan_filter()
        by_part, all_extents = refs_by_partition(backup)
        refs = {k: rs for k, rs in by_part.items() if sf.wants_partition(*k) and o.wants(*k)}
        extents = {}
        for k in refs:
            lo, hi = all_extents[k]
            if lo is None or hi is None:
                raise UnsupportedVersionError(f"{o.path}: partition {k[0]}/{k[1]} has segments without offsets in its "
                               "manifest (a 1.0 manifest); a stream needs them: rewrite it with `kbs convert`")
            extents[k] = (lo, hi)
        self._snapshot = _Snapshot(backup, crc, refs, extents)
        return self._snapshot

    def _latest_now(self) -> dict[tuple[str, int], int]:
        return {k: hi for k, (_, hi) in self._open().extents.items()}

    # -- offsets -----------------------------------------------------------------------------------
    def initialOffset(self) -> Offsets:  # noqa: N802 - Spark's hook names
        snap = self._open()
        o, starting = self.options, self.stream.starting
        out: dict[tuple[str, int], int] = {}
        for k, (lo, hi) in snap.extents.items():
            if o.starting_offsets_by_timestamp or o.starting_timestamp is not None:
                out[k] = self._by_time(snap, k, hi)
            elif starting == "earliest":
                out[k] = lo
            elif starting == "latest":
                out[k] = hi
            else:
                given = starting.get(k[0], {}).get(str(k[1]), EARLIEST)  # type: ignore[union-attr]
                out[k] = lo if given == EARLIEST else hi if given == LATEST else given
        if isinstance(starting, dict):
            for t, parts in starting.items():
                for p, off in parts.items():
                    k = _key(t, p)
                    if k not in snap.extents:
                        self._data_loss(f"startingOffsets names partition {t}/{p}, which is not in the backup")
                        continue
                    lo, hi = snap.extents[k]
                    if off >= 0 and not lo <= off <= hi:
                        self._data_loss(f"startingOffsets asks for offset {off} of {t}/{p}, but the backup holds "
                                        f"offsets {lo} to {hi - 1} of it")
                        out[k] = min(max(off, lo), hi)
        return _to_json(out)

    def _by_time(self, snap: _Snapshot, k: tuple[str, int], hi: int) -> int:
        ts = self.options.starting_time(*k)
        if ts is None:  # a partition startingOffsetsByTimestamp does not name: from its start
            return snap.extents[k][0]
        assert snap.backup is not None
        return starting_offset_at(snap.backup, snap.refs[k], k, ts, self.options, hi)  # type: ignore[return-value]

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        n = self.stream.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:  # noqa: N802
        begin = _from_json(start)
        latest = now = self._latest_now()
        # A partition the stream was reading that the backup no longer has (as the Kafka source
        # reports a deleted partition): data loss, then it is dropped from the offsets.
        for k in sorted(k for k in begin if k not in now):
            self._data_loss(f"partition {k[0]}/{k[1]} is no longer in the backup (the stream had read it up to "
                            f"offset {begin[k]})")
        begin = {k: v for k, v in begin.items() if k in now}
        if self._target is not None:
            latest = {k: min(v, self._target[k]) for k, v in latest.items() if k in self._target}
        self._latest = latest
        # New partitions start at their earliest offset (as the Kafka source reads new partitions).
        snap = self._snapshot
        assert snap is not None
        begin = {**{k: snap.extents[k][0] for k in latest if k not in begin}, **begin}
        end = dict(begin)
        end.update(latest)
        if isinstance(limit, ReadMaxRows):
            end.update(rate_limit(begin, latest, limit.max_rows))
        # A partition that went backwards is reported by partitions().
        return _to_json(end)

    def reportLatestOffset(self) -> Offsets | None:  # noqa: N802
        return None if self._latest is None else _to_json(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._latest_now()

    # -- planning ----------------------------------------------------------------------------------
    def _data_loss(self, what: str) -> None:
        if self.options.fail_on_data_loss:
            raise BackupNotFoundError(
                f"{what}: data that the stream has not read is no longer in the backup at {self.options.path} "
                "(retention or a rewrite removed it). Set failOnDataLoss=false to go on from what the backup "
                "holds (the missing records are then skipped, with a warning)")
        log.warning("kbs stream: %s; some data may have been lost (failOnDataLoss=false: skipping it)", what)

    def _readable(self, snap: _Snapshot, k: tuple[str, int], s: int | None, e: int) -> tuple[int, int] | None:
        """The part of a micro-batch's range ``[s, e)`` of partition ``k`` (``s`` None: new in
        this micro-batch) that the backup holds now; what it no longer holds is data loss."""
        t, p = k
        if k not in snap.extents:
            if s is None or s < e:
                self._data_loss(f"partition {t}/{p} is no longer in the backup (offsets {s} to {e - 1})")
            return None
        lo, hi = snap.extents[k]
        if s is None:
            s = lo  # a partition new in this micro-batch
        if e < s:
            self._data_loss(f"the backup's offsets of {t}/{p} went back from {s} to {e} (it was replaced)")
            return None
        if s < lo:
            self._data_loss(f"offsets {s} to {min(lo, e) - 1} of {t}/{p} are no longer in the backup "
                            f"(it starts at offset {lo} now)")
            s = min(lo, e)
        if e > hi:
            self._data_loss(f"offsets {hi} to {e - 1} of {t}/{p} are no longer in the backup")
            e = hi
        return (s, e) if s < e else None

    def partitions(self, start: Offsets, end: Offsets) -> list[KbsSegmentPartition]:
        begin, stop = _from_json(start), _from_json(end)
        if begin == stop:
            return []
        snap = self._open()
        pieces: list[SegmentPiece] = []
        for k, e in sorted(stop.items()):
            readable = self._readable(snap, k, begin.get(k), e)
            if readable is None:
                continue
            s, e = readable
            pieces.extend(SegmentPiece(ref, s, e) for ref in snap.refs[k]
                          if ref.first_offset is not None and ref.last_offset is not None
                          and ref.first_offset < e and ref.last_offset >= s)
        if not pieces:
            return []
        assert snap.backup is not None
        return input_partitions(snap.backup, pieces, self.options, None, None, snap.crc)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._reader.read(partition)

    def commit(self, end: Offsets) -> None:
        pass  # nothing to release: the backup is read, never consumed
