"""Write a KBS backup: segments rolled by size and record count, manifest last and atomically."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import fsspec
import numpy as np

from fsspec_kbs.errors import CommitConflictError, KbsError, OffsetOrderError
from fsspec_kbs.format import (
    MAX_BATCH_UNCOMPRESSED,
    Codec,
    CompressedBatch,
    EncodedBatch,
    RecordColumns,
    SegmentStats,
    compress_batch,
    plan_encode,
)
from fsspec_kbs.format.batch_index import (
    ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    encode_index,
    index_entries,
    index_from_segment,
)
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.format.codecs import CODEC_NAMES, DEFAULT_LEVELS, codec_from_name
from fsspec_kbs.format.segment import segment_parts
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.batch_index import index_path
from fsspec_kbs.store.commit import (
    COMMIT_FIELD,
    STREAMS_FIELD,
    merge_streams,
    put_file,
    remove_files,
)
from fsspec_kbs.store.layout import resolve
from fsspec_kbs.store.manifest import (
    WRITE_VERSION,
    Manifest,
    PartitionEntry,
    SegmentEntry,
    TopicEntry,
    summarize,
    utc_now_iso,
)
from fsspec_kbs.store.names import (
    MANIFEST,
    TOPICS_DIR,
    backup_id_of,
    check_partition,
    check_topic,
    partition_dir,
    segment_name,
)
from fsspec_kbs.store.txn import BackupState, FaultHook, Move, Transaction, WriteMode, json_of
from fsspec_kbs.threads import worker_pool

#: Input bytes whose batches may be encoded and compressed ahead of the writer. Each batch is
#: encoded only when a thread takes it and dropped once compressed, so what waits is mostly
#: compressed. Writing a segment holds up new work; with two batches per thread the threads
#: then ran dry (a 512 MB write on two threads: 1.9 s; 1.7 s with 64 MiB ahead). Encoding the
#: whole write up front, as before, held it a second time uncompressed (+535 MB of peak RSS
#: against +170 MB now).
COMPRESS_AHEAD_BYTES = 64 * 1024 * 1024


def check_segment_limits(max_bytes: int, max_records: int | None) -> None:
    """A writer's segment roll limits must be positive (``max_records`` None: no limit)."""
    if max_bytes <= 0 or (max_records is not None and max_records <= 0):
        raise ValueError("segment_max_bytes and segment_max_records must be positive")


def check_offsets(topic: str, partition: int, offsets: np.ndarray, last_offset: int) -> None:
    """Offsets about to be appended must be >= 0, above ``last_offset`` and strictly increasing."""
    n = len(offsets)
    if int(offsets[0]) <= last_offset or (n > 1 and not bool(np.all(offsets[1:] > offsets[:-1]))):
        raise OffsetOrderError(
            f"offsets of {topic}/{partition} must strictly increase "
            f"(partition holds up to {last_offset}, got {int(offsets[0])}…{int(offsets[-1])} "
            "not in increasing order)" if n > 1 else
            f"offset {int(offsets[0])} of {topic}/{partition} is not above the last written "
            f"offset {last_offset}")
    if int(offsets[0]) < 0:
        raise OffsetOrderError(f"negative offset {int(offsets[0])} in {topic}/{partition}")


def _input_bytes(cols: RecordColumns) -> int:
    return int(len(cols.key_data) + len(cols.value_data) + len(cols.header_key_data)
               + len(cols.header_value_data) + 16 * len(cols))


@dataclass
class _Queued:
    """A batch handed to the compression threads, not yet taken into its partition."""

    key: tuple[str, int]
    job: cf.Future
    input_bytes: int
    #: Roll the partition's segment after this batch (``segment_max_records`` reached).
    roll: bool = False


MODES = get_args(WriteMode)


@dataclass
class WrittenSegment:
    """A segment file this writer put on storage, and its batch index (kbs-format.md §7)
    beside it when ``index_crc32`` is set."""

    topic: str
    partition: int
    seq: int
    path: str
    stats: SegmentStats
    #: CRC-32 of the whole index file ``index_path`` (the manifest's ``index_crc32``); None: no index.
    index_crc32: int | None = None

    @property
    def index_path(self) -> str:
        return index_path(self.path)

    @property
    def index_size(self) -> int:
        """Size of the index file: its header and one entry per batch."""
        return INDEX_HEADER_SIZE + ENTRY_SIZE * self.stats.batches

    def entry(self) -> SegmentEntry:
        s = self.stats
        return SegmentEntry(segment_name(self.seq), s.first_offset, s.last_offset, s.records,
                            s.min_timestamp, s.max_timestamp, s.size_bytes, s.crc64,
                            index_crc32=self.index_crc32)


