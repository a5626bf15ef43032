"""The KBS layout (kbs-format.md): :class:`KbsBackup`, a backup directory of ``segment-N.kbs``
files, their batch indexes and a ``manifest.json``, on any fsspec filesystem."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, NoReturn

import fsspec
import numpy as np

from fsspec_kbs.errors import (
    BatchIndexDamagedError,
    BatchIndexError,
    InvalidNameError,
    KbsError,
    ManifestMismatchError,
    SegmentFormatError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    RecordColumns,
    SegmentFooter,
    SegmentHeader,
    SegmentReader,
)
from fsspec_kbs.format.batch_index import BatchIndex, index_from_segment, verify_index
from fsspec_kbs.format.codecs import CODEC_BY_NAME, CODEC_NAMES
from fsspec_kbs.store.batch_index import IndexedSource, index_lookup, index_path
from fsspec_kbs.store.commit import COMMIT_FIELD, COMMITS_DIR, manifest_commit, record_path
from fsspec_kbs.store.layout import (
    Backup,
    BackupDescription,
    Origin,
    ValidationSink,
    ms_from_iso,
)
from fsspec_kbs.store.listing import topic_tree_entries
from fsspec_kbs.store.manifest import Manifest, SegmentEntry
from fsspec_kbs.store.names import (
    MANIFEST,
    TOPICS_DIR,
    check_partition,
    check_topic,
    parse_segment_name,
    partition_dir,
    segment_name,
)
from fsspec_kbs.store.opened import OpenedSegment, iter_opened
from fsspec_kbs.store.segment_ref import (
    Bounds,
    SegmentRef,
    check_size,
    segment_missing,
)
from fsspec_kbs.store.stream import STREAM_BLOCK_SIZE, STREAM_MIN_BYTES, SegmentStream

#: Record data per decoded chunk in deep validation: with one batch at most 16 MiB, memory
#: stays at about one batch per decoding thread, whatever the batches claim.
DEEP_CHUNK_BYTES = 2 * 1024 * 1024


def _cat_or_error(fs: fsspec.AbstractFileSystem, path: str) -> bytes | Exception:
    try:
        return fs.cat_file(path)
    except Exception as e:  # FileNotFoundError and the like: the index is then not used
        return e


class KbsBackup(Backup[Manifest]):
    """A KBS backup directory: manifest plus segments, on any fsspec filesystem.

    Use :meth:`open`; the constructor takes an already-resolved filesystem and path.
    """

    layout = "kbs"

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: Manifest | None,
                 url: str | None = None, storage_options: dict | None = None,
                 allow_incomplete: bool = False) -> None:
        super().__init__(fs, path, manifest, url, storage_options, allow_incomplete)
        self._indexes: dict[str, BatchIndex | None] = {}
        #: Of each segment read whole: uncompressed batch bytes, min and max timestamp (check_totals).
        self._read_whole: dict[str, tuple[int, int | None, int | None]] = {}
        #: Segment file sizes from the last listing (path -> bytes).
        self._stored_sizes: dict[str, int | None] = {}
        #: Why a segment's batch index was not used (path -> reason), for ``validate``.
        self.index_problems: dict[str, str] = {}

    @classmethod
    def parse_manifest(cls, raw: bytes, path: str) -> Manifest:
        return Manifest.from_json(raw, path)

    # -- planning --------------------------------------------------------------------------------
    def _list_segments(self) -> list[SegmentRef]:
        """From the manifest only when it can (checked against one listing); else the listing."""
        return self._discover() if self.manifest is None else self._from_manifest()

    def _from_manifest(self) -> list[SegmentRef]:
        """The manifest's segments, after checking it names exactly the segment files stored
        (one listing): a file it does not list, or one it lists that is not there, is an error
        before anything is read. A 1.0 manifest's segments are then probed (header and
        footer) and their sums compared with its partitions' numbers."""
        assert self.manifest is not None
        listed = [(t.name, p.partition, seq) for t in self.manifest.topics for p in t.partitions
                  for seq in range(p.segments)]
        stored = self._stored_segments()
        for topic, partition, seq in listed:
            if (topic, partition, seq) not in stored:
                raise segment_missing(SegmentRef(topic, partition, seq, self._segment_path(topic, partition, seq)))
        extra = sorted(set(stored) - set(listed))
        if extra and not self._appended_by_pending_commit(extra):
            topic, partition, seq = extra[0]
            raise ManifestMismatchError(
                f"{self._segment_path(topic, partition, seq)} is stored but the manifest does not list it "
                f"({len(extra)} such file(s)): the manifest does not describe what the backup holds "
                "(an edited or stale manifest)", f"{self.path}/{MANIFEST}")
        return self.manifest_segments(sizes=stored)

    def _appended_by_pending_commit(self, extra: list[tuple[str, int, int]]) -> bool:
        """Files past the manifest's segments, while a newer commit is claimed: an append
        being applied (its files land before its manifest), which leaves this manifest's
        backup whole and readable."""
        assert self.manifest is not None
        counts = {(t.name, p.partition): p.segments for t in self.manifest.topics for p in t.partitions}
        if any(seq < counts.get((topic, partition), 0) for topic, partition, seq in extra):
            return False
        n = manifest_commit(self.manifest)
        self.fs.invalidate_cache(f"{self.path}/{COMMITS_DIR}")
        return n >= 0 and bool(self.fs.exists(record_path(self.path, n + 1)))

    def manifest_segments(self, sizes: dict[tuple[str, int, int], int | None] | None = None) -> list[SegmentRef]:
        """The segments the manifest names, as it describes them (1.0: probed from their
        headers and footers), without comparing them with a listing of the store. ``sizes``:
        file sizes already listed, for the probes."""
        assert self.manifest is not None
        listed = [(t.name, p.partition, seq) for t in self.manifest.topics for p in t.partitions
                  for seq in range(p.segments)]
        stored = sizes or {}
        if self.manifest.has_index:
            return self._from_index()
        refs = self._probe([SegmentRef(t, p, seq, self._segment_path(t, p, seq), size_bytes=stored.get((t, p, seq)))
                            for t, p, seq in listed])
        self._checked.update(r.path for r in refs)
        stored_bytes = sum(r.size_bytes or 0 for r in refs)
        if sizes is not None and self.manifest.statistics["compressed_bytes"] != stored_bytes:
            raise ManifestMismatchError(f"statistics.compressed_bytes is {self.manifest.statistics['compressed_bytes']} "
                                        f"but the segment files hold {stored_bytes} bytes", f"{self.path}/{MANIFEST}")
        by_part: dict[tuple[str, int], list[SegmentRef]] = {}
        for r in refs:
            by_part.setdefault((r.topic, r.partition), []).append(r)
        for t in self.manifest.topics:
            for p in t.partitions:
                segs = by_part.get((t.name, p.partition), [])
                if not segs:
                    continue
                for what, claim, found in (("records", p.records, sum(r.records or 0 for r in segs)),
                                           ("first offset", p.first_offset, segs[0].first_offset),
                                           ("last offset", p.last_offset, segs[-1].last_offset)):
                    if claim != found:
                        raise ManifestMismatchError(
                            f"{t.name}/{p.partition}: {what} is {claim} in the manifest but its segment "
                            f"files say {found}", f"{self.path}/{MANIFEST}")
        return refs

    def _stored_segments(self) -> dict[tuple[str, int, int], int | None]:
        """``(topic, partition, seq) -> size`` of every ``segment-N.kbs`` file under ``topics/``."""
        out: dict[tuple[str, int, int], int | None] = {}
        for rel, _, info in topic_tree_entries(self.fs, f"{self.path}/{TOPICS_DIR}"):
            if not rel[2].endswith(".kbs"):
                continue
            try:
                key = (check_topic(rel[0]), check_partition(rel[1]), parse_segment_name(rel[2]))
            except InvalidNameError:
                continue  # foreign files (e.g. temp files) are not segments
            out[key] = info.get("size")
            self._stored_sizes[self._segment_path(*key)] = info.get("size")
        return out

    def check_unread(self, refs: Iterable[SegmentRef]) -> None:
        """Read the header and footer of segments a scan prunes on the manifest's offsets and
        compare them with it: a pruned segment whose file holds other offsets is an error,
        never rows silently left out. Two small ranged reads per segment, all in one
        ``cat_ranges`` call. What does not change the answer (a CRC-64) is left to reads of
        the segment and to ``validate``."""
        todo = [r for r in refs if r.path not in self._checked]
        for ref, probed in zip(todo, self._probe(todo), strict=True):
            for name in ("first_offset", "last_offset"):
                claim, found = getattr(ref, name), getattr(probed, name)
                if claim is not None and claim != found:
                    raise SegmentMismatchError(
                        f"{name.replace('_', ' ')} {found} in the file but {claim} in the manifest",
                        ref.path, 8 if name == "first_offset" else None)
            self._checked.add(ref.path)

    def _segment_path(self, topic: str, partition: int, seq: int) -> str:
        return f"{partition_dir(self.path, topic, partition)}/{segment_name(seq)}"

    def _from_index(self) -> list[SegmentRef]:
        assert self.manifest is not None
        codec = self.manifest.compression.get("algorithm")
        return [
            SegmentRef(
                topic=t.name, partition=p.partition, seq=seq,
                path=self._segment_path(t.name, p.partition, seq),
                first_offset=s.first_offset, last_offset=s.last_offset, records=s.records,
                min_timestamp=s.min_timestamp, max_timestamp=s.max_timestamp,
                size_bytes=s.size_bytes, crc64=s.crc64, codec=codec, index_crc32=s.index_crc32,
            )
            for t in self.manifest.topics
            for p in t.partitions
            for seq, s in enumerate(p.segment_index or [])
        ]

    def _discover(self) -> list[SegmentRef]:
        """List ``topics/<topic>/<partition>/segment-*.kbs`` of a backup without manifest."""
        return self._probe([SegmentRef(t, p, seq, self._segment_path(t, p, seq), size_bytes=size)
                            for (t, p, seq), size in sorted(self._stored_segments().items())])

    def _probe(self, refs: list[SegmentRef]) -> list[SegmentRef]:
        """Fill offsets and counts from each segment's header and footer (two small reads each)."""
        if not refs:
            return []
        paths = [r.path for r in refs]
        sizes = [self._stored_sizes.get(r.path, r.size_bytes) for r in refs]
        heads = self.fs.cat_ranges(paths, [0] * len(paths), [HEADER_SIZE] * len(paths), on_error="return")
        # Footers from the listed size where known: a negative start (a suffix range) is not
        # understood by every store (adlfs against Azurite returns the whole blob).
        feet = self.fs.cat_ranges(paths, [-FOOTER_SIZE if n is None else max(0, n - FOOTER_SIZE) for n in sizes],
                                  sizes, on_error="return")
        out = []
        for ref, head, foot in zip(refs, heads, feet, strict=False):
            for blob in (head, foot):
                if isinstance(blob, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                    raise segment_missing(ref, blob) from blob
                if isinstance(blob, Exception):
                    raise blob
            h = SegmentHeader.parse(head, ref.path)
            if len(foot) < FOOTER_SIZE:
                raise TruncatedSegmentError("file too short for a footer", ref.path, 0)
            f = SegmentFooter.parse(b"\0" * HEADER_SIZE + foot, ref.path)
            if h.record_count and f.last_offset - h.first_offset + 1 < h.record_count:
                raise SegmentMismatchError(
                    f"footer last offset {f.last_offset} cannot end {h.record_count} records from first offset "
                    f"{h.first_offset}", ref.path, None if ref.size_bytes is None else ref.size_bytes - FOOTER_SIZE)
            out.append(replace(ref, first_offset=h.first_offset, last_offset=f.last_offset,
                               records=h.record_count, crc64=h.checksum,
                               codec=CODEC_NAMES[h.codec]))
        return out

    # -- batch indexes (kbs-format.md §7) ------------------------------------------------------
    def batch_index(self, ref: SegmentRef) -> BatchIndex | None:
        """The segment's batch index, checked (its CRCs against the manifest's ``index_crc32``,
        its bounds against the manifest's entry), or None when there is none to use: no
        ``index_crc32``, no file, or a damaged one (why: :attr:`index_problems`)."""
        if ref.path not in self._indexes:
            self._prefetch_indexes([ref])
        return self._indexes[ref.path]

    def _prefetch_indexes(self, refs: Iterable[SegmentRef]) -> None:
        """Read the indexes of ``refs`` not read yet, concurrently where the store can."""
        todo = [r for r in refs if r.path not in self._indexes]
        for r in todo:
            if r.index_crc32 is None or r.size_bytes is None:
                self._indexes[r.path] = None
        todo = [r for r in todo if r.path not in self._indexes]
        if not todo:
            return
        paths = [index_path(r.path) for r in todo]
        blobs = self.fs.cat(paths, on_error="return") if len(paths) > 1 else {
            paths[0]: _cat_or_error(self.fs, paths[0])}
        for ref, ipath in zip(todo, paths, strict=True):
            blob = blobs.get(ipath, blobs.get(self.fs._strip_protocol(ipath)))
            lookup = index_lookup(blob, ipath, ref.path, ref.size_bytes, ref.index_crc32)  # type: ignore[arg-type]
            if lookup.index is not None:
                self._check_index_against_manifest(ref, lookup.index)
            else:
                self.index_problems[ref.path] = lookup.reason or "unusable"
            self._indexes[ref.path] = lookup.index

    @staticmethod
    def _check_index_against_manifest(ref: SegmentRef, index: BatchIndex) -> None:
        if not len(index):
            raise BatchIndexError("the batch index has no entry but the manifest lists records",
                                  index.index_path, 12, ref.path, index.index_path)
        for what, claim, found in (("first offset", ref.first_offset, int(index.base[0])),
                                   ("last offset", ref.last_offset, int(index.last[-1])),
                                   ("min timestamp", ref.min_timestamp, int(index.min_ts.min())),
                                   ("max timestamp", ref.max_timestamp, int(index.max_ts.max()))):
            if claim is not None and claim != found:
                raise BatchIndexError(f"the manifest says {what} {claim} but the batch index says {found}",
                                      index.index_path, None, ref.path, index.index_path)

    def check_time_bounds(self, refs: list[SegmentRef]) -> list[SegmentRef]:
        """``refs`` with ``time_checked`` set where the batch index confirms the manifest's time
        range (then a time filter may prune the segment)."""
        self._prefetch_indexes(refs)
        return [replace(r, time_checked=True) if self._indexes.get(r.path) is not None else r for r in refs]

    # -- reading ---------------------------------------------------------------------------------
    def open_segment(self, ref: SegmentRef, verify_checksums: bool = True,
                     batch_crc: bool = False) -> SegmentReader:
        """Read and check a segment; ``batch_crc`` also checks every batch CRC-32 (deep validation)."""
        reader = SegmentReader(self.read_segment(ref), ref.path, verify_checksums, batch_crc=batch_crc)
        self._check_crc64(ref, reader.header.checksum)
        return reader

    def read_whole_checked(self, ref: SegmentRef) -> tuple[SegmentReader, np.ndarray, SegmentEntry]:
        """Read ``ref`` whole with every check a full read makes (CRC-64 against the manifest,
        every batch CRC-32, every record decoded) and compare what it holds with the manifest's
        entry; returns the reader, its batch index entries (kbs-format.md §7) and the entry the
        segment itself gives (without ``index_crc32``). For jobs that rewrite a backup from its
        segments (``kbs index``, retain): a segment the manifest does not describe is an error,
        never copied into a clean-looking backup."""
        reader = self.open_segment(ref, batch_crc=True)
        entries = index_from_segment(reader)  # decodes every batch
        mn = int(entries["min_timestamp"].min()) if len(entries) else None
        mx = int(entries["max_timestamp"].max()) if len(entries) else None
        h, f = reader.header, reader.footer
        for what, claim, found in (("first offset", ref.first_offset, h.first_offset),
                                   ("last offset", ref.last_offset, f.last_offset),
                                   ("records", ref.records, h.record_count), ("min timestamp", ref.min_timestamp, mn),
                                   ("max timestamp", ref.max_timestamp, mx)):
            if claim is not None and claim != found:
                raise ManifestMismatchError(f"the manifest says {what} {claim} for {ref.name} but the segment "
                                            f"holds {found} (run kbs validate)", ref.path)
        entry = SegmentEntry(ref.name, h.first_offset, f.last_offset, h.record_count, mn, mx, len(reader.data),
                             h.checksum)
        return reader, entries, entry

    #: Segments at least this large are streamed (:class:`~fsspec_kbs.store.stream.SegmentStream`)
    #: instead of read whole; set on an instance (or the class) to change it.
    stream_min_bytes: int = STREAM_MIN_BYTES

    def open_chunks(self, ref: SegmentRef, verify_checksums: bool = True,
                    bounds: Bounds | None = None) -> OpenedSegment:
        """Open a segment for decoding chunk by chunk (see :meth:`iter_columns`).

        With ``bounds`` (start and end offset, start and end time; end exclusive; None:
        unbounded) and a usable batch index, only the batches that may hold records in the
        bounds are read, when they are at most :attr:`indexed_max_fraction` of the segment.
        Otherwise segments of at least :attr:`stream_min_bytes` are streamed (only the chunks
        being decoded are in memory; their frames are read as the decode tasks are taken);
        smaller ones are read whole. Close the result (or let :func:`iter_opened` do it).

        Decoding it (:meth:`iter_columns`), every batch CRC-32 is checked by the decoding
        thread just before its batch is decoded, which also computes the batch's share of the
        segment CRC-64; the CRC-64 is compared at the end, after the batches before it were
        yielded (``SegmentReader(crc64_last=True)``: each byte is read from memory once).
        """
        if bounds is not None and any(b is not None for b in bounds) and verify_checksums:
            opened = self._open_indexed(ref, bounds)
            if opened is not None:
                return opened
        size = ref.size_bytes if ref.size_bytes is not None else self._segment_size(ref)
        if size < self.stream_min_bytes:
            reader = SegmentReader(self.read_segment(ref), ref.path, verify_checksums, crc64_last=True)
            self._check_crc64(ref, reader.header.checksum)
            return OpenedSegment(ref, reader, on_finish=self._finished)
        try:
            f = self.fs.open(ref.path, "rb", block_size=STREAM_BLOCK_SIZE, cache_type="readahead")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        try:
            # Buffered fsspec files know their size from opening them: no second request.
            actual = getattr(f, "size", None)
            size = int(actual) if actual is not None else self._segment_size(ref)
            check_size(ref, size)
            stream = SegmentStream(f, size, ref.path, verify_checksums)
            self._check_crc64(ref, stream.header.checksum)
        except BaseException:
            f.close()
            raise
        return OpenedSegment(ref, stream, f, on_finish=self._finished)

    def _finished(self, opened: OpenedSegment) -> None:
        self._read_whole[opened.ref.path] = (opened.uncompressed_bytes, opened.min_ts, opened.max_ts)

    def check_totals(self) -> None:
        """Once every segment was read whole: the manifest's ``statistics.uncompressed_bytes``
        and ``time_range`` equal what the batches hold (§3)."""
        if self.manifest is None or set(self._read_whole) != {r.path for r in self.segments()}:
            return
        seen = self._read_whole.values()
        mins = [lo for _, lo, _ in seen if lo is not None]
        maxs = [hi for _, _, hi in seen if hi is not None]
        for what, claim, found in (
                ("statistics.uncompressed_bytes", self.manifest.statistics.get("uncompressed_bytes"),
                 sum(n for n, _, _ in seen)),
                ("time_range.earliest_timestamp", self.manifest.time_range.get("earliest_timestamp"),
                 min(mins) if mins else None),
                ("time_range.latest_timestamp", self.manifest.time_range.get("latest_timestamp"),
                 max(maxs) if maxs else None)):
            if claim != found:
                raise ManifestMismatchError(f"{what} is {claim} but the segments hold {found}",
                                            f"{self.path}/{MANIFEST}")

    #: Read through the batch index only when the selected batches are at most this share of
    #: the segment: they are fetched at once, and a near-whole read is cheaper streamed.
    indexed_max_fraction: float = 0.5

    def _open_indexed(self, ref: SegmentRef, bounds: Bounds) -> OpenedSegment | None:
        index = self.batch_index(ref)
        if index is None:
            return None
        runs = index.select(*bounds)
        if index.stored_bytes(runs) > self.indexed_max_fraction * index.segment_size:
            return None
        codec = CODEC_BY_NAME[ref.codec] if ref.codec is not None else None
        return OpenedSegment(ref, IndexedSource(self.fs, ref.path, index, runs, codec=codec, crc64=ref.crc64),
                             partial=True)

    def rediagnose(self, ref: SegmentRef, verify_checksums: bool, err: SegmentFormatError) -> NoReturn:
        """Raise the error of reading ``ref`` whole, CRC-64 first (which names the most
        specific defect); ``err`` if that finds none (e.g. a stored CRC-32 is wrong)."""
        reader = self.open_segment(ref, verify_checksums, batch_crc=True)
        for _ in iter_opened(OpenedSegment(ref, reader), 32 * 1024 * 1024, threads=1):
            pass
        raise err from None

    def _check_crc64(self, ref: SegmentRef, header_crc: int) -> None:
        if ref.crc64 is not None and header_crc != ref.crc64:
            raise SegmentMismatchError(
                f"header CRC-64 {header_crc} differs from the manifest's {ref.crc64} "
                "(the segment was replaced after the manifest was written)", ref.path, 24)

    def describe(self) -> BackupDescription:
        """What ``kbs describe`` shows."""
        m = self.manifest
        segs = self.segments()
        if m is None:
            return BackupDescription(self.url, self.backup_id, self.layout, False, segs)
        return BackupDescription(self.url, self.backup_id, self.layout, True, segs, version=m.version,
                                 created_at=m.created_at, completed_at=m.completed_at, compression=m.compression,
                                 source_cluster=m.source_cluster, statistics=m.statistics, time_range=m.time_range)

    # -- validating (``kbs validate``) ---------------------------------------------------------
    def validate_segment(self, ref: SegmentRef, deep: bool, report: ValidationSink,
                         check_columns: Callable[[RecordColumns], None] | None = None) -> None:
        """Quick: size, header and footer against the manifest, and a batch index it names
        (a damaged one goes to ``report``: reads fall back to the whole segment). Deep: also
        every CRC-64 and CRC-32 and every record (each chunk passed to ``check_columns``),
        and the batch index against the batches."""
        self._quick_segment(ref)
        if ref.index_crc32 is not None and self.batch_index(ref) is None:
            report.add(ref.path, BatchIndexDamagedError(
                f"batch index not usable ({self.index_problems.get(ref.path)}); reads fall back to the "
                "whole segment (`kbs index` rewrites it)", index_path(ref.path), None, ref.path, index_path(ref.path)))
        if not deep:
            return
        # A matching CRC-64 covers every batch byte, but a writer may still have stored a wrong
        # CRC-32 under a right CRC-64: deep validation checks each batch's own checksum too.
        # Streamed or whole, every batch CRC-32 is checked as its batch is decoded.
        for cols in self.iter_columns(ref, max_chunk_bytes=DEEP_CHUNK_BYTES):
            if check_columns is not None:
                check_columns(cols)
            report.records_checked += len(cols)
        index = self.batch_index(ref)
        if index is not None:
            verify_index(index, self.open_segment(ref))

    def _quick_segment(self, ref: SegmentRef) -> None:
        size = self.fs.size(ref.path)
        check_size(ref, size)
        head = self.fs.cat_file(ref.path, start=0, end=HEADER_SIZE)
        h = SegmentHeader.parse(head, ref.path)
        foot = self.fs.cat_file(ref.path, start=max(0, size - FOOTER_SIZE), end=size)
        f = SegmentFooter.parse(b"\0" * HEADER_SIZE + foot if size >= HEADER_SIZE + FOOTER_SIZE else head[:size],
                                ref.path)
        for what, mine, theirs, at in (("record count", h.record_count, ref.records, 16),
                                       ("first offset", h.first_offset, ref.first_offset, 8),
                                       ("CRC-64", h.checksum, ref.crc64, 24),
                                       ("last offset", f.last_offset, ref.last_offset, size - FOOTER_SIZE)):
            if theirs is not None and mine != theirs:
                raise SegmentMismatchError(f"{what} {mine} in the file but {theirs} in the manifest", ref.path, at)
        if ref.codec is not None and CODEC_NAMES[h.codec] != ref.codec:
            raise SegmentMismatchError(f"segment codec {h.codec.name.lower()} but the manifest says {ref.codec}",
                                       ref.path, 5)

    def manifest_defects(self, refs: list[SegmentRef]) -> list[KbsError]:
        """``statistics.records`` against the segments' records, each partition's records
        against its ``segment_index``."""
        m = self.manifest
        if m is None:
            return []
        out: list[KbsError] = []
        total = sum(r.records or 0 for r in refs)
        if m.statistics.get("records") != total:
            out.append(SegmentMismatchError(
                f"manifest statistics say {m.statistics.get('records')} records but its segments hold {total}",
                self.url))
        for t in m.topics:
            for p in t.partitions:
                if p.segment_index is not None and p.records != sum(s.records for s in p.segment_index):
                    out.append(SegmentMismatchError(
                        f"{t.name}/{p.partition}: partition records {p.records} differ from its segment_index",
                        self.url))
        return out

    # -- provenance ------------------------------------------------------------------------------
    @property
    def manifest_extra(self) -> dict[str, Any]:
        return self.manifest.extra if self.manifest is not None else {}

    def origin(self) -> Origin:
        m = self.manifest
        if m is None:
            return Origin()
        sc = m.source_cluster if isinstance(m.source_cluster, dict) else {}
        brokers = sc.get("bootstrap_servers") or []
        if isinstance(brokers, str):
            brokers = [b for b in brokers.split(",") if b]
        return Origin(created_at=m.created_at, created_at_ms=ms_from_iso(m.created_at),
                      source_cluster=m.source_cluster, cluster_id=sc.get("cluster_id"), brokers=brokers)

    def copy_fields(self) -> dict[str, Any]:
        """The manifest's own extra fields (kbs-format.md §3: tools that rewrite a manifest
        keep fields they do not know, e.g. streaming sinks' batch records), but its commit's."""
        return {k: v for k, v in self.manifest_extra.items() if k != COMMIT_FIELD}
