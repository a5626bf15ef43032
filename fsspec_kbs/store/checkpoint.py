"""``checkpoints/checkpoint.json``: progress of a running or resumable backup (kbs-format.md §4)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fsspec_kbs.errors import ManifestError
from fsspec_kbs.store.names import check_partition, check_topic


@dataclass
class PartitionProgress:
    offset: int  # last offset durably written
    timestamp: int | None
    segment: str  # the segment file being written (or last completed)
    segment_offset: int  # durable byte length of that file

    def to_dict(self) -> dict:
        return {"offset": self.offset, "timestamp": self.timestamp, "segment": self.segment,
                "segment_offset": self.segment_offset}


@dataclass
class Checkpoint:
    backup_id: str
    timestamp: str
    topics: dict[str, dict[int, PartitionProgress]] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            **self.extra,
            "backup_id": self.backup_id,
            "timestamp": self.timestamp,
            "topics": {t: {str(p): pp.to_dict() for p, pp in sorted(parts.items())}
                       for t, parts in sorted(self.topics.items())},
        }
        return (json.dumps(doc, indent=2) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str, path: str | None = None) -> Checkpoint:
        try:
            doc = json.loads(data)
            topics = {}
            for t, parts in doc["topics"].items():
                check_topic(t)
                topics[t] = {
                    check_partition(p): PartitionProgress(
                        int(v["offset"]), v.get("timestamp"), str(v["segment"]), int(v["segment_offset"])
                    )
                    for p, v in parts.items()
                }
            return cls(
                backup_id=str(doc["backup_id"]),
                timestamp=str(doc["timestamp"]),
                topics=topics,
                extra={k: v for k, v in doc.items() if k not in ("backup_id", "timestamp", "topics")},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"invalid checkpoint: {e!r}", path) from e