@dataclass
class _Partition:
    #: Last offset of the partition: the base backup's, then what this writer added.
    last_offset: int = -1
    pending: list[CompressedBatch] = field(default_factory=list)
    pending_bytes: int = 0
    pending_records: int = 0
    #: Records queued for the current segment since the last roll by record count.
    queued_records: int = 0
    #: Segments this writer staged (or adopted), in offset order; numbered at commit.
    new: list[WrittenSegment] = field(default_factory=list)
    #: Uncompressed bytes of the staged segments (the base's are in its statistics).
    uncompressed: int = 0
    #: Next file name in the staging directory.
    next_seq: int = 0


class BackupWriter:
    """Writes one backup directory.

    Parameters
    ----------
    url : str
        The backup directory, ``<root>/<backup-id>``, on any fsspec URL.
    storage_options : dict, optional
        For the fsspec filesystem.
    compression : {"zstd", "lz4", "none"}, default "zstd"
    level : int, optional
        Codec level (zstd default 3, lz4 default 0).
    segment_max_bytes : int, default 64 MiB
        Roll to a new segment when a segment's compressed size reaches this.
    segment_max_records : int, optional
        Roll to a new segment after this many records.
    batch_max_bytes : int, default 1 MiB
        Uncompressed size of a record batch (at most 16 MiB, as the spec asks).
    mode : {"error", "overwrite", "append", "resume"}, default "error"
        What to do when a backup already exists at ``url``: refuse, replace it, add segments
        to it, or (``resume``) adopt the segments of an incomplete backup and go on writing.
    buffer_max_bytes : int, default 256 MiB
        Bound on compressed data held for unfinished segments across all partitions;
        beyond it the largest pending segment is written early.
    compress_threads : int, optional
        Threads encoding and compressing the batches of one write (default: the cores, at
        most 4). Batches are encoded just in time, so a write holds about its input plus the
        compressed data, never the input a second time uncompressed.
    compress_ahead_bytes : int, default :data:`COMPRESS_AHEAD_BYTES`
        Input bytes queued for compression at most: :meth:`write_columns` returns once its
        batches are queued and waits only beyond this.
    on_segment : callable, optional
        Called with each :class:`WrittenSegment` once it is durable (checkpointing hook).
    txn_id : str, optional
        Names this writer's staging directory ``<url>/_staging/<txn-id>/``; a resumed
        writer passes the id of the run it continues.
    stage_only : bool, default False
        Write segments under ``url/topics/`` and never commit (a Spark task's staging area,
        published later by a :class:`~fsspec_kbs.store.staging.SegmentAdopter`).
    fault : callable, optional
        Called with the name of each commit step (tests inject crashes there).
    index : bool, default True
        Write a batch index (``segment-NNNNNNNN.index``, kbs-format.md §7) beside each
        segment and its ``index_crc32`` in the manifest, so bounded reads fetch only the
        batches they need. It costs 40 bytes per batch and no extra decoding (everything in
        it is known when the segment is assembled); False writes segments without one.

    Segments go to the writer's own staging directory; :meth:`commit` publishes them with
    the commit protocol of :mod:`fsspec_kbs.store.txn`: the manifest names them only once
    they are in place, and a concurrent writer can neither overwrite them nor lose them.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        *,
        compression: str = "zstd",
        level: int | None = None,
        segment_max_bytes: int = 64 * 1024 * 1024,
        segment_max_records: int | None = None,
        batch_max_bytes: int = 1024 * 1024,
        mode: WriteMode = "error",
        buffer_max_bytes: int = 256 * 1024 * 1024,
        source_cluster: dict | None = None,
        on_segment: Callable[[WrittenSegment], None] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        compress_threads: int | None = None,
        compress_ahead_bytes: int = COMPRESS_AHEAD_BYTES,
        txn_id: str | None = None,
        stage_only: bool = False,
        fault: FaultHook | None = None,
        index: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 0 < batch_max_bytes <= MAX_BATCH_UNCOMPRESSED:
            raise ValueError(f"batch_max_bytes must be in 1 … {MAX_BATCH_UNCOMPRESSED}")
        check_segment_limits(segment_max_bytes, segment_max_records)
        self.fs, self.path = resolve(url, storage_options, fs)
        self.url = url
        self.backup_id = backup_id_of(self.path)
        self.codec = codec_from_name(compression)
        self.level = DEFAULT_LEVELS[self.codec] if level is None else level
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_records = segment_max_records
        self.batch_max_bytes = batch_max_bytes
        self.buffer_max_bytes = buffer_max_bytes
        self.compress_threads = min(4, os.cpu_count() or 1) if compress_threads is None else compress_threads
        self.compress_ahead_bytes = compress_ahead_bytes
        self.source_cluster = source_cluster
        self.on_segment = on_segment
        self.mode = mode
        self.index = index
        self.created_at = utc_now_iso()
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._pending_total = 0
        self._queue: deque[_Queued] = deque()
        self._queued_bytes = 0
        self._written: list[WrittenSegment] = []
        self._closed = False
        #: The error that broke this writer: records it took may be lost, so it commits nothing.
        self._failed: BaseException | None = None
        self._base_cache: tuple[int, dict[tuple[str, int], list[SegmentEntry]]] | None = None
        self._txn: Transaction | None = None
        if stage_only:
            self._root = self.path
        else:
            self._txn = Transaction(self.fs, self.path, url, mode, txn_id, fault)
            self._root = self._txn.staging
            self._prepare()

    @property
    def txn_id(self) -> str | None:
        """Id of this writer's transaction (its staging directory's name); None when stage_only."""
        return None if self._txn is None else self._txn.txn_id

    @property
    def claimed(self) -> bool:
        """True once this writer's commit record exists (its staged files belong to it now)."""
        return self._txn is not None and self._txn.record is not None

    @property
    def staging(self) -> str:
        """Where this writer puts its segments before the commit (a path on ``fs``)."""
        return self._root

    # -- set-up ----------------------------------------------------------------------------------
    def _prepare(self) -> None:
        assert self._txn is not None
        base = self._txn.base
        if self.mode == "append" and base.manifest is not None:
            manifest = self._parse(base.manifest)
            self._check_codec(manifest, KbsError)
            self.created_at = manifest.created_at
            if self.source_cluster is None:
                self.source_cluster = manifest.source_cluster
            for (topic, p), entries in self._base_entries(base.version, manifest).items():
                if entries:
                    self._part(topic, p).last_offset = entries[-1].last_offset
        elif self.mode == "resume":
            self._adopt_incomplete()

    def _adopt_incomplete(self) -> None:
        """Resume: take the segments an interrupted run left, first those of a run that wrote
        in place (before commit records), then those in this transaction's staging."""
        for root in (self.path, self._root):
            if not self.fs.exists(f"{root}/{TOPICS_DIR}"):
                continue
            backup = KbsBackup.open(root, fs=self.fs, allow_incomplete=True)
            for ref in backup.segments():
                # Check each fully and take what the manifest and the index need from its data
                # (an index the interrupted run left is rewritten: it is not trusted).
                reader = backup.open_segment(ref)
                entries = index_from_segment(reader)
                h = reader.header
                stats = SegmentStats(
                    first_offset=h.first_offset, last_offset=reader.footer.last_offset, records=h.record_count,
                    min_timestamp=int(entries["min_timestamp"].min()) if len(entries) else None,
                    max_timestamp=int(entries["max_timestamp"].max()) if len(entries) else None,
                    size_bytes=len(reader.data), crc64=h.checksum,
                    uncompressed_bytes=sum(b.uncompressed_size for b in reader.batches()),
                    batches=len(reader.batches()))
                written = WrittenSegment(ref.topic, ref.partition, ref.seq, ref.path, stats)
                if self.index:
                    written.index_crc32 = self._put_index(written.index_path, encode_index(entries))
                part = self._part(ref.topic, ref.partition)
                part.new.append(written)
                part.uncompressed += stats.uncompressed_bytes
                part.last_offset = max(part.last_offset, stats.last_offset)
                part.next_seq = max(part.next_seq, ref.seq + 1)

    def _parse(self, doc: dict) -> Manifest:
        return Manifest.from_json(json.dumps(doc), f"{self.path}/{MANIFEST}")

    def _check_codec(self, base: Manifest, error: type[Exception]) -> None:
        base_codec = base.compression.get("algorithm")
        if base.topics and base_codec != CODEC_NAMES[self.codec]:
            raise error(
                f"cannot append {CODEC_NAMES[self.codec]} segments to {self.url}, a {base_codec} backup "
                "(the manifest names one codec per backup)")

    def _base_entries(self, version: int, manifest: Manifest) -> dict[tuple[str, int], list[SegmentEntry]]:
        """Segment index of each partition of a base manifest (1.0 manifests: from the headers)."""
        if self._base_cache is None or self._base_cache[0] != version:
            out: dict[tuple[str, int], list[SegmentEntry]] = {}
            for ref in KbsBackup(self.fs, self.path, manifest, self.url).manifest_segments():
                out.setdefault((ref.topic, ref.partition), []).append(SegmentEntry(
                    ref.name, ref.first_offset or 0, ref.last_offset or 0, ref.records or 0,
                    ref.min_timestamp, ref.max_timestamp, ref.size_bytes or 0, ref.crc64 or 0,
                    index_crc32=ref.index_crc32))
            self._base_cache = (version, out)
        return {k: list(v) for k, v in self._base_cache[1].items()}

    def _part(self, topic: str, partition: int) -> _Partition:
        return self._parts.setdefault((topic, partition), _Partition())

    # -- writing ---------------------------------------------------------------------------------
    def last_offset(self, topic: str, partition: int) -> int:
        """Last offset written (or committed before, in append mode) for a partition; -1 if none."""
        part = self._parts.get((topic, partition))
        return -1 if part is None else part.last_offset

    def write_columns(self, topic: str, partition: int, cols: RecordColumns) -> None:
        """Append records to a partition; offsets must strictly increase past what it holds.

        The batches are queued for compression and this returns; it waits only while more than
        ``compress_ahead_bytes`` of input are queued, so the caller's next records are
        prepared while the threads compress. Segments are written as the compressed batches
        come off the queue, in order.
        """
        self._check_open()
        check_topic(topic)
        check_partition(partition)
        n = len(cols)
        if n == 0:
            return
        try:
            self._write_columns(topic, partition, cols)
        except BaseException as e:
            # Batches of this call may be queued, compressed or lost: committing now could
            # publish a partition with a hole in it. Only abort() remains.
            if not isinstance(e, OffsetOrderError):  # refused before anything was queued
                self._failed = e
            raise

    def _write_columns(self, topic: str, partition: int, cols: RecordColumns) -> None:
        n = len(cols)
        key = (topic, partition)
        part = self._parts.setdefault(key, _Partition())
        offsets = cols.offsets
        check_offsets(topic, partition, offsets, part.last_offset)
        per_record = _input_bytes(cols) / n
        start = 0
        while start < n:
            stop = n
            if self.segment_max_records is not None:
                stop = min(n, start + self.segment_max_records - part.queued_records)
            encoders = plan_encode(cols.slice(start, stop), self.batch_max_bytes)
            share = int(per_record * (stop - start) / max(1, len(encoders)))
            for encode in encoders:
                # Within one call too, no more than compress_ahead_bytes of input stay queued
                # (drained before queueing: the last batch queued may still be marked to roll).
                self._drain(self.compress_ahead_bytes)
                self._submit(key, encode, share)
            part.queued_records += stop - start
            if self.segment_max_records is not None and part.queued_records >= self.segment_max_records:
                self._queue[-1].roll = True  # the segment ends with this batch
                part.queued_records = 0
            start = stop
        part.last_offset = int(offsets[-1])
        self._drain(self.compress_ahead_bytes)

    def _submit(self, key: tuple[str, int], encode: Callable[[], EncodedBatch], input_bytes: int) -> None:
        """Queue one batch: compressed on the shared pool (the kernels and codecs free the GIL),
        or right here with one thread or no codec."""
        if self.compress_threads <= 1 or self.codec == Codec.NONE:
            job: cf.Future = cf.Future()
            job.set_result(compress_batch(encode(), self.codec, self.level))
        else:
            job = worker_pool("compute", self.compress_threads).submit(
                lambda: compress_batch(encode(), self.codec, self.level))
        self._queue.append(_Queued(key, job, input_bytes))
        self._queued_bytes += input_bytes

    def _drain(self, ahead: int) -> None:
        """Move compressed batches off the queue into their partitions, in order: those done,
        and, waiting, as many as it takes to leave at most ``ahead`` input bytes queued."""
        q = self._queue
        while q and (self._queued_bytes > ahead or q[0].job.done()):
            item = q.popleft()
            self._queued_bytes -= item.input_bytes
            cb = item.job.result()  # re-raises a failed encode or compress
            part = self._parts[item.key]
            part.pending.append(cb)
            part.pending_bytes += cb.size
            part.pending_records += cb.count
            part.uncompressed += cb.uncompressed_size
            self._pending_total += cb.size
            if item.roll or part.pending_bytes >= self.segment_max_bytes:
                self._flush_partition(*item.key)
        while self._pending_total > self.buffer_max_bytes:
            key = max(self._parts, key=lambda k: self._parts[k].pending_bytes)
            self._flush_partition(*key)

    def _cancel_queue(self) -> None:
        for item in self._queue:
            item.job.cancel()
        self._queue.clear()
        self._queued_bytes = 0

    def flush(self) -> None:
        """Write every pending segment now (e.g. before a checkpoint)."""
        self._check_open()
        try:
            self._drain(0)
            for key in list(self._parts):
                self._flush_partition(*key)
        except BaseException as e:
            self._failed = e
            raise

    def _flush_partition(self, topic: str, partition: int) -> None:
        part = self._parts[(topic, partition)]
        if not part.pending:
            return
        data, stats = segment_parts(part.pending, self.codec)
        seq = part.next_seq
        path = f"{partition_dir(self._root, topic, partition)}/{segment_name(seq)}"
        put_file(self.fs, path, data)
        written = WrittenSegment(topic, partition, seq, path, stats)
        if self.index:
            # Everything the index holds is known from the batches just assembled.
            written.index_crc32 = self._put_index(written.index_path, encode_index(index_entries(part.pending)))
        self._pending_total -= part.pending_bytes
        part.pending, part.pending_bytes, part.pending_records = [], 0, 0
        part.next_seq += 1
        part.new.append(written)
        self._written.append(written)
        if self.on_segment is not None:
            self.on_segment(written)

    def _put_index(self, path: str, data: bytes) -> int:
        put_file(self.fs, path, data)
        return crc32(data)

    @property
    def written_segments(self) -> list[WrittenSegment]:
        return list(self._written)

    # -- committing ------------------------------------------------------------------------------
    def build_manifest(self, extra: dict[str, Any] | None = None,
                       state: BackupState | None = None) -> tuple[Manifest, list[Move]]:
        """The manifest of the backup after this write, on top of ``state`` (default: the
        state this writer started from), and the staged -> final moves it needs.

        Raises
        ------
        CommitConflictError
            When ``state`` (another writer's commit) already holds offsets this writer adds.
        """
        assert self._txn is not None
        state = self._txn.base if state is None else state
        base = None
        if self.mode != "overwrite" and state.manifest is not None:
            base = self._parse(state.manifest)
            self._check_codec(base, CommitConflictError)
        entries = self._base_entries(state.version, base) if base is not None else {}
        moves: list[Move] = []
        uncompressed = int(base.statistics.get("uncompressed_bytes", 0)) if base is not None else 0
        for (topic, p), part in sorted(self._parts.items()):
            uncompressed += part.uncompressed
            moves += self._place_new(topic, p, part.new, entries.setdefault((topic, p), []))
        topics = _partition_entries(entries)
        statistics, time_range = summarize(topics, uncompressed)
        base_extra = {k: v for k, v in base.extra.items() if k != COMMIT_FIELD} if base else {}
        base_topics = {t.name: t for t in base.topics} if base else {}
        manifest = Manifest(
            version=WRITE_VERSION,
            backup_id=self.backup_id,
            created_at=base.created_at if base is not None else self.created_at,
            completed_at=utc_now_iso(),
            source_cluster=self.source_cluster,
            compression={"algorithm": CODEC_NAMES[self.codec], "level": self.level},
            statistics=statistics,
            time_range=time_range,
            topics=[
                TopicEntry(name, parts, extra=base_topics[name].extra if name in base_topics else {})
                for name, parts in sorted(topics.items())
            ],
            extra=_merged_extra(base_extra, extra),
        )
        return manifest, moves

    def _place_new(self, topic: str, p: int, new: list[WrittenSegment], idx: list[SegmentEntry]) -> list[Move]:
        """Number this writer's ``new`` segments of a partition after the ``idx`` entries of the
        base (appended to ``idx``); the moves of their segment and index files."""
        assert self._txn is not None
        if new and idx and new[0].stats.first_offset <= idx[-1].last_offset:
            raise CommitConflictError(
                f"{topic}/{p}: another writer's commit holds offsets up to {idx[-1].last_offset}, "
                f"this append starts at {new[0].stats.first_offset}")
        moves: list[Move] = []
        for w in new:
            seq = len(idx)  # numbered after the base's segments (renumbered on a rebase)
            final = WrittenSegment(topic, p, seq, f"{TOPICS_DIR}/{topic}/{p}/{segment_name(seq)}", w.stats,
                                   w.index_crc32)
            moves.append(Move(self._txn.relative(w.path), final.path, w.stats.size_bytes, w.stats.crc64))
            if w.index_crc32 is not None:
                moves.append(Move(self._txn.relative(w.index_path), final.index_path, w.index_size,
                                  crc32=w.index_crc32))
            idx.append(final.entry())
        return moves

    def commit(self, extra: dict[str, Any] | None = None) -> Manifest:
        """Write pending segments, then commit them (:mod:`fsspec_kbs.store.txn`). Returns the
        manifest published.

        Raises
        ------
        CommitConflictError
            Another writer committed first and this write cannot follow it (create vs create,
            anything vs overwrite, or appends whose offsets overlap); this writer's staged
            files are removed, the other backup is untouched.
        """
        self._check_open()
        if self._txn is None:
            raise KbsError(f"{self.url}: a stage_only writer does not commit")
        self.flush()

        def build(state: BackupState) -> tuple[dict, list[Move]]:
            manifest, moves = self.build_manifest(extra, state)
            return json_of(manifest), moves

        try:
            record, _ = self._txn.commit(build)
        finally:
            self._closed = True
        finals = {m.src: m.dst for m in record.moves}
        self._written = [replace(w, path=f"{self.path}/{finals.get(self._txn.relative(w.path), '')}")
                         for w in self._written]
        return self._parse(record.manifest)

    def abort(self) -> None:
        """Delete what this writer staged; never touches a committed backup's files."""
        if self._closed:
            return
        self._closed = True
        self._cancel_queue()
        if self._txn is not None:
            self._txn.abort()
        else:
            remove_files(self.fs, [p for w in self._written
                                   for p in (w.path, *([w.index_path] if w.index_crc32 is not None else []))])

    def _check_open(self) -> None:
        if self._failed is not None:
            raise KbsError(f"this BackupWriter failed earlier ({type(self._failed).__name__}: {self._failed}); "
                           "what it took may be incomplete, so it cannot commit: abort() it and write again")
        if self._closed:
            raise KbsError("this BackupWriter was already committed or aborted")

    def __enter__(self) -> BackupWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _partition_entries(entries: dict[tuple[str, int], list[SegmentEntry]]) -> dict[str, list[PartitionEntry]]:
    """The manifest's partition entries, by topic, of every partition with segments."""
    topics: dict[str, list[PartitionEntry]] = {}
    for (topic, p), idx in sorted(entries.items()):
        if idx:
            topics.setdefault(topic, []).append(PartitionEntry(
                partition=p, first_offset=idx[0].first_offset, last_offset=idx[-1].last_offset,
                records=sum(s.records for s in idx), segments=len(idx), segment_index=idx))
    return topics


def _merged_extra(base_extra: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    """The base manifest's extra fields, then this commit's ``extra``."""
    return {**base_extra, **(extra or {}),
            # Per streaming query the later micro-batch (a copy appended must not roll one back).
            **({STREAMS_FIELD: merge_streams(base_extra[STREAMS_FIELD], extra[STREAMS_FIELD])}
               if extra and STREAMS_FIELD in extra and STREAMS_FIELD in base_extra else {})}
