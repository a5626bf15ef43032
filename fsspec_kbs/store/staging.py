"""Adopt segments encoded elsewhere (a staging area) into a backup, then publish its manifest.

Distributed writers (the Spark data source) have each task encode segments under a staging
directory; one driver-side :class:`SegmentAdopter` then moves them to their final names in
(topic, partition, offset) order and writes the manifest last, atomically, like any
:class:`~fsspec_kbs.store.writer.BackupWriter` commit.
"""

from __future__ import annotations

from dataclasses import replace

from fsspec_kbs.errors import OffsetOrderError
from fsspec_kbs.format import SegmentReader, SegmentStats
from fsspec_kbs.store.names import check_partition, check_topic, partition_dir, segment_name
from fsspec_kbs.store.writer import BackupWriter, WrittenSegment, _Partition


class SegmentAdopter(BackupWriter):
    """A :class:`BackupWriter` that can also take whole segments already written elsewhere.

    Staged segments must use this writer's codec (the manifest names one codec per backup).
    Adopted and rewritten segments of one partition must come in offset order; mixing them
    with :meth:`write_columns` is allowed and keeps the order of the calls.
    """

    def adopt_segment(self, topic: str, partition: int, staged_path: str, stats: SegmentStats) -> WrittenSegment:
        """Move a staged segment file to the partition's next ``segment-NNNNNNNN.kbs`` name.

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
        seq = part.next_seq
        final = f"{partition_dir(self.path, topic, partition)}/{segment_name(seq)}"
        self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(staged_path, final)
        part.next_seq += 1
        part.last_offset = stats.last_offset
        part.uncompressed += stats.uncompressed_bytes
        written = WrittenSegment(topic, partition, seq, final, stats)
        part.written.append(written.entry())
        self._written.append(written)
        return written

    def rewrite_segment(self, topic: str, partition: int, staged_path: str, shift: int,
                        verify_checksums: bool = True) -> None:
        """Decode a staged segment, add ``shift`` to every offset and write the records here.

        Used when records got provisional offsets in the staging area; the output is rolled
        into segments by this writer's own limits. The staged file is left for the caller
        to delete with the rest of the staging area.
        """
        self._check_open()
        reader = SegmentReader(self.fs.cat_file(staged_path), staged_path, verify_checksums)
        for cols in reader.iter_columns():
            if len(cols):
                self.write_columns(topic, partition, replace(cols, offsets=cols.offsets + shift))

    def _part(self, topic: str, partition: int) -> _Partition:
        return self._parts.setdefault((topic, partition), _Partition())

    def _flush_partition_if_any(self, topic: str, partition: int) -> None:
        if (topic, partition) in self._parts:
            self._flush_partition(topic, partition)
