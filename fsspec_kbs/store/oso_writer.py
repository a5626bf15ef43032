"""Writing a backup in the OSO kafka-backup tool's layout ("oso-native"; its reader is
:mod:`fsspec_kbs.store.oso_backup`), committed like every writer.

The layout follows the tool exactly (``docs/formats.md``)::

    <root>/<backup_id>/manifest.json
    <root>/<backup_id>/topics/<topic>/partition=<p>/segment-<start offset, 20 digits>.bin[.zst|.lz4]

One choice goes beyond what the tool itself writes: a KBS null header value is kept as length
-1 in the oso-native record (the record format defines -1 as null and the tool's reader accepts
it), where the tool would have written an empty value. That keeps KBS -> oso -> KBS identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import fsspec

from fsspec_kbs.errors import CommitError
from fsspec_kbs.format import RecordColumns
from fsspec_kbs.format.oso import (
    OSO_CODEC_NAMES,
    assemble,
    encode_records,
    oso_codec_from_name,
    segment_file_name,
)
from fsspec_kbs.store.commit import put_file
from fsspec_kbs.store.layout import resolve
from fsspec_kbs.store.names import (
    TOPICS_DIR,
    backup_id_of,
    check_partition,
    check_topic,
)
from fsspec_kbs.store.txn import FaultHook, Move, Transaction
from fsspec_kbs.store.writer import check_offsets, check_segment_limits

#: The tool rotates a segment once its uncompressed records reach 128 MiB.
OSO_SEGMENT_MAX_BYTES = 128 * 1024 * 1024


@dataclass
class _Pending:
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    count: int = 0
    start_offset: int = 0
    end_offset: int = 0
    start_timestamp: int = 0
    end_timestamp: int = 0
    last_offset: int = -1
    segments: list[dict] = field(default_factory=list)


class OsoBackupWriter:
    """Writes one backup in the OSO kafka-backup tool's layout, committed like every writer
    (:mod:`fsspec_kbs.store.txn`): segments staged, then one commit record, then the manifest.

    Parameters
    ----------
    url : str
        ``<root>/<backup_id>`` on any fsspec URL.
    storage_options : dict, optional
    compression : {"zstd", "lz4", "none"}, default "zstd"
    level : int, optional
        zstd level (default 3, as the tool).
    segment_max_bytes : int, default 128 MiB
        Roll a segment once its uncompressed records reach this (the tool's rule).
    segment_max_records : int, optional
        Also roll after this many records.
    overwrite : bool, default False
        Replace a backup already at ``url`` instead of refusing.
    """

    def __init__(self, url: str, storage_options: dict | None = None, *, compression: str = "zstd",
                 level: int | None = None, segment_max_bytes: int = OSO_SEGMENT_MAX_BYTES,
                 segment_max_records: int | None = None, overwrite: bool = False,
                 created_at: int | None = None, source_cluster_id: str | None = None,
                 source_brokers: list[str] | None = None,
                 fs: fsspec.AbstractFileSystem | None = None, fault: FaultHook | None = None) -> None:
        check_segment_limits(segment_max_bytes, segment_max_records)
        self.fs, self.path = resolve(url, storage_options, fs)
        self.url = url
        self.backup_id = backup_id_of(self.path)
        self.codec = oso_codec_from_name(compression)
        self.level = level
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_records = segment_max_records
        self.created_at = int(time.time() * 1000) if created_at is None else int(created_at)
        self.source_cluster_id = source_cluster_id
        self.source_brokers = list(source_brokers or [])
        self._parts: dict[tuple[str, int], _Pending] = {}
        self._written: list[str] = []
        self._moves: list[Move] = []
        self._closed = False
        # The oso-native manifest must stay exactly the tool's: the commit is marked beside it.
        self._txn = Transaction(self.fs, self.path, url, "overwrite" if overwrite else "error", fault=fault,
                                tag_manifest=False)

    def write_columns(self, topic: str, partition: int, cols: RecordColumns) -> None:
        """Append records to a partition; offsets must strictly increase."""
        self._check_open()
        check_topic(topic)
        check_partition(partition)
        n = len(cols)
        if n == 0:
            return
        part = self._parts.setdefault((topic, partition), _Pending())
        check_offsets(topic, partition, cols.offsets, part.last_offset)
        start = 0
        while start < n:
            stop = n
            if self.segment_max_records is not None:
                stop = min(n, start + self.segment_max_records - part.count)
            piece = cols.slice(start, stop) if (start, stop) != (0, n) else cols
            raw = encode_records(piece)
            if not part.count:
                part.start_offset = int(piece.offsets[0])
                part.start_timestamp = int(piece.timestamps[0])
            part.chunks.append(raw)
            part.size += len(raw)
            part.count += len(piece)
            part.end_offset = part.last_offset = int(piece.offsets[-1])
            part.end_timestamp = int(piece.timestamps[-1])
            if part.size >= self.segment_max_bytes or (
                    self.segment_max_records is not None and part.count >= self.segment_max_records):
                self.flush_partition(topic, partition)
            start = stop

    def flush_partition(self, topic: str, partition: int) -> None:
        """Write the partition's pending records as one segment."""
        part = self._parts.get((topic, partition))
        if part is None or not part.count:
            return
        raw = b"".join(part.chunks)
        data = assemble(self.codec, raw, part.count, part.start_offset, part.end_offset, self.level)
        rel = f"{TOPICS_DIR}/{topic}/partition={partition}/{segment_file_name(part.start_offset, self.codec)}"
        path = f"{self._txn.staging}/{rel}"
        put_file(self.fs, path, data)
        self._written.append(path)
        self._moves.append(Move(self._txn.relative(path), rel, len(data)))
        part.segments.append({
            "key": f"{self.backup_id}/{rel}",
            "start_offset": part.start_offset,
            "end_offset": part.end_offset,
            "start_timestamp": part.start_timestamp,
            "end_timestamp": part.end_timestamp,
            "record_count": part.count,
            "uncompressed_size": len(raw),
            "compressed_size": len(data),
        })
        part.chunks, part.size, part.count = [], 0, 0

    def flush(self) -> None:
        for key in list(self._parts):
            self.flush_partition(*key)

    @property
    def segments_written(self) -> int:
        return len(self._written)

    def build_manifest(self) -> dict[str, Any]:
        topics: dict[str, list[dict]] = {}
        for (topic, p), part in sorted(self._parts.items()):
            if part.segments:
                topics.setdefault(topic, []).append({"partition_id": p, "segments": list(part.segments)})
        return {
            "backup_id": self.backup_id,
            "created_at": self.created_at,
            "source_cluster_id": self.source_cluster_id,
            "source_brokers": self.source_brokers,
            "compression": OSO_CODEC_NAMES[self.codec],
            "topics": [{"name": name, "partitions": parts} for name, parts in sorted(topics.items())],
        }

    def commit(self) -> dict[str, Any]:
        """Write pending segments, then commit them and ``manifest.json`` (:mod:`fsspec_kbs.store.txn`)."""
        self._check_open()
        self.flush()
        manifest = self.build_manifest()
        try:
            self._txn.commit(lambda state: (manifest, list(self._moves)))
        finally:
            self._closed = True
        return manifest

    def abort(self) -> None:
        """Delete what this writer staged (no manifest was written)."""
        if self._closed:
            return
        self._closed = True
        self._txn.abort()

    def _check_open(self) -> None:
        if self._closed:
            raise CommitError("this OsoBackupWriter was already committed or aborted")
