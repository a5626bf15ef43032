"""Open a KBS backup directory on any fsspec filesystem and read its segments."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from fsspec_kbs.errors import (
    BackupNotFoundError,
    IncompleteBackupError,
    InvalidNameError,
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
from fsspec_kbs.store.manifest import Manifest
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
        if start_time is not None and self.max_timestamp is not None and self.max_timestamp < start_time:
            return False
        return not (end_time is not None and self.min_timestamp is not None and self.min_timestamp >= end_time)


def segment_missing(ref: SegmentRef) -> BackupNotFoundError:
    """The error for a segment the manifest lists but the store does not have."""
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


class KbsBackup:
    """A KBS backup directory: manifest plus segments, on any fsspec filesystem.

    Use :meth:`open`; the constructor takes an already-resolved filesystem and path.
    """

    layout = "kbs"
    #: Backup ids of this layout follow kbs-format.md §1.
    check_id = True

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: Manifest | None,
                 url: str | None = None, storage_options: dict | None = None) -> None:
        self.fs = fs
        self.path = _strip(path)
        self.manifest = manifest
        self.url = url or path
        self.storage_options = dict(storage_options or {})
        self._segments: list[SegmentRef] | None = None

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
            return cls(fs, path, None, url, storage_options)
        manifest = cls.parse_manifest(raw, f"{path}/{MANIFEST}")
        check_commit_state(fs, path, manifest, url)  # a newer commit claimed: never read a mix
        return cls(fs, path, manifest, url, storage_options)

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
            if self.manifest is None:
                refs = self._discover()
            elif self.manifest.has_index:
                refs = self._from_index()
            else:
                refs = self._probe([
                    SegmentRef(t.name, p.partition, seq, self._segment_path(t.name, p.partition, seq))
                    for t in self.manifest.topics
                    for p in t.partitions
                    for seq in range(p.segments)
                ])
            self._segments = sorted(refs, key=lambda r: (r.topic, r.partition, r.seq))
        return list(self._segments)

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
                size_bytes=s.size_bytes, crc64=s.crc64, codec=codec,
            )
            for t in self.manifest.topics
            for p in t.partitions
            for seq, s in enumerate(p.segment_index or [])
        ]

    def _discover(self) -> list[SegmentRef]:
        """List ``topics/<topic>/<partition>/segment-*.kbs`` of a backup without manifest."""
        root = f"{self.path}/{TOPICS_DIR}"
        refs = []
        try:
            files = self.fs.find(root, detail=True)
        except FileNotFoundError:
            files = {}
        for path, info in sorted(files.items()):
            rel = _strip(path)[len(_strip(self.fs._strip_protocol(root))) + 1 :].split("/")
            if len(rel) != 3 or not rel[2].endswith(".kbs"):
                continue
            topic, part, name = rel
            try:
                ref = SegmentRef(check_topic(topic), check_partition(part), parse_segment_name(name),
                                 self._segment_path(topic, int(part), parse_segment_name(name)),
                                 size_bytes=info.get("size"))
            except InvalidNameError:
                continue  # foreign files (e.g. temp files) are not segments
            refs.append(ref)
        return self._probe(refs)

    def _probe(self, refs: list[SegmentRef]) -> list[SegmentRef]:
        """Fill offsets and counts from each segment's header and footer (two small reads each)."""
        if not refs:
            return []
        paths = [r.path for r in refs]
        heads = self.fs.cat_ranges(paths, [0] * len(paths), [HEADER_SIZE] * len(paths), on_error="return")
        feet = self.fs.cat_ranges(paths, [-FOOTER_SIZE] * len(paths), [None] * len(paths), on_error="return")
        out = []
        for ref, head, foot in zip(refs, heads, feet, strict=False):
            for blob in (head, foot):
                if isinstance(blob, FileNotFoundError):
                    raise segment_missing(ref) from blob
                if isinstance(blob, Exception):
                    raise blob
            h = SegmentHeader.parse(head, ref.path)
            if len(foot) < FOOTER_SIZE:
                raise TruncatedSegmentError("file too short for a footer", ref.path, 0)
            f = SegmentFooter.parse(b"\0" * HEADER_SIZE + foot, ref.path)
            out.append(replace(ref, first_offset=h.first_offset, last_offset=f.last_offset,
                               records=h.record_count, crc64=h.checksum,
                               codec={0: "none", 1: "lz4", 2: "zstd"}[int(h.codec)]))
        return out

    # -- reading ---------------------------------------------------------------------------------
    def read_segment_bytes(self, ref: SegmentRef) -> bytes:
        try:
            data = self.fs.cat_file(ref.path)
        except FileNotFoundError as e:
            raise segment_missing(ref) from e
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
        except FileNotFoundError as e:
            raise segment_missing(ref) from e
        check_size(ref, len(data))
        return data

    def open_segment(self, ref: SegmentRef, verify_checksums: bool = True,
                     batch_crc: bool = False) -> SegmentReader:
        """Read and check a segment; ``batch_crc`` also checks every batch CRC-32 (deep validation)."""
        reader = SegmentReader(self.read_segment(ref), ref.path, verify_checksums, batch_crc=batch_crc)
        self._check_crc64(ref, reader.header.checksum)
        return reader

    #: Segments at least this large are streamed (:class:`~fsspec_kbs.store.stream.SegmentStream`)
    #: instead of read whole; set on an instance (or the class) to change it.
    stream_min_bytes: int = STREAM_MIN_BYTES

    def open_chunks(self, ref: SegmentRef, verify_checksums: bool = True) -> OpenedSegment:
        """Open a segment for decoding chunk by chunk (see :meth:`iter_columns`).

        Segments of at least :attr:`stream_min_bytes` are streamed (only the chunks being
        decoded are in memory; their frames are read as the decode tasks are taken); smaller
        ones are read whole. Close the result (or let :func:`iter_opened` do it).
        """
        size = ref.size_bytes if ref.size_bytes is not None else self._segment_size(ref)
        if size < self.stream_min_bytes:
            reader = SegmentReader(self.read_segment(ref), ref.path, verify_checksums, crc64_last=True)
            self._check_crc64(ref, reader.header.checksum)
            return OpenedSegment(ref, reader)
        try:
            f = self.fs.open(ref.path, "rb", block_size=STREAM_BLOCK_SIZE, cache_type="readahead")
        except FileNotFoundError as e:
            raise segment_missing(ref) from e
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
        return OpenedSegment(ref, stream, f)

    def iter_columns(self, ref: SegmentRef, verify_checksums: bool = True,
                     max_chunk_bytes: int = 32 * 1024 * 1024, batch_crc: bool = False,
                     views: bool = False, threads: int | None = None) -> Iterator[RecordColumns | ViewColumns]:
        """Decode one segment in chunks, cross-checked against what the manifest says of it.

        With ``views`` the chunks are :class:`~fsspec_kbs.format.ViewColumns`: Arrow views into
        the decompressed batches, no copy of the record data.

        Every batch CRC-32 is checked by the decoding thread just before its batch is decoded,
        which also computes the batch's share of the segment CRC-64; the CRC-64 is compared
        at the end, after the batches before it were yielded (``SegmentReader(crc64_last=True)``:
        each byte is read from memory once). ``batch_crc`` is accepted for compatibility: the
        CRC-32s are always checked. ``threads`` decode chunks at once (default: two, or what
        :func:`~fsspec_kbs.format.segment.decode_threads` set). Segments of at least
        :attr:`stream_min_bytes` are also streamed (:meth:`open_chunks`). Any format error is re-diagnosed
        (:meth:`rediagnose`), so it does not depend on the order of the checks.
        """
        try:
            yield from iter_opened(self.open_chunks(ref, verify_checksums), max_chunk_bytes, views, threads)
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
        except FileNotFoundError as e:
            raise segment_missing(ref) from e

    def _check_crc64(self, ref: SegmentRef, header_crc: int) -> None:
        if ref.crc64 is not None and header_crc != ref.crc64:
            raise SegmentMismatchError(
                f"header CRC-64 {header_crc} differs from the manifest's {ref.crc64} "
                "(the segment was replaced after the manifest was written)", ref.path, 24)

    def describe(self) -> dict[str, Any]:
        """Summary numbers for ``kbs describe``."""
        m = self.manifest
        segs = self.segments()
        return {
            "url": self.url,
            "backup_id": self.backup_id,
            "layout": self.layout,
            "complete": m is not None,
            "version": m.version if m else None,
            "created_at": m.created_at if m else None,
            "completed_at": m.completed_at if m else None,
            "compression": m.compression if m else None,
            "source_cluster": m.source_cluster if m else None,
            "statistics": m.statistics if m else None,
            "time_range": m.time_range if m else None,
            "segments": segs,
        }
