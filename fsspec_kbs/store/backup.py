"""Open a KBS backup directory on any fsspec filesystem and read its segments."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import fsspec
import numpy as np
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from fsspec_kbs.errors import (
    BackupNotFoundError,
    BatchIndexError,
    IncompleteBackupError,
    InvalidNameError,
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
    ViewColumns,
)
from fsspec_kbs.format.batch_index import BatchIndex, index_from_segment
from fsspec_kbs.format.codecs import CODEC_BY_NAME, CODEC_NAMES
from fsspec_kbs.store.batch_index import IndexedSource, index_lookup, index_path
from fsspec_kbs.store.commit import COMMITS_DIR, manifest_commit, record_path
from fsspec_kbs.store.listing import topic_tree_entries
from fsspec_kbs.store.manifest import Manifest, SegmentEntry
from fsspec_kbs.store.names import (
    MANIFEST,
    TOPICS_DIR,
    check_backup_id,
    check_partition,
    check_topic,
    parse_segment_name,
    partition_dir,
    segment_name,
)
from fsspec_kbs.store.opened import OpenedSegment, iter_opened
from fsspec_kbs.store.pooled import read_pooled
from fsspec_kbs.store.stream import STREAM_BLOCK_SIZE, STREAM_MIN_BYTES, SegmentStream


@dataclass(frozen=True)
class SegmentRef:
    """One segment of a backup, with what is known about it before opening it.

    Fields that are unknown (a 1.0 manifest has no timestamps) are None. ``path`` is a path
    on the backup's filesystem, never a filesystem object, so refs pickle cheaply.
    """

    topic: str
    partition: int
    seq: int
    path: str
    first_offset: int | None = None
    last_offset: int | None = None
    records: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    size_bytes: int | None = None
    crc64: int | None = None
    codec: str | None = None
    layout: str = "kbs"
    #: ``min_timestamp``/``max_timestamp`` were checked against data (a batch index) and may
    #: prune: a manifest's claim alone never drops a segment from a time-filtered read.
    time_checked: bool = False
    #: The manifest's CRC-32 of the segment's batch index (1.2); None: no index to use.
    index_crc32: int | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def may_contain(
        self,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> bool:
        """False only if the segment certainly holds no record in the bounds (end exclusive)."""
        if start_offset is not None and self.last_offset is not None and self.last_offset < start_offset:
            return False
        if end_offset is not None and self.first_offset is not None and self.first_offset >= end_offset:
            return False
        if not self.time_checked:
            return True
        if start_time is not None and self.max_timestamp is not None and self.max_timestamp < start_time:
            return False
        return not (end_time is not None and self.min_timestamp is not None and self.min_timestamp >= end_time)


#: Start and end offset, start and end time of a read (end exclusive; None: unbounded).
Bounds = tuple[int | None, int | None, int | None, int | None]


def _cat_or_error(fs: fsspec.AbstractFileSystem, path: str) -> bytes | Exception:
    try:
        return fs.cat_file(path)
    except Exception as e:  # FileNotFoundError and the like: the index is then not used
        return e


def segment_missing(ref: SegmentRef, error: OSError | None = None) -> BackupNotFoundError:
    """The error for a segment the manifest lists but the store does not have as a file."""
    if isinstance(error, IsADirectoryError):
        return BackupNotFoundError(f"segment {ref.path} listed in the manifest is a directory, not a file")
    return BackupNotFoundError(f"segment {ref.path} listed in the manifest is missing")


def check_size(ref: SegmentRef, size: int) -> None:
    """Compare a segment file's size with what the manifest says of it."""
    if ref.size_bytes is None or size == ref.size_bytes:
        return
    if size < ref.size_bytes:
        raise TruncatedSegmentError(
            f"file is {size} bytes but the manifest says {ref.size_bytes}: the last "
            f"{ref.size_bytes - size} bytes are missing (truncated segment)", ref.path, size)
    raise SegmentMismatchError(
        f"file is {size} bytes but the manifest says {ref.size_bytes}", ref.path, ref.size_bytes)


def check_order(refs: list[SegmentRef]) -> list[SegmentRef]:
    """``refs`` (sorted), after checking that each partition's segments hold increasing,
    non-overlapping offset ranges in sequence order (§1), where their ranges are known."""
    for prev, ref in zip(refs, refs[1:], strict=False):
        if ((prev.topic, prev.partition) == (ref.topic, ref.partition) and prev.last_offset is not None
                and ref.first_offset is not None and ref.first_offset <= prev.last_offset):
            raise SegmentMismatchError(
                f"first offset {ref.first_offset} is not above the previous segment's last offset "
                f"{prev.last_offset} ({prev.name}): segments overlap or are out of order", ref.path, 8)
    return refs


