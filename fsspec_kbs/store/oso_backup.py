"""Backups in the layout the OSO kafka-backup tool writes ("oso-native"), on any fsspec filesystem.

:class:`OsoBackup` has the interface of :class:`~fsspec_kbs.store.backup.KbsBackup`, so every
reader (dataset, CLI, Spark, the ``kbs`` protocol) reads such backups unchanged;
:func:`~fsspec_kbs.store.open.open_backup` picks the class from the manifest's shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, NoReturn

import fsspec

from fsspec_kbs.errors import (
    ManifestError,
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
from fsspec_kbs.store.backup import KbsBackup, SegmentRef, check_size, segment_missing
from fsspec_kbs.store.names import TOPICS_DIR
from fsspec_kbs.store.opened import OpenedSegment, iter_opened

LAYOUT = "oso"
_PARTITION_PREFIX = "partition="


def is_oso_manifest(doc: Any) -> bool:
    """True for the OSO tool's manifest: no ``version``, integer ``created_at``, and
    partitions with ``partition_id``/``segments``."""
    if not isinstance(doc, dict) or "version" in doc:
        return False
    created = doc.get("created_at")
    if not isinstance(created, int) or isinstance(created, bool):
        return False
    topics = doc.get("topics")
    if not isinstance(topics, list):
        return False
    for t in topics:
        for p in (t.get("partitions") or []) if isinstance(t, dict) else []:
            return isinstance(p, dict) and "partition_id" in p and "segments" in p
    return "backup_id" in doc  # an empty backup: no partition to look at


@dataclass(frozen=True)
class _Partition:
    """Enough of a partition for :func:`fsspec_kbs.validate.validate_backup`'s manifest checks."""

    partition: int
    records: int
    segment_index: None = None  # the per-segment list is checked segment by segment instead


@dataclass(frozen=True)
class _Topic:
    name: str
    partitions: list[_Partition]


