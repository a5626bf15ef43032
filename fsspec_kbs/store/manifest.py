"""The ``manifest.json`` model (kbs-format.md §3): parse with checks, serialise, preserve extras.

Parsing is strict JSON (:mod:`~fsspec_kbs.store.manifest_json`), then a typed :mod:`msgspec`
schema (types and ranges, errors naming the field), then the facts that tie fields together
(counts, offsets and time ranges of segments, partitions and the whole backup). What the
manifest claims about the segment files themselves is checked against them as they are read
(see docs/format-decisions.md, "What is cross-checked where").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

import msgspec

from fsspec_kbs.errors import InvalidNameError, ManifestError, UnsupportedVersionError
from fsspec_kbs.format.codecs import CODEC_BY_NAME
from fsspec_kbs.store import manifest_json
from fsspec_kbs.store.names import check_backup_id, check_topic, parse_segment_name

WRITE_VERSION = "1.2"
SUPPORTED_MAJOR = 1

# Ranges of the fields (kbs-format.md: offsets and sizes are unsigned, Kafka's offsets < 2^63).
U63 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# msgspec bounds must fit int64: the CRC-64 is checked against 2^64 - 1 by hand.
U64 = Annotated[int, msgspec.Meta(ge=0)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
PartitionId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
#: A segment file is at least its header and footer.
MIN_SEGMENT_BYTES = 48


class _SegmentDoc(msgspec.Struct):
    file: str
    first_offset: U63
    last_offset: U63
    records: U63
    min_timestamp: I64 | None
    max_timestamp: I64 | None
    size_bytes: Annotated[int, msgspec.Meta(ge=MIN_SEGMENT_BYTES, le=2**63 - 1)]
    crc64: U64
    index_crc32: U32 | None = None


class _PartitionDoc(msgspec.Struct):
    partition: PartitionId
    first_offset: U63
    last_offset: U63
    records: U63
    segments: U63
    segment_index: list[_SegmentDoc] | None = None


class _TopicDoc(msgspec.Struct):
    name: str
    partitions: list[_PartitionDoc]


class _CompressionDoc(msgspec.Struct):
    algorithm: Literal[tuple(CODEC_BY_NAME)]  # type: ignore[valid-type]  # the codec registry's names
    level: Any = None  # the writer's setting: nothing a reader does depends on it


class _StatisticsDoc(msgspec.Struct):
    topics: U63
    partitions: U63
    segments: U63
    records: U63
    uncompressed_bytes: U63
    compressed_bytes: U63


class _TimeRangeDoc(msgspec.Struct):
    earliest_timestamp: I64 | None
    latest_timestamp: I64 | None


class _ManifestDoc(msgspec.Struct):
    version: str
    backup_id: str
    created_at: str
    completed_at: str
    compression: _CompressionDoc
    statistics: _StatisticsDoc
    time_range: _TimeRangeDoc
    topics: list[_TopicDoc]
    source_cluster: Any = None  # {cluster_id, bootstrap_servers} by §3; nothing read depends on it


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _extra(d: dict, known: tuple[str, ...]) -> dict:
    return {k: v for k, v in d.items() if k not in known}


@dataclass
class SegmentEntry:
    """One ``segment_index`` entry (1.1; ``index_crc32`` is 1.2's, for the batch index)."""

    file: str
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int | None
    max_timestamp: int | None
    size_bytes: int
    crc64: int
    extra: dict = field(default_factory=dict)
    index_crc32: int | None = None

    _KEYS = ("file", "first_offset", "last_offset", "records", "min_timestamp", "max_timestamp",
             "size_bytes", "crc64", "index_crc32")

    def to_dict(self) -> dict:
        d = {**self.extra, **{k: getattr(self, k) for k in self._KEYS}}
        if self.index_crc32 is None:
            del d["index_crc32"]
        return d

    @classmethod
    def _from_doc(cls, doc: _SegmentDoc, raw: dict, where: str, seq: int) -> SegmentEntry:
        try:
            if parse_segment_name(doc.file) != seq:
                raise ManifestError(f"{where}: names {doc.file}, expected sequence {seq}")
        except InvalidNameError as e:
            raise InvalidNameError(f"{where}: {e}") from e
        if doc.crc64 >= 2**64:
            raise ManifestError(f"{where}: crc64 {doc.crc64} does not fit 64 bits")
        if doc.records == 0:
            raise ManifestError(f"{where}: a segment holds at least one record")
        if doc.last_offset < doc.first_offset or doc.last_offset - doc.first_offset + 1 < doc.records:
            raise ManifestError(f"{where}: {doc.records} records cannot have offsets "
                                f"{doc.first_offset} … {doc.last_offset}")
        if (doc.min_timestamp is None) != (doc.max_timestamp is None) or (
                doc.min_timestamp is not None and doc.max_timestamp is not None
                and doc.min_timestamp > doc.max_timestamp):
            raise ManifestError(f"{where}: min_timestamp {doc.min_timestamp} and max_timestamp "
                                f"{doc.max_timestamp} are not a time range")
        return cls(doc.file, doc.first_offset, doc.last_offset, doc.records, doc.min_timestamp,
                   doc.max_timestamp, doc.size_bytes, doc.crc64, _extra(raw, cls._KEYS), doc.index_crc32)


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
    def _from_doc(cls, doc: _PartitionDoc, raw: dict, where: str) -> PartitionEntry:
        where = f"{where} partition {doc.partition}"
        index = None
        if doc.segment_index is not None:
            index = [SegmentEntry._from_doc(s, r, f"{where} segment_index[{i}]", i)
                     for i, (s, r) in enumerate(zip(doc.segment_index, raw["segment_index"], strict=True))]
        entry = cls(doc.partition, doc.first_offset, doc.last_offset, doc.records, doc.segments,
                    index, _extra(raw, cls._KEYS))
        entry._check(where)
        return entry

    def _check(self, where: str) -> None:
        """The partition's numbers agree with each other and with its segment_index."""
        if self.segments > self.records:
            raise ManifestError(f"{where}: {self.segments} segments cannot hold {self.records} records "
                                "(a segment holds at least one)")
        if self.records and (self.last_offset < self.first_offset
                             or self.last_offset - self.first_offset + 1 < self.records):
            raise ManifestError(f"{where}: {self.records} records cannot have offsets "
                                f"{self.first_offset} … {self.last_offset}")
        if self.records and not self.segments:
            raise ManifestError(f"{where}: {self.records} records but no segment")
        index = self.segment_index
        if index is None:
            return
        if len(index) != self.segments:
            raise ManifestError(f"{where}: segments = {self.segments} but segment_index has {len(index)} entries")
        for prev, seg in zip(index, index[1:], strict=False):
            if seg.first_offset <= prev.last_offset:
                raise ManifestError(f"{where}: {seg.file} starts at offset {seg.first_offset}, not above "
                                    f"{prev.file}'s last offset {prev.last_offset}")
        if index:
            for what, mine, theirs in (("records", self.records, sum(s.records for s in index)),
                                       ("first_offset", self.first_offset, index[0].first_offset),
                                       ("last_offset", self.last_offset, index[-1].last_offset)):
                if mine != theirs:
                    raise ManifestError(f"{where}: {what} is {mine} but its segment_index says {theirs}")


@dataclass
class TopicEntry:
    name: str
    partitions: list[PartitionEntry]
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.extra, "name": self.name, "partitions": [p.to_dict() for p in self.partitions]}

    @classmethod
    def _from_doc(cls, doc: _TopicDoc, raw: dict, where: str) -> TopicEntry:
        try:
            check_topic(doc.name)
        except InvalidNameError as e:
            raise InvalidNameError(f"{where}: {e}") from e
        where = f"{where} topic {doc.name!r}"
        parts = [PartitionEntry._from_doc(p, r, where)
                 for p, r in zip(doc.partitions, raw["partitions"], strict=True)]
        ids = [p.partition for p in parts]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ManifestError(f"{where}: partition {dup} is listed twice")
        return cls(doc.name, parts, _extra(raw, ("name", "partitions")))


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

    @property
    def codec(self) -> str:
        """The backup's compression algorithm: ``"none"``, ``"lz4"`` or ``"zstd"``."""
        return str(self.compression["algorithm"])

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
        doc = manifest_json.loads(data, path)
        if not isinstance(doc, dict):
            raise ManifestError("manifest must be a JSON object", path)
        try:
            return cls.from_dict(doc, path)
        except InvalidNameError as e:
            raise InvalidNameError(f"{path}: {e}" if path else str(e)) from e
        except ManifestError as e:
            if e.path is not None:
                raise
            raise type(e)(str(e), path) from e

    @classmethod
    def from_dict(cls, doc: dict, path: str | None = None) -> Manifest:
        version = doc.get("version")
        if not isinstance(version, str):
            raise ManifestError("manifest: field 'version' is missing or not a string", path)
        major, _, minor = version.partition(".")
        if not re.fullmatch(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})", version):
            raise ManifestError(f"manifest version {version!r} is not MAJOR.MINOR", path)
        if int(major) != SUPPORTED_MAJOR:
            raise UnsupportedVersionError(
                f"manifest version {version} is not supported: this reader understands {SUPPORTED_MAJOR}.x "
                "(upgrade fsspec-kbs to read it)", path)
        m = manifest_json.convert(doc, _ManifestDoc, path)
        try:
            check_backup_id(m.backup_id)
        except InvalidNameError as e:
            raise InvalidNameError(f"manifest: {e}") from e
        topics = [TopicEntry._from_doc(t, r, f"manifest topics[{i}]")
                  for i, (t, r) in enumerate(zip(m.topics, doc["topics"], strict=True))]
        names = [t.name for t in topics]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ManifestError(f"manifest: topic {dup!r} is listed twice", path)
        manifest = cls(
            version=version,
            backup_id=m.backup_id,
            created_at=m.created_at,
            completed_at=m.completed_at,
            source_cluster=doc.get("source_cluster"),
            compression=dict(doc["compression"]),
            statistics=dict(doc["statistics"]),
            time_range=dict(doc["time_range"]),
            topics=topics,
            extra=_extra(doc, cls._KEYS),
        )
        manifest._check_totals(path)
        return manifest

    def _check_totals(self, path: str | None) -> None:
        """``statistics`` and ``time_range`` agree with the topics (1.0: with what it has)."""
        parts = [p for t in self.topics for p in t.partitions]
        claims = [("topics", len(self.topics)), ("partitions", len(parts)),
                  ("segments", sum(p.segments for p in parts)), ("records", sum(p.records for p in parts))]
        if self.has_index:
            segs = [s for p in parts for s in p.segment_index or []]
            claims.append(("compressed_bytes", sum(s.size_bytes for s in segs)))
            mins = [s.min_timestamp for s in segs if s.min_timestamp is not None]
            maxs = [s.max_timestamp for s in segs if s.max_timestamp is not None]
            for what, mine in (("earliest_timestamp", min(mins) if mins else None),
                               ("latest_timestamp", max(maxs) if maxs else None)):
                if self.time_range[what] != mine:
                    raise ManifestError(f"manifest: time_range.{what} is {self.time_range[what]} but "
                                        f"its segments say {mine}", path)
        for what, mine in claims:
            if self.statistics[what] != mine:
                raise ManifestError(f"manifest: statistics.{what} is {self.statistics[what]} but its "
                                    f"topics say {mine}", path)