def _strip(path: str) -> str:
    return path.rstrip("/")


def resolve(url: str, storage_options: dict | None = None,
            fs: fsspec.AbstractFileSystem | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of ``url`` (``url`` is already a path when ``fs`` is given)."""
    if fs is None:
        fs, url = url_to_fs(url, **(storage_options or {}))
    return fs, _strip(url)


def read_manifest_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes | None:
    """``manifest.json`` of the backup at ``path``, or None when there is none."""
    try:
        return fs.cat_file(f"{path}/{MANIFEST}")
    except FileNotFoundError:
        return None



@dataclass(frozen=True)
class BackupDescription:
    """What ``kbs describe`` shows of a backup, the same for every layout.

    ``compression`` is the manifest's object (``{"algorithm": ..., "level": ...}``),
    ``source_cluster`` the cluster it was taken from, ``statistics`` and ``time_range`` the
    manifest's claims (None where the layout records none), ``gaps`` what the OSO tool noted.
    """

    url: str
    backup_id: str
    layout: str
    complete: bool
    segments: list[SegmentRef]
    version: str | None = None
    created_at: str | None = None
    completed_at: str | None = None
    compression: dict[str, Any] | None = None
    source_cluster: dict[str, Any] | None = None
    statistics: dict[str, Any] | None = None
    time_range: dict[str, Any] | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The description without its segments, as JSON-ready values (``kbs describe --json``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "segments"}

class KbsBackup:
    """A KBS backup directory: manifest plus segments, on any fsspec filesystem.

    Use :meth:`open`; the constructor takes an already-resolved filesystem and path.
    """

    layout = "kbs"
    #: Backup ids of this layout follow kbs-format.md §1.
    check_id = True

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: Manifest | None,
                 url: str | None = None, storage_options: dict | None = None,
                 allow_incomplete: bool = False) -> None:
        self.fs = fs
        self.path = _strip(path)
        self.manifest = manifest
        self.url = url or path
        self.storage_options = dict(storage_options or {})
        self.allow_incomplete = allow_incomplete
        self._segments: list[SegmentRef] | None = None
        #: Segments whose header and footer offsets agree with the manifest.
        self._checked: set[str] = set()
        self._indexes: dict[str, BatchIndex | None] = {}
        #: Of each segment read whole: uncompressed batch bytes, min and max timestamp (check_totals).
        self._read_whole: dict[str, tuple[int, int | None, int | None]] = {}
        #: Segment file sizes from the last listing (path -> bytes).
        self._stored_sizes: dict[str, int | None] = {}
        #: Why a segment's batch index was not used (path -> reason), for ``validate``.
        self.index_problems: dict[str, str] = {}

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, allow_incomplete: bool = False,
             fs: fsspec.AbstractFileSystem | None = None) -> KbsBackup:
        """Open the backup at ``url`` (``<root>/<backup-id>``).

        Parameters
        ----------
        url : str
            Any fsspec URL or local path of the backup directory.
        storage_options : dict, optional
            Passed to the fsspec filesystem (e.g. ``{"endpoint_url": ...}`` for s3).
        allow_incomplete : bool, default False
            Read a backup without ``manifest.json`` (an interrupted backup) by listing its
            segments. Without it such a backup raises :class:`IncompleteBackupError`.

        Raises
        ------
        BackupNotFoundError, IncompleteBackupError, ManifestError, UnsupportedVersionError
        """
        fs, path = resolve(url, storage_options, fs)
        return cls.from_storage(fs, path, read_manifest_bytes(fs, path), url, storage_options, allow_incomplete)

    @classmethod
    def from_storage(cls, fs: fsspec.AbstractFileSystem, path: str, raw: bytes | None, url: str,
                     storage_options: dict | None = None, allow_incomplete: bool = False) -> KbsBackup:
        """Build from manifest bytes already read (None: no manifest there)."""
        from fsspec_kbs.store.commit import check_commit_state

        if cls.check_id:
            check_backup_id(path.rsplit("/", 1)[-1])
        if raw is None:
            if not fs.exists(path):
                raise BackupNotFoundError(f"no backup at {url}")
            # No manifest but a claimed commit: an overwrite being applied, not an incomplete backup.
            check_commit_state(fs, path, None, url)
            if not allow_incomplete:
                raise IncompleteBackupError(
                    f"{url} has no {MANIFEST}: the backup is incomplete (interrupted or still running). "
                    "Pass allow_incomplete=True (CLI: --allow-incomplete) to read what it holds."
                )
            return cls(fs, path, None, url, storage_options, allow_incomplete)
        manifest = cls.parse_manifest(raw, f"{path}/{MANIFEST}")
        check_commit_state(fs, path, manifest, url)  # a newer commit claimed: never read a mix
        return cls(fs, path, manifest, url, storage_options, allow_incomplete)

    @classmethod
    def parse_manifest(cls, raw: bytes, path: str) -> Any:
        return Manifest.from_json(raw, path)

    @property
    def backup_id(self) -> str:
        return self.manifest.backup_id if self.manifest else self.path.rsplit("/", 1)[-1]

    @property
    def complete(self) -> bool:
        return self.manifest is not None

    # -- planning --------------------------------------------------------------------------------
    def segments(self) -> list[SegmentRef]:
        """Every segment in (topic, partition, sequence) order, from the manifest only when it can."""
        if self._segments is None:
            refs = self._discover() if self.manifest is None else self._from_manifest()
            self._segments = check_order(sorted(refs, key=lambda r: (r.topic, r.partition, r.seq)))
        return list(self._segments)

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

    def select(
        self,
        topics: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> list[SegmentRef]:
        """Segments that may hold records matching the filters (pruned on metadata only)."""
        tset = None if topics is None else set(topics)
        pset = None if partitions is None else set(partitions)
        return [
            r for r in self.segments()
            if (tset is None or r.topic in tset)
            and (pset is None or r.partition in pset)
            and r.may_contain(start_offset, end_offset, start_time, end_time)
        ]

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.segments():
            parts = out.setdefault(r.topic, [])
            if r.partition not in parts:
                parts.append(r.partition)
        return out

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
    def read_segment_bytes(self, ref: SegmentRef) -> bytes:
        try:
            data = self.fs.cat_file(ref.path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        check_size(ref, len(data))
        return data

    def read_segment(self, ref: SegmentRef) -> bytes | memoryview:
        """A whole segment file, for decoding: :meth:`read_segment_bytes`, except that local
        files are read straight into Arrow pool memory (see :mod:`~fsspec_kbs.store.pooled`;
        other filesystems' bytes come from their network layer anyway)."""
        if not isinstance(self.fs, LocalFileSystem):
            return self.read_segment_bytes(ref)
        try:
            with self.fs.open(ref.path, "rb") as f:
                data = read_pooled(f, f.size + 1)  # one byte more: a file grown past its size shows
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        check_size(ref, len(data))
        return data

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

    def iter_columns(self, ref: SegmentRef, verify_checksums: bool = True,
                     max_chunk_bytes: int = 32 * 1024 * 1024,
                     views: bool = False, threads: int | None = None,
                     bounds: Bounds | None = None) -> Iterator[RecordColumns | ViewColumns]:
        """Decode one segment in chunks, cross-checked against what the manifest says of it.

        With ``views`` the chunks are :class:`~fsspec_kbs.format.ViewColumns`: Arrow views into
        the decompressed batches, no copy of the record data.

        Every batch CRC-32 is checked by the decoding thread just before its batch is decoded,
        which also computes the batch's share of the segment CRC-64; the CRC-64 is compared
        at the end, after the batches before it were yielded (``SegmentReader(crc64_last=True)``:
        each byte is read from memory once). ``threads`` decode chunks at once (default:
        :data:`~fsspec_kbs.format.segment.DECODE_THREADS`). Segments of at least
        :attr:`stream_min_bytes` are also streamed (:meth:`open_chunks`). Any format error is re-diagnosed
        (:meth:`rediagnose`), so it does not depend on the order of the checks.
        """
        try:
            yield from iter_opened(self.open_chunks(ref, verify_checksums, bounds), max_chunk_bytes, views, threads)
        except SegmentFormatError as err:
            self.rediagnose(ref, verify_checksums, err)

    def rediagnose(self, ref: SegmentRef, verify_checksums: bool, err: SegmentFormatError) -> NoReturn:
        """Raise the error of reading ``ref`` whole, CRC-64 first (which names the most
        specific defect); ``err`` if that finds none (e.g. a stored CRC-32 is wrong)."""
        reader = self.open_segment(ref, verify_checksums, batch_crc=True)
        for _ in iter_opened(OpenedSegment(ref, reader), 32 * 1024 * 1024, threads=1):
            pass
        raise err from None

    def _segment_size(self, ref: SegmentRef) -> int:
        try:
            return int(self.fs.size(ref.path))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e

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