class OsoManifest(dict):
    """The raw manifest dict, plus the few attributes generic code reads from a KBS manifest."""

    path: str = ""

    @property
    def backup_id(self) -> str:
        return str(self["backup_id"])

    @property
    def statistics(self) -> dict[str, int]:
        segs = [s for t in self["topics"] for p in t["partitions"] for s in p["segments"]]
        return {
            "topics": len(self["topics"]),
            "partitions": sum(len(t["partitions"]) for t in self["topics"]),
            "segments": len(segs),
            "records": sum(int(s["record_count"]) for s in segs),
            "uncompressed_bytes": sum(int(s.get("uncompressed_size") or 0) for s in segs),
            "compressed_bytes": sum(int(s.get("compressed_size") or 0) for s in segs),
        }

    @property
    def topics(self) -> list[_Topic]:  # type: ignore[override]
        return [_Topic(t["name"], [_Partition(int(p["partition_id"]), sum(int(s["record_count"])
                                                                            for s in p["segments"]))
                                   for p in t["partitions"]])
                for t in self["topics"]]

    @classmethod
    def parse(cls, raw: bytes | str, path: str) -> OsoManifest:
        """Parse and check the fields this reader relies on; unknown fields are kept and ignored."""
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"not valid JSON: {e}", path) from e
        if not is_oso_manifest(doc):
            raise ManifestError("not an OSO kafka-backup manifest", path)
        m = cls(doc)
        m.path = path

        def need(obj: dict, key: str, kinds: tuple, where: str) -> Any:
            v = obj.get(key)
            if not isinstance(v, kinds) or isinstance(v, bool):
                raise ManifestError(f"{where}: field {key!r} missing or not {'/'.join(k.__name__ for k in kinds)}",
                                    path)
            return v

        need(doc, "backup_id", (str,), "manifest")
        for ti, t in enumerate(doc["topics"]):
            if not isinstance(t, dict):
                raise ManifestError(f"topics[{ti}] is not an object", path)
            name = need(t, "name", (str,), f"topics[{ti}]")
            for pi, p in enumerate(need(t, "partitions", (list,), f"topic {name}")):
                where = f"topic {name} partitions[{pi}]"
                if not isinstance(p, dict):
                    raise ManifestError(f"{where} is not an object", path)
                pid = need(p, "partition_id", (int,), where)
                if pid < 0:
                    raise ManifestError(f"{where}: negative partition_id {pid}", path)
                prev = None
                for si, s in enumerate(need(p, "segments", (list,), where)):
                    sw = f"{name}/{pid} segments[{si}]"
                    if not isinstance(s, dict):
                        raise ManifestError(f"{sw} is not an object", path)
                    key = need(s, "key", (str,), sw)
                    if key.startswith("/") or ".." in key.split("/") or "\\" in key:
                        raise ManifestError(f"{sw}: illegal segment key {key!r}", path)
                    start = need(s, "start_offset", (int,), sw)
                    end = need(s, "end_offset", (int,), sw)
                    count = need(s, "record_count", (int,), sw)
                    if count < 0 or (count > 0 and end < start):
                        raise ManifestError(f"{sw}: offsets {start}…{end} with {count} records", path)
                    if prev is not None and start <= prev:
                        raise ManifestError(f"{sw}: start offset {start} is not above the previous "
                                            f"segment's end offset {prev} (segments must be in offset order)",
                                            path)
                    prev = end
                    for opt in ("uncompressed_size", "compressed_size", "start_timestamp", "end_timestamp"):
                        if s.get(opt) is not None:
                            need(s, opt, (int,), sw)
        return m


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class OsoBackup(KbsBackup):
    """A backup written by the OSO kafka-backup tool: ``manifest.json`` + KBAK segments.

    Same interface as :class:`KbsBackup`. ``manifest`` is the raw manifest
    (an :class:`OsoManifest` dict) or None for a backup without one.

    Per-segment ``start_timestamp``/``end_timestamp`` are the first and last record's
    timestamps, not bounds (Kafka timestamps need not increase), so refs carry no
    ``min_timestamp``/``max_timestamp`` and time filters prune nothing; rows are still filtered.
    """

    layout = LAYOUT
    check_id = False  # the OSO tool names backups freely; paths come from manifest keys

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: OsoManifest | None,  # type: ignore[override]
                 url: str | None = None, storage_options: dict | None = None) -> None:
        super().__init__(fs, path, None, url, storage_options)
        self.manifest = manifest  # type: ignore[assignment]
        self._limits: dict[str, int] = {}
        self._timestamps: dict[str, tuple[int | None, int | None]] = {}

    @classmethod
    def parse_manifest(cls, raw: bytes, path: str) -> OsoManifest:
        return OsoManifest.parse(raw, path)

    @property
    def backup_id(self) -> str:
        return self.manifest.backup_id if self.manifest else self.path.rsplit("/", 1)[-1]

    # -- planning --------------------------------------------------------------------------------
    def _key_path(self, key: str) -> str:
        """Segment keys are relative to the root above the backup and start with its id."""
        assert self.manifest is not None
        prefix = f"{self.manifest.backup_id}/"
        rel = key[len(prefix):] if key.startswith(prefix) else key
        return f"{self.path}/{rel}"

    def segments(self) -> list[SegmentRef]:
        """Every segment in (topic, partition, start offset) order, from the manifest alone."""
        if self._segments is None:
            if self.manifest is None:
                refs = self._discover()
            else:
                codec = str(self.manifest.get("compression") or "") or None
                refs = []
                for t in self.manifest["topics"]:
                    for p in t["partitions"]:
                        for seq, s in enumerate(p["segments"]):
                            path = self._key_path(s["key"])
                            if s.get("uncompressed_size") is not None:
                                self._limits[path] = int(s["uncompressed_size"])
                            self._timestamps[path] = (s.get("start_timestamp"), s.get("end_timestamp"))
                            refs.append(SegmentRef(
                                topic=t["name"], partition=int(p["partition_id"]), seq=seq, path=path,
                                first_offset=int(s["start_offset"]), last_offset=int(s["end_offset"]),
                                records=int(s["record_count"]), size_bytes=s.get("compressed_size"),
                                codec=codec, layout=LAYOUT))
            self._segments = sorted(refs, key=lambda r: (r.topic, r.partition, r.seq))
        return list(self._segments)

    def _discover(self) -> list[SegmentRef]:
        """Segments of a backup without manifest: ``topics/<t>/partition=<p>/segment-*``, ordered
        by their header's start offset (old releases numbered files per run, not by offset)."""
        root = f"{self.path}/{TOPICS_DIR}"
        try:
            files = self.fs.find(root, detail=True)
        except FileNotFoundError:
            files = {}
        base = self.fs._strip_protocol(root).rstrip("/")
        found = []
        for path, info in sorted(files.items()):
            rel = path.rstrip("/")[len(base) + 1 :].split("/")
            if len(rel) != 3 or not rel[1].startswith(_PARTITION_PREFIX) or not rel[2].startswith("segment-"):
                continue
            part = rel[1][len(_PARTITION_PREFIX):]
            if not part.isdigit() or ".tmp" in rel[2]:
                continue
            found.append((rel[0], int(part), f"{root}/{rel[0]}/{rel[1]}/{rel[2]}", info.get("size")))
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

    def open_segment(self, ref: SegmentRef, verify_checksums: bool = True) -> OsoSegment:  # type: ignore[override]
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
        return seg

    def open_chunks(self, ref: SegmentRef, verify_checksums: bool = True) -> OpenedSegment:
        """Decode a whole segment (:meth:`open_segment`); its chunks are then copied out as tasks."""
        return OpenedSegment(ref, OsoChunks(self.open_segment(ref, verify_checksums)))

    def rediagnose(self, ref: SegmentRef, verify_checksums: bool, err: SegmentFormatError) -> NoReturn:
        raise err  # open_chunks decoded and checked the whole segment: its error is the one

    def iter_columns(self, ref: SegmentRef, verify_checksums: bool = True,  # type: ignore[override]
                     max_chunk_bytes: int = 32 * 1024 * 1024, views: bool = False,
                     threads: int | None = None) -> Iterator[RecordColumns]:
        """Decode one segment in chunks of about ``max_chunk_bytes`` of record data.

        ``views`` is accepted for the common interface; OSO records are always copied (the
        Arrow layer turns them into views when asked).
        """
        yield from iter_opened(self.open_chunks(ref, verify_checksums), max_chunk_bytes, threads=threads)

    # -- checking --------------------------------------------------------------------------------
    def validate_segment(self, ref: SegmentRef, deep: bool, report: Any) -> None:
        """Used by :func:`fsspec_kbs.validate.validate_backup`.

        Quick: size, header and footer magic, header fields against the manifest. Deep: also
        the CRC-32, every record, and the first/last record timestamps.
        """
        if deep:
            seg = self.open_segment(ref, verify_checksums=True)
            cols = list(seg.iter_columns())
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
        except FileNotFoundError as e:
            raise segment_missing(ref) from e
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
        """Offset ranges the source no longer had when the tool backed the partition up."""
        out = []
        for t in (self.manifest or {}).get("topics", []):
            for p in t.get("partitions", []):
                for g in p.get("gaps") or []:
                    if isinstance(g, dict):
                        out.append({"topic": t["name"], "partition": p["partition_id"], **g})
        return out

    def describe(self) -> dict[str, Any]:
        """Summary numbers for ``kbs describe`` (same keys as KBS, plus ``gaps``)."""
        m = self.manifest
        segs = self.segments()
        return {
            "url": self.url,
            "backup_id": self.backup_id,
            "layout": self.layout,
            "complete": m is not None,
            "version": None,
            "created_at": _iso(m.get("created_at")) if m else None,
            "completed_at": None,
            "compression": {"algorithm": m.get("compression")} if m else None,
            "source_cluster": ({"cluster_id": m.get("source_cluster_id"), "brokers": m.get("source_brokers") or []}
                               if m else None),
            "statistics": m.statistics if m else None,
            # The manifest only knows each segment's first and last record's timestamp: no bounds.
            "time_range": None,
            "gaps": self.gaps(),
            "segments": segs,
        }


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
