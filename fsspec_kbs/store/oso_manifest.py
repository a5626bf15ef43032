"""The OSO kafka-backup tool's ``manifest.json`` (oso-native-format.md), as a typed model.

Parsed like the KBS manifest (:mod:`~fsspec_kbs.store.manifest_json`: strict JSON, then a
:mod:`msgspec` schema); unknown fields are ignored, as that format asks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from fsspec_kbs.errors import InvalidNameError, ManifestError
from fsspec_kbs.format.oso import OSO_CODEC_NAMES
from fsspec_kbs.store import manifest_json
from fsspec_kbs.store.names import TOPICS_DIR, check_topic

I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
U63 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class OsoSegmentEntry(msgspec.Struct):
    key: str
    start_offset: U63
    end_offset: U63
    record_count: U63
    # Absent in some manifests (then unknown: None after parsing), but never null or of
    # another type: msgspec.UNSET tells the two apart.
    start_timestamp: I64 | None | msgspec.UnsetType = msgspec.UNSET
    end_timestamp: I64 | None | msgspec.UnsetType = msgspec.UNSET
    uncompressed_size: U63 | None | msgspec.UnsetType = msgspec.UNSET
    compressed_size: U63 | None | msgspec.UnsetType = msgspec.UNSET

    _OPTIONAL = ("start_timestamp", "end_timestamp", "uncompressed_size", "compressed_size")


class OsoGap(msgspec.Struct):
    start_offset: I64 | None = None
    end_offset: I64 | None = None
    reason: str | None = None
    detected_at: Any = None


class OsoPartitionEntry(msgspec.Struct):
    partition_id: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
    segments: list[OsoSegmentEntry]
    gaps: list[OsoGap] | None = None

    @property
    def records(self) -> int:
        return sum(s.record_count for s in self.segments)


class OsoTopicEntry(msgspec.Struct):
    name: str
    partitions: list[OsoPartitionEntry]


class OsoManifest(msgspec.Struct):
    """A parsed OSO manifest; ``path`` is where it was read from."""

    backup_id: str
    created_at: I64
    topics: list[OsoTopicEntry]
    compression: Literal[tuple(OSO_CODEC_NAMES.values())] | None = None  # type: ignore[valid-type]
    source_cluster_id: str | None = None
    source_brokers: list[str] | None = None
    path: str = ""

    @property
    def statistics(self) -> dict[str, int]:
        segs = [s for t in self.topics for p in t.partitions for s in p.segments]
        return {
            "topics": len(self.topics),
            "partitions": sum(len(t.partitions) for t in self.topics),
            "segments": len(segs),
            "records": sum(s.record_count for s in segs),
            "uncompressed_bytes": sum(s.uncompressed_size or 0 for s in segs),
            "compressed_bytes": sum(s.compressed_size or 0 for s in segs),
        }

    @classmethod
    def parse(cls, raw: bytes | str, path: str) -> OsoManifest:
        """Parse and check; every defect is a :class:`ManifestError` naming ``path``."""
        doc = manifest_json.loads(raw, path)
        if not is_oso_manifest(doc):
            raise ManifestError("not an OSO kafka-backup manifest", path)
        m = manifest_json.convert({**doc, "path": path}, cls, path)
        m._check(path)
        return m

    def _check(self, path: str) -> None:
        names = [t.name for t in self.topics]
        for t in self.topics:
            try:
                check_topic(t.name)
            except InvalidNameError as e:
                raise ManifestError(f"topics: {e}", path) from e
            if names.count(t.name) > 1:
                raise ManifestError(f"topic {t.name!r} is listed twice", path)
            ids = [p.partition_id for p in t.partitions]
            for p in t.partitions:
                if ids.count(p.partition_id) > 1:
                    raise ManifestError(f"topic {t.name}: partition {p.partition_id} is listed twice", path)
                prev = None
                for si, s in enumerate(p.segments):
                    where = f"{t.name}/{p.partition_id} segments[{si}]"
                    for name in s._OPTIONAL:
                        value = getattr(s, name)
                        if value is None:
                            raise ManifestError(f"{where}: {name} is null (leave it out when unknown)", path)
                        if value is msgspec.UNSET:
                            setattr(s, name, None)
                    if s.key.startswith("/") or ".." in s.key.split("/") or "\\" in s.key or "\0" in s.key:
                        raise ManifestError(f"{where}: illegal segment key {s.key!r}", path)
                    if f"/{TOPICS_DIR}/{t.name}/partition={p.partition_id}/segment-" not in f"/{s.key}":
                        raise ManifestError(f"{where}: key {s.key!r} is not a segment of {t.name}/{p.partition_id} "
                                            f"(expected …/{TOPICS_DIR}/{t.name}/partition={p.partition_id}/segment-…)",
                                            path)
                    if s.record_count and (s.end_offset < s.start_offset
                                           or s.end_offset - s.start_offset + 1 < s.record_count):
                        raise ManifestError(f"{where}: offsets {s.start_offset}…{s.end_offset} with "
                                            f"{s.record_count} records", path)
                    if prev is not None and s.start_offset <= prev:
                        raise ManifestError(f"{where}: start offset {s.start_offset} is not above the previous "
                                            f"segment's end offset {prev} (segments must be in offset order)",
                                            path)
                    prev = s.end_offset


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
