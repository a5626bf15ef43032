"""The ``manifest.json`` model (kbs-format.md §3): parse with checks, serialise, preserve extras."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from fsspec_kbs.errors import InvalidNameError, ManifestError, UnsupportedVersionError
from fsspec_kbs.store.names import check_backup_id, check_partition, check_topic, parse_segment_name

WRITE_VERSION = "1.1"
SUPPORTED_MAJOR = 1


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _get(d: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _opt_int(d: dict, key: str, where: str) -> int | None:
    value = d.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ManifestError(f"{where}: field {key!r} must be an integer or null")
    return value


@dataclass
class SegmentEntry:
    """One ``segment_index`` entry (1.1)."""

    file: str
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int | None
    max_timestamp: int | None
    size_bytes: int
    crc64: int
    extra: dict = field(default_factory=dict)

    _KEYS = ("file", "first_offset", "last_offset", "records", "min_timestamp", "max_timestamp",
             "size_bytes", "crc64")

    def to_dict(self) -> dict:
        return {**self.extra, **{k: getattr(self, k) for k in self._KEYS}}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> SegmentEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: segment_index entry must be an object")
        name = _get(d, "file", str, where)
        try:
            parse_segment_name(name)
        except InvalidNameError as e:
            raise InvalidNameError(f"{where}: {e}") from e
        return cls(
            file=name,
            first_offset=_get(d, "first_offset", int, where),
            last_offset=_get(d, "last_offset", int, where),
            records=_get(d, "records", int, where),
            min_timestamp=_opt_int(d, "min_timestamp", where),
            max_timestamp=_opt_int(d, "max_timestamp", where),
            size_bytes=_get(d, "size_bytes", int, where),
            crc64=_get(d, "crc64", int, where),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )


@dataclass
class PartitionEntry:
    partition: int
    first_offset: int
    last_offset: int
    records: int
    segments: int
    segment_index: list[SegmentEntry] | None = None
    extra: dict = field(default_factory=dict)

    _KEYS = ("partition", "first_offset", "last_offset", "records", "segments", "segment_index")

    def to_dict(self) -> dict:
        d = {**self.extra, "partition": self.partition, "first_offset": self.first_offset,
             "last_offset": self.last_offset, "records": self.records, "segments": self.segments}
        if self.segment_index is not None:
            d["segment_index"] = [s.to_dict() for s in self.segment_index]
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str) -> PartitionEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: partition entry must be an object")
        p = _get(d, "partition", int, where)
        try:
            check_partition(p)
        except InvalidNameError as e:
            raise InvalidNameError(f"{where}: {e}") from e
        where = f"{where} partition {p}"
        index = d.get("segment_index")
        if index is not None and not isinstance(index, list):
            raise ManifestError(f"{where}: segment_index must be a list")
        entry = cls(
            partition=p,
            first_offset=_get(d, "first_offset", int, where),
            last_offset=_get(d, "last_offset", int, where),
            records=_get(d, "records", int, where),
            segments=_get(d, "segments", int, where),
            segment_index=None if index is None else [
                SegmentEntry.from_dict(s, f"{where} segment_index[{i}]") for i, s in enumerate(index)
            ],
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )
        if entry.segments < 0 or entry.records < 0:
            raise ManifestError(f"{where}: negative segment or record count")
        if entry.segment_index is not None:
            if len(entry.segment_index) != entry.segments:
                raise ManifestError(
                    f"{where}: segments = {entry.segments} but segment_index has {len(entry.segment_index)} entries"
                )
            for i, s in enumerate(entry.segment_index):
                if parse_segment_name(s.file) != i:
                    raise ManifestError(f"{where}: segment_index[{i}] names {s.file}, expected sequence {i}")
        return entry


@dataclass
class TopicEntry:
    name: str
    partitions: list[PartitionEntry]
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.extra, "name": self.name, "partitions": [p.to_dict() for p in self.partitions]}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> TopicEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: topic entry must be an object")
        name = _get(d, "name", str, where)
        try:
            check_topic(name)
        except InvalidNameError as e:
            raise InvalidNameError(f"{where}: {e}") from e
        parts = _get(d, "partitions", list, f"{where} topic {name!r}")
        return cls(
            name=name,
            partitions=[PartitionEntry.from_dict(p, f"{where} topic {name!r}") for p in parts],
            extra={k: v for k, v in d.items() if k not in ("name", "partitions")},
        )


def summarize(topics: dict[str, list[PartitionEntry]], uncompressed_bytes: int) -> tuple[dict, dict]:
    """``statistics`` and ``time_range`` of a manifest, derived from its segment indexes (§3)."""
    segs = [s for parts in topics.values() for p in parts for s in p.segment_index or []]
    mins = [s.min_timestamp for s in segs if s.min_timestamp is not None]
    maxs = [s.max_timestamp for s in segs if s.max_timestamp is not None]
    statistics = {
        "topics": len(topics),
        "partitions": sum(len(p) for p in topics.values()),
        "segments": len(segs),
        "records": sum(s.records for s in segs),
        "uncompressed_bytes": uncompressed_bytes,
        "compressed_bytes": sum(s.size_bytes for s in segs),
    }
    time_range = {"earliest_timestamp": min(mins) if mins else None,
                  "latest_timestamp": max(maxs) if maxs else None}
    return statistics, time_range


@dataclass
class Manifest:
    """A parsed ``manifest.json``. Unknown fields survive a parse/serialise round trip."""

    backup_id: str
    created_at: str
    completed_at: str
    compression: dict
    statistics: dict
    time_range: dict
    topics: list[TopicEntry]
    source_cluster: dict | None = None
    version: str = WRITE_VERSION
    extra: dict = field(default_factory=dict)

    _KEYS = ("version", "backup_id", "created_at", "completed_at", "source_cluster", "compression",
             "statistics", "time_range", "topics")

    @property
    def has_index(self) -> bool:
        return all(p.segment_index is not None for t in self.topics for p in t.partitions)

    def topic(self, name: str) -> TopicEntry:
        for t in self.topics:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "version": self.version,
            "backup_id": self.backup_id,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "source_cluster": self.source_cluster,
            "compression": self.compression,
            "statistics": self.statistics,
            "time_range": self.time_range,
            "topics": [t.to_dict() for t in self.topics],
        }

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str, path: str | None = None) -> Manifest:
        """Parse and check a manifest; errors name ``path``."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"not valid UTF-8 JSON: {e}", path) from e
        if not isinstance(doc, dict):
            raise ManifestError("manifest must be a JSON object", path)
        try:
            return cls.from_dict(doc)
        except InvalidNameError as e:
            raise InvalidNameError(f"{path}: {e}" if path else str(e)) from e
        except ManifestError as e:
            raise type(e)(str(e), path) from e

    @classmethod
    def from_dict(cls, doc: dict) -> Manifest:
        version = _get(doc, "version", str, "manifest")
        major, _, _minor = version.partition(".")
        if not major.isdigit():
            raise ManifestError(f"manifest version {version!r} is not MAJOR.MINOR")
        if int(major) != SUPPORTED_MAJOR:
            raise UnsupportedVersionError(
                f"manifest version {version} is not supported: this reader understands {SUPPORTED_MAJOR}.x "
                "(upgrade fsspec-kbs to read it)"
            )
        backup_id = _get(doc, "backup_id", str, "manifest")
        try:
            check_backup_id(backup_id)
        except InvalidNameError as e:
            raise InvalidNameError(f"manifest: {e}") from e
        comp = _get(doc, "compression", dict, "manifest")
        if comp.get("algorithm") not in ("none", "lz4", "zstd"):
            raise ManifestError(f"manifest: unknown compression algorithm {comp.get('algorithm')!r}")
        topics = [TopicEntry.from_dict(t, "manifest") for t in _get(doc, "topics", list, "manifest")]
        names = [t.name for t in topics]
        if len(set(names)) != len(names):
            raise ManifestError("manifest: a topic is listed twice")
        return cls(
            version=version,
            backup_id=backup_id,
            created_at=_get(doc, "created_at", str, "manifest"),
            completed_at=_get(doc, "completed_at", str, "manifest"),
            source_cluster=doc.get("source_cluster"),
            compression=comp,
            statistics=_get(doc, "statistics", dict, "manifest"),
            time_range=_get(doc, "time_range", dict, "manifest"),
            topics=topics,
            extra={k: v for k, v in doc.items() if k not in cls._KEYS},
        )
