"""Adopt segments encoded elsewhere (a staging area) into a backup, then commit them.

Distributed writers (the Spark data source) have each task encode segments under the job's
staging directory inside the backup; one driver-side :class:`SegmentAdopter` then lists them,
in (topic, partition, offset) order, as moves of its commit record. The commit protocol
(:mod:`fsspec_kbs.store.txn`) moves them all at once (batched on object stores) and publishes
the manifest; a driver dying mid-commit leaves a record that the next writer or
``kbs repair`` finishes.
"""

from __future__ import annotations

from dataclasses import replace

from fsspec_kbs.errors import OffsetOrderError
from fsspec_kbs.format import SegmentReader, SegmentStats
from fsspec_kbs.store.names import check_partition, check_topic
from fsspec_kbs.store.writer import BackupWriter, WrittenSegment


class SegmentAdopter(BackupWriter):
    """A :class:`BackupWriter` that can also take whole segments already written elsewhere.

    Staged segments must use this writer's codec (the manifest names one codec per backup).
    Adopted and rewritten segments of one partition must come in offset order; mixing them
    with :meth:`write_columns` is allowed and keeps the order of the calls.
    """

    def adopt_segment(self, topic: str, partition: int, staged_path: str, stats: SegmentStats,
                      index_crc32: int | None = None) -> WrittenSegment:
        """Make a staged segment file (inside the backup) the partition's next segment at commit.

        ``index_crc32`` is the CRC-32 of its batch index, staged beside it (the staging
        writer's :attr:`WrittenSegment.index_crc32`): the index is moved with the segment and
        named in the manifest. None adopts the segment without an index. Both files are
        checked (size and CRC) when the commit moves them.

        Raises
        ------
        OffsetOrderError
            When the segment's first offset is not above what the partition already holds
            (e.g. appending records whose offsets would go backwards).
        """
        self._check_open()
        check_topic(topic)
        check_partition(partition)
        self._flush_partition_if_any(topic, partition)
        part = self._part(topic, partition)
        if stats.first_offset <= part.last_offset:
            raise OffsetOrderError(
                f"segment {staged_path} of {topic}/{partition} starts at offset {stats.first_offset}, "
                f"not above the partition's last offset {part.last_offset}: offsets must keep "
                "increasing per partition (also across appends)")
        written = WrittenSegment(topic, partition, len(part.new), staged_path, stats, index_crc32)
        part.last_offset = stats.last_offset
        part.uncompressed += stats.uncompressed_bytes
        part.new.append(written)  # numbered and moved at commit, with the others
        self._written.append(written)
        return written

    def rewrite_segment(self, topic: str, partition: int, staged_path: str, shift: int,
                        verify_checksums: bool = True) -> None:
        """Decode a staged segment, add ``shift`` to every offset and write the records here.

        Used when records got provisional offsets in the staging area; the output is rolled
        into segments by this writer's own limits, with new batch indexes (the staged one's
        offsets are the provisional ones). The staged file is left for the caller
        to delete with the rest of the staging area.
        """
        self._check_open()
        reader = SegmentReader(self.fs.cat_file(staged_path), staged_path, verify_checksums)
        for cols in reader.iter_columns():
            if len(cols):
                self.write_columns(topic, partition, replace(cols, offsets=cols.offsets + shift))

    def _flush_partition_if_any(self, topic: str, partition: int) -> None:
        if (topic, partition) in self._parts:
            self._flush_partition(topic, partition)
