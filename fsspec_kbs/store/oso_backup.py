"""Backups in the layout the OSO kafka-backup tool writes ("oso-native"), on any fsspec filesystem.

:class:`OsoBackup` is a :class:`~fsspec_kbs.store.layout.Backup`, a sibling of
:class:`~fsspec_kbs.store.backup.KbsBackup`, so every reader (dataset, CLI, Spark, the ``kbs``
protocol) reads such backups unchanged; :func:`~fsspec_kbs.store.open.open_backup` picks the
class from the manifest's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

import fsspec
import msgspec

from fsspec_kbs.errors import (
    BackupNotFoundError,
    IncompleteBackupError,
    SegmentFormatError,
    SegmentMismatchError,
)
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.oso import (
    DEFAULT_MAX_UNCOMPRESSED,
    FOOTER_SIZE,
    HEADER_SIZE,
    MAGIC,
    OSO_CODEC_NAMES,
    OsoChunks,
    OsoHeader,
    OsoSegment,
    check_footer,
    codec_from_extension,
    decode_segment,
)
from fsspec_kbs.store.layout import Backup, BackupDescription, Origin, ValidationSink, iso_from_ms
from fsspec_kbs.store.listing import topic_tree_entries
from fsspec_kbs.store.names import TOPICS_DIR
from fsspec_kbs.store.opened import OpenedSegment
from fsspec_kbs.store.oso_manifest import OsoManifest
from fsspec_kbs.store.segment_ref import Bounds, SegmentRef, check_size, segment_missing

LAYOUT = "oso"
_PARTITION_PREFIX = "partition="


class OsoBackup(Backup[OsoManifest]):
    """A backup written by the OSO kafka-backup tool: ``manifest.json`` + KBAK segments.

    ``manifest`` is the tool's manifest (an :class:`~fsspec_kbs.store.oso_manifest.OsoManifest`)
    or None for a backup without one. The format has no batch index: every segment is one
    compressed unit, read and checked whole.

    Per-segment ``start_timestamp``/``end_timestamp`` are the first and last record's
    timestamps, not bounds (Kafka timestamps need not increase), so refs carry no
    ``min_timestamp``/``max_timestamp`` and time filters prune nothing; rows are still filtered.
    """

    layout = LAYOUT
    check_id = False  # the OSO tool names backups freely; paths come from manifest keys
    manifest_written_last = False

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: OsoManifest | None,
                 url: str | None = None, storage_options: dict | None = None,
                 allow_incomplete: bool = False) -> None:
        super().__init__(fs, path, manifest, url, storage_options, allow_incomplete)
        self._limits: dict[str, int] = {}
        self._timestamps: dict[str, tuple[int | None, int | None]] = {}
        self._stored: list[str] | None = None

    @classmethod
    def parse_manifest(cls, raw: bytes, path: str) -> OsoManifest:
        return OsoManifest.parse(raw, path)

    # -- planning --------------------------------------------------------------------------------
    def _key_path(self, key: str) -> str:
        """Segment keys are relative to the root above the backup and start with its id."""
        assert self.manifest is not None
        prefix = f"{self.manifest.backup_id}/"
        rel = key[len(prefix):] if key.startswith(prefix) else key
        return f"{self.path}/{rel}"

    def _list_segments(self) -> list[SegmentRef]:
        """From the manifest alone (in start offset order), checked against one listing;
        without a manifest, from the listing (:meth:`_discover`)."""
        if self.manifest is None:
            return self._discover()
        codec = self.manifest.compression
        refs = []
        for t in self.manifest.topics:
            for p in t.partitions:
                for seq, s in enumerate(p.segments):
                    path = self._key_path(s.key)
                    if s.uncompressed_size is not None:
                        self._limits[path] = s.uncompressed_size
                    self._timestamps[path] = (s.start_timestamp, s.end_timestamp)
                    refs.append(SegmentRef(
                        topic=t.name, partition=p.partition_id, seq=seq, path=path,
                        first_offset=s.start_offset, last_offset=s.end_offset,
                        records=s.record_count, size_bytes=s.compressed_size,
                        codec=codec, layout=LAYOUT))
        self._check_all_listed(refs)
        return refs

    @property
    def complete(self) -> bool:
        """A manifest that lists every segment file stored (the tool rewrites it as it goes)."""
        if self.manifest is None:
            return False
        try:
            listed = {r.path for r in self.segments()}
        except IncompleteBackupError:
            return False
        return not set(self._stored_files()) - listed

    def _stored_files(self) -> list[str]:
        # One listing per opened backup (segments() and complete both ask).
        if self._stored is None:
            self._stored = [f[2] for f in self._listing()]
        return self._stored

    def _check_all_listed(self, refs: list[SegmentRef]) -> None:
        listed = {r.path for r in refs}
        stored = set(self._stored_files())
        for ref in refs:
            if ref.path not in stored:
                raise segment_missing(ref)
        unlisted = sorted(stored - listed)
        if unlisted and not self.allow_incomplete:
            raise IncompleteBackupError(
                f"{self.url} is incomplete: {len(unlisted)} segment file(s) on storage are not in its "
                f"manifest (first: {unlisted[0]}). The OSO tool rewrites manifest.json as it goes, so "
                "this backup was most likely interrupted. Pass allow_incomplete=True "
                "(CLI: --allow-incomplete) to read what its manifest lists.")

    def _listing(self) -> list[tuple[str, int, str, int | None]]:
        """``(topic, partition, path, size)`` of the segment files under ``topics/``."""
        found = []
        # With directories: one named like a segment must not hide (it is not readable).
        for rel, path, info in topic_tree_entries(self.fs, f"{self.path}/{TOPICS_DIR}", withdirs=True):
            if not rel[1].startswith(_PARTITION_PREFIX) or not rel[2].startswith("segment-"):
                continue
            part = rel[1][len(_PARTITION_PREFIX):]
            if not part.isdigit() or ".tmp" in rel[2]:
                continue
            if info.get("type") == "directory":
                raise BackupNotFoundError(f"segment {path} is a directory, not a file")
            found.append((rel[0], int(part), path, info.get("size")))
        return found

    def _discover(self) -> list[SegmentRef]:
        """Segments of a backup without manifest: ``topics/<t>/partition=<p>/segment-*``, ordered
        by their header's start offset (old releases numbered files per run, not by offset)."""
        found = self._listing()
        if not found:
            return []
        heads = self.fs.cat_ranges([f[2] for f in found], [0] * len(found), [HEADER_SIZE] * len(found),
                                   on_error="return")
        probed = []
        for (topic, part, path, size), head in zip(found, heads, strict=True):
            if isinstance(head, Exception):
                raise head
            first = last = count = None
            if bytes(head[:4]) == MAGIC and len(head) == HEADER_SIZE:
                h = OsoHeader.parse(head, path)
                first, last, count = h.start_offset, h.end_offset, h.record_count
            probed.append(SegmentRef(topic, part, 0, path, first, last, count, size_bytes=size,
                                     codec=OSO_CODEC_NAMES[codec_from_extension(path)], layout=LAYOUT))
        probed.sort(key=lambda r: (r.topic, r.partition, r.first_offset if r.first_offset is not None else -1,
                                   r.path))
        out: list[SegmentRef] = []
        for r in probed:
            seq = out[-1].seq + 1 if out and (out[-1].topic, out[-1].partition) == (r.topic, r.partition) else 0
            out.append(replace(r, seq=seq))
        return out

    # -- reading ---------------------------------------------------------------------------------
    def max_uncompressed(self, ref: SegmentRef) -> int:
        """Bound on a segment's decompressed size: the manifest's ``uncompressed_size`` or a cap."""
        if not self._limits and self.manifest is not None:
            self.segments()
        return self._limits.get(ref.path, DEFAULT_MAX_UNCOMPRESSED)

    def set_max_uncompressed(self, limits: Mapping[str, int]) -> None:
        self._limits.update(limits)

    def open_segment(self, ref: SegmentRef, verify_checksums: bool = True) -> OsoSegment:
        """Read, check and decode a whole segment, cross-checked against the manifest."""
        seg = decode_segment(self.read_segment(ref), ref.path, verify_checksum=verify_checksums,
                             max_uncompressed=self.max_uncompressed(ref))
        if seg.legacy:
            cols = seg.legacy_columns
            assert cols is not None
            count = len(cols)
            first = int(cols.offsets[0]) if count else None
            last = int(cols.offsets[-1]) if count else None
        else:
            assert seg.records is not None
            count, first, last = len(seg.records), seg.records.first_offset, seg.records.last_offset
        for what, mine, theirs, at in (("records", count, ref.records, 8), ("first offset", first, ref.first_offset, 16),
                                       ("last offset", last, ref.last_offset, 24)):
            if theirs is not None and mine is not None and mine != theirs:
                raise SegmentMismatchError(f"segment holds {what} {mine} but the manifest says {theirs}",
                                           ref.path, None if seg.legacy else at)
        claimed = self._limits.get(ref.path)
        if claimed is not None and seg.uncompressed_size != claimed:
            raise SegmentMismatchError(f"body decompresses to {seg.uncompressed_size} bytes but the manifest's "
                                       f"uncompressed_size is {claimed}", ref.path, None if seg.legacy else HEADER_SIZE)
        if count:
            if seg.legacy:
                first_ts, last_ts = seg.legacy_columns.timestamps[[0, -1]]  # type: ignore[union-attr]
            else:
                assert seg.records is not None
                first_ts = seg.records.columns(0, 1).timestamps[0]
                last_ts = seg.records.columns(count - 1, count).timestamps[0]
            start_ts, end_ts = self._timestamps.get(ref.path, (None, None))
            for what, mine, theirs in (("first record's timestamp", int(first_ts), start_ts),
                                       ("last record's timestamp", int(last_ts), end_ts)):
                if theirs is not None and mine != theirs:
                    raise SegmentMismatchError(f"{what} is {mine} but the manifest says {theirs}", ref.path)
        return seg

    def open_chunks(self, ref: SegmentRef, verify_checksums: bool = True,
                    bounds: Bounds | None = None) -> OpenedSegment:
        """Decode a whole segment (:meth:`open_segment`); its chunks are then copied out as tasks.
        ``bounds`` are accepted for the common interface: an OSO segment is one compressed unit."""
        return OpenedSegment(ref, OsoChunks(self.open_segment(ref, verify_checksums)))

    def rediagnose(self, ref: SegmentRef, verify_checksums: bool, err: SegmentFormatError) -> NoReturn:
        raise err  # open_chunks decoded and checked the whole segment: its error is the one

    # -- checking --------------------------------------------------------------------------------
    def check_unread(self, refs: Iterable[SegmentRef]) -> None:
        """From the OSO header (count, start and end offset): one small ranged read each.

        A legacy segment (no ``KBAK`` header) has nothing to probe: only decoding it whole
        would tell, which is what pruning avoids, so its manifest entry is taken as it is."""
        todo = [r for r in refs if r.path not in self._checked]
        if not todo:
            return
        heads = self.fs.cat_ranges([r.path for r in todo], [0] * len(todo), [HEADER_SIZE] * len(todo),
                                   on_error="return")
        for ref, head in zip(todo, heads, strict=True):
            if isinstance(head, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                raise segment_missing(ref, head) from head
            if isinstance(head, Exception):
                raise head
            if bytes(head[:4]) == MAGIC and len(head) == HEADER_SIZE:
                h = OsoHeader.parse(head, ref.path)
                for what, mine, theirs, at in (("record count", h.record_count, ref.records, 8),
                                               ("start offset", h.start_offset, ref.first_offset, 16),
                                               ("end offset", h.end_offset, ref.last_offset, 24)):
                    if theirs is not None and mine != theirs:
                        raise SegmentMismatchError(f"{what} {mine} in the file but {theirs} in the manifest",
                                                   ref.path, at)
            self._checked.add(ref.path)

    def validate_segment(self, ref: SegmentRef, deep: bool, report: ValidationSink,
                         check_columns: Callable[[RecordColumns], None] | None = None) -> None:
        """Quick: size, header and footer magic, header fields against the manifest. Deep: also
        the CRC-32, every record (each chunk also passed to ``check_columns``), and the
        first/last record timestamps.
        """
        if deep:
            seg = self.open_segment(ref, verify_checksums=True)
            cols = list(seg.iter_columns())
            for c in cols:
                if check_columns is not None:
                    check_columns(c)
            report.records_checked += sum(len(c) for c in cols)
            start_ts, end_ts = self._timestamps.get(ref.path, (None, None))
            if cols:
                for what, mine, theirs in (("first record timestamp", int(cols[0].timestamps[0]), start_ts),
                                           ("last record timestamp", int(cols[-1].timestamps[-1]), end_ts)):
                    if theirs is not None and mine != theirs:
                        raise SegmentMismatchError(f"{what} is {mine} but the manifest says {theirs}", ref.path)
            return
        try:
            size = self.fs.size(ref.path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        check_size(ref, size)
        head = self.fs.cat_file(ref.path, start=0, end=min(size, HEADER_SIZE))
        if bytes(head[:4]) != MAGIC:
            self.open_segment(ref, verify_checksums=True)  # legacy JSON (or garbage): only a decode can tell
            return
        h = OsoHeader.parse(head, ref.path)
        tail = self.fs.cat_file(ref.path, start=max(0, size - FOOTER_SIZE), end=size)
        # check_footer needs a whole file's length; the CRC is left to the deep check.
        check_footer(head[:HEADER_SIZE] + b"\0" * max(0, size - HEADER_SIZE - FOOTER_SIZE) + tail
                     if size >= HEADER_SIZE + FOOTER_SIZE else head, ref.path, verify_checksum=False)
        for what, mine, theirs, at in (("record count", h.record_count, ref.records, 8),
                                       ("start offset", h.start_offset, ref.first_offset, 16),
                                       ("end offset", h.end_offset, ref.last_offset, 24)):
            if theirs is not None and mine != theirs:
                raise SegmentMismatchError(f"{what} {mine} in the file but {theirs} in the manifest", ref.path, at)
        if ref.codec is not None and OSO_CODEC_NAMES[h.codec] != ref.codec:
            raise SegmentMismatchError(f"segment codec {OSO_CODEC_NAMES[h.codec]} but the manifest says {ref.codec}",
                                       ref.path, 5)

    # -- describing ------------------------------------------------------------------------------
    def gaps(self) -> list[dict[str, Any]]:
        """Offset ranges the source no longer had when the tool backed the partition up (as it noted)."""
        if self.manifest is None:
            return []
        return [{"topic": t.name, "partition": p.partition_id, **msgspec.structs.asdict(g)}
                for t in self.manifest.topics for p in t.partitions for g in p.gaps or []]

    def describe(self) -> BackupDescription:
        """What ``kbs describe`` shows; the manifest only knows each segment's first and last
        record's timestamp, so no time range; the gaps the tool noted."""
        m = self.manifest
        segs = self.segments()
        if m is None:
            return BackupDescription(self.url, self.backup_id, self.layout, False, segs, gaps=self.gaps())
        return BackupDescription(
            self.url, self.backup_id, self.layout, self.complete, segs, created_at=iso_from_ms(m.created_at),
            compression={"algorithm": m.compression},
            source_cluster={"cluster_id": m.source_cluster_id, "brokers": m.source_brokers or []},
            statistics=m.statistics, gaps=self.gaps())

    def origin(self) -> Origin:
        m = self.manifest
        if m is None:
            return Origin()
        brokers = m.source_brokers or []
        cluster = ({"cluster_id": m.source_cluster_id, "bootstrap_servers": ",".join(brokers)}
                   if m.source_cluster_id is not None or brokers else None)
        return Origin(created_at=iso_from_ms(m.created_at), created_at_ms=m.created_at, source_cluster=cluster,
                      cluster_id=m.source_cluster_id, brokers=brokers)

    def copy_fields(self) -> dict[str, Any]:
        """Where the copy came from, and the gaps the tool noted."""
        extra: dict[str, Any] = {"converted_from": {"layout": LAYOUT, "backup_id": self.backup_id}}
        gaps = self.gaps()
        if gaps:
            extra["oso_gaps"] = gaps
        return extra


def looks_like_oso_without_manifest(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """An incomplete backup in the OSO layout has ``topics/<t>/partition=<p>/`` directories."""
    try:
        topics = fs.ls(f"{path}/{TOPICS_DIR}", detail=False)
        for t in topics[:3]:
            for p in fs.ls(t, detail=False)[:3]:
                if p.rstrip("/").rsplit("/", 1)[-1].startswith(_PARTITION_PREFIX):
                    return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    return False
