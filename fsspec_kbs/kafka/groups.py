"""Consumer-group committed offsets: snapshot at backup time, translation at restore time.

Stored beside the manifest as ``consumer-groups-snapshot.json`` — the same name and shape the
OSO kafka-backup tool uses, so its backups' snapshots restore too::

    {"snapshot_time": <Unix ms>, "groups": [{"group_id": "g", "offsets": {"topic": {"0": 42}}}]}

Offsets are Kafka committed offsets: the next offset the group would consume.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import fsspec

from fsspec_kbs.errors import ManifestError

GROUPS_FILE = "consumer-groups-snapshot.json"


@dataclass
class GroupOffsets:
    group_id: str
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> partition -> offset

    def to_dict(self) -> dict:
        return {"group_id": self.group_id,
                "offsets": {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(self.offsets.items())}}


def snapshot_group_offsets(admin: object, topics: Iterable[str], timeout: float = 30.0) -> list[GroupOffsets]:
    """Committed offsets of every consumer group, restricted to ``topics``.

    Groups without a committed offset on those topics are left out.
    """
    from confluent_kafka import ConsumerGroupTopicPartitions

    wanted = set(topics)
    listing = admin.list_consumer_groups(request_timeout=timeout).result()  # type: ignore[attr-defined]
    out: list[GroupOffsets] = []
    for g in sorted(listing.valid, key=lambda g: g.group_id):
        # One group per request: older brokers/librdkafka accept only one.
        futs = admin.list_consumer_group_offsets(  # type: ignore[attr-defined]
            [ConsumerGroupTopicPartitions(g.group_id)], request_timeout=timeout)
        res = futs[g.group_id].result()
        offsets: dict[str, dict[int, int]] = {}
        for tp in res.topic_partitions or []:
            if tp.topic in wanted and tp.offset is not None and tp.offset >= 0 and tp.error is None:
                offsets.setdefault(tp.topic, {})[tp.partition] = int(tp.offset)
        if offsets:
            out.append(GroupOffsets(g.group_id, offsets))
    return out


def groups_json(groups: list[GroupOffsets], snapshot_time_ms: int | None = None) -> bytes:
    doc = {"snapshot_time": int(time.time() * 1000) if snapshot_time_ms is None else snapshot_time_ms,
           "groups": [g.to_dict() for g in groups]}
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def read_group_offsets(fs: fsspec.AbstractFileSystem, backup_path: str) -> list[GroupOffsets] | None:
    """The snapshot stored in a backup, or None when it has none."""
    path = f"{backup_path.rstrip('/')}/{GROUPS_FILE}"
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        return [
            GroupOffsets(str(g["group_id"]),
                         {str(t): {int(p): int(o) for p, o in ps.items()} for t, ps in (g.get("offsets") or {}).items()})
            for g in doc.get("groups") or []
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"invalid consumer-group snapshot: {e!r}", path) from e
