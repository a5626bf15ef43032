"""Planning a read on the driver: which segments, which offsets, which input partitions.

Reads ``manifest.json`` once (:func:`open_for_planning`), keeps the segments that can match the
options and pushed filters, finds the offsets of timestamp options in the data
(:func:`first_offset_at`), cuts large or bounded indexed segments into batch runs
(:func:`split_by_batches`) and groups the pieces into input partitions
(:func:`input_partitions`). Used by the batch reader (:func:`plan`) and by each micro-batch of
the stream reader.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import BackupNotFoundError, KbsError
from fsspec_kbs.filters import ScanFilter
from fsspec_kbs.format.batch_index import BatchIndex
from fsspec_kbs.spark.options import KbsOptions
from fsspec_kbs.spark.partition import BatchRun, KbsSegmentPartition, SegmentPiece, group_pieces
from fsspec_kbs.store import Backup, KbsBackup, SegmentRef
from fsspec_kbs.store.batch_index import read_runs
from fsspec_kbs.store.layout import read_manifest_bytes, resolve
from fsspec_kbs.store.open import backup_class, layout_of


def open_for_planning(o: KbsOptions) -> tuple[Backup, int | None]:
    """The backup and the CRC-32 of the ``manifest.json`` bytes it was parsed from (None: none)."""
    fs, path = resolve(o.path, o.storage_options)
    raw = read_manifest_bytes(fs, path)
    crc = None if raw is None else zlib.crc32(raw)
    if raw is None:
        layout = layout_of(fs, path, raw)
    else:
        # Parsed once as KBS (the layout check would parse a big manifest a second time);
        # only a manifest KBS refuses is looked at for another layout.
        try:
            return KbsBackup.from_storage(fs, path, raw, o.path, o.storage_options, o.allow_incomplete), crc
        except KbsError:
            layout = layout_of(fs, path, raw)
            if layout == KbsBackup.layout:
                raise
    return backup_class(layout).from_storage(fs, path, raw, o.path, o.storage_options, o.allow_incomplete), crc


def first_offset_at(backup: Backup, refs: list[SegmentRef], ts: int, verify: bool = True) -> int | None:
    """The first offset (in offset order) of a record with ``timestamp >= ts`` among one
    partition's ``refs``, or None: what Kafka's ``offsetsForTimes`` answers.

    Segments whose batch index confirms a max timestamp below ``ts`` are not opened; in the
    others only the batches that may match are read where the index allows.
    """
    for ref in backup.check_time_bounds(refs):
        if ref.time_checked and ref.max_timestamp is not None and ref.max_timestamp < ts:
            continue
        index = backup.batch_index(ref) if verify else None
        if index is not None:
            # One batch at a time, in offset order, among those whose max timestamp reaches ts:
            # with increasing timestamps the first one read holds the answer.
            chunks = (cols for i in np.flatnonzero(index.max_ts >= ts)
                      for cols in read_runs(backup, ref, index, [(int(i), int(i) + 1)], verify))
        else:
            chunks = backup.iter_columns(ref, verify_checksums=verify, bounds=(None, None, ts, None))
        for cols in chunks:
            hit = np.flatnonzero(cols.timestamps >= ts)
            if len(hit):
                return int(cols.offsets[hit[0]])
    return None


def starting_offset_at(backup: Backup, refs: list[SegmentRef], key: tuple[str, int], ts: int,
                       o: KbsOptions, latest: int | None) -> int | None:
    """Where a read of partition ``key`` (its ``refs``) starts for the starting timestamp
    ``ts``: the first offset at or after it; when there is none, ``latest`` with
    ``startingOffsetsByTimestampStrategy=latest``, else an error (as the Kafka source)."""
    found = first_offset_at(backup, refs, ts, o.verify_checksums)
    if found is not None:
        return found
    if o.by_timestamp_strategy == "error":
        raise ValueError(
            f"no record of {key[0]}/{key[1]} has a timestamp at or after {ts} (the starting timestamp), so "
            "there is no offset to start from; set startingOffsetsByTimestampStrategy=latest to start at "
            "its latest offset instead (nothing of this partition is read before new records)")
    return latest


def _cut(p: SegmentPiece, start_time: int | None, end_time: int | None) -> bool:
    """The piece's bounds leave part of its segment out (or may: unknown extents)."""
    r = p.ref
    return ((p.start is not None and (r.first_offset is None or p.start > r.first_offset))
            or (p.end is not None and (r.last_offset is None or p.end <= r.last_offset))
            or (start_time is not None and (r.min_timestamp is None or start_time > r.min_timestamp))
            or (end_time is not None and (r.max_timestamp is None or end_time <= r.max_timestamp)))


def _batch_runs(p: SegmentPiece, index: BatchIndex, max_bytes: int, start_time: int | None,
                end_time: int | None) -> Iterator[SegmentPiece]:
    """``p`` as runs of whole batches of ``index`` of at most ``max_bytes`` stored bytes (one
    batch at least), among the batches that may hold a record in its bounds."""
    for first, stop in index.select(p.start, p.end, start_time, end_time):
        a = first
        while a < stop:
            # The first batch whose end passes max_bytes past this run's start ends it.
            b = int(index.end.searchsorted(index.position[a] + max_bytes, "right"))
            b = min(max(b, a + 1), stop)
            end_off = int(index.base[b]) if b < len(index) else None
            run = BatchRun((a, b), (int(index.position[a]), int(index.end[b - 1])), (int(index.base[a]), end_off))
            yield replace(p, run=run)
            a = b


def split_by_batches(backup: Backup, pieces: list[SegmentPiece], max_bytes: int,
                     start_time: int | None, end_time: int | None) -> list[SegmentPiece]:
    """Pieces of segments larger than ``max_bytes``, or bounded by offsets or times, cut into
    runs of whole batches of at most ``max_bytes`` stored bytes (one batch at least) by the
    segment's batch index; only the batches that may hold a record in the piece's bounds are
    kept, so a task fetches exactly those bytes. Segments without a usable index stay whole."""
    big = {p.ref.path: p.ref for p in pieces if p.ref.index_crc32 is not None and p.ref.size_bytes is not None
           and (p.weight() > max_bytes or _cut(p, start_time, end_time))}
    if not big:
        return pieces
    # Reads all their indexes at once where the store can; a bad index: that segment is read
    # whole, and its task reports what is wrong.
    with contextlib.suppress(KbsError):
        backup.check_time_bounds(list(big.values()))
    out: list[SegmentPiece] = []
    for p in pieces:
        try:
            index = backup.batch_index(p.ref) if p.ref.path in big else None
        except KbsError:
            index = None
        if index is None or not len(index):
            out.append(p)
        else:
            out.extend(_batch_runs(p, index, max_bytes, start_time, end_time))
    return out


def _missing(what: str, name: str, url: str) -> BackupNotFoundError:
    return BackupNotFoundError(
        f"{what} (option {name!r}) is not in the backup at {url}; set failOnDataLoss=false "
        "to read what the backup has instead")


#: (first offset, next offset) of each topic-partition of a backup; None: unknown (a 1.0 manifest).
Extents = dict[tuple[str, int], tuple[int | None, int | None]]


def _check_requested(o: KbsOptions, extents: Extents) -> None:
    """``failOnDataLoss``: every partition the options name is in the backup."""
    topics = {t for t, _ in extents}
    for t in o.topics or ():
        if t not in topics:
            raise _missing(f"topic {t!r}", "subscribe", o.path)
    for t, p in o.assign or ():
        if (t, p) not in extents:
            raise _missing(f"partition {t}/{p}", "assign", o.path)
    for name, doc in (("startingOffsets", o.starting_offsets), ("endingOffsets", o.ending_offsets),
                      ("startingOffsetsByTimestamp", o.starting_offsets_by_timestamp),
                      ("endingOffsetsByTimestamp", o.ending_offsets_by_timestamp)):
        for t, parts in doc.items():
            for p in parts:
                if (t, int(p)) not in extents:
                    raise _missing(f"partition {t}/{p}", name, o.path)


def _check_offsets(o: KbsOptions, extents: Extents) -> None:
    """``failOnDataLoss``: offsets asked for by ``startingOffsets``/``endingOffsets`` are in
    the backup (from its earliest offset to one past its latest)."""
    for name, doc in (("startingOffsets", o.starting_offsets), ("endingOffsets", o.ending_offsets)):
        for t, parts in doc.items():
            for p, off in parts.items():
                lo, hi = extents.get((t, int(p)), (None, None))
                if off < 0 or lo is None or hi is None:
                    continue
                if off < lo or off > hi:
                    raise BackupNotFoundError(
                        f"option {name!r} asks for offset {off} of {t}/{p}, but the backup at {o.path} "
                        f"holds offsets {lo} to {hi - 1} of it: offsets "
                        f"{f'{off} to {lo - 1}' if off < lo else f'{hi} to {off - 1}'} are not in the "
                        "backup; set failOnDataLoss=false to read what it has")


def refs_by_partition(backup: Backup) -> tuple[dict[tuple[str, int], list[SegmentRef]], Extents]:
    """The backup's refs per topic-partition (in the manifest's order), and each partition's
    extent (None where a ref has no offsets: a 1.0 manifest)."""
    by_part: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in backup.segments():
        by_part.setdefault((ref.topic, ref.partition), []).append(ref)
    extents: Extents = {}
    for key, refs in by_part.items():
        firsts = [r.first_offset for r in refs]
        lasts = [r.last_offset for r in refs]
        extents[key] = (None if None in firsts else min(firsts),  # type: ignore[type-var]
                        None if None in lasts else max(lasts) + 1)  # type: ignore[type-var, operator]
    return by_part, extents


def _time_ranges(backup: Backup, o: KbsOptions, sf: ScanFilter,
                 by_part: dict[tuple[str, int], list[SegmentRef]],
                 extents: Extents) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """The offset range of each partition read that the timestamp options give (found in the data)."""
    ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for (t, p), refs in sorted(by_part.items()):
        if not (sf.wants_partition(t, p) and o.wants(t, p)):
            continue
        start_ts, end_ts = o.starting_time(t, p), o.ending_time(t, p)
        start = end = None
        if start_ts is not None:  # none found with strategy latest: nothing of this partition
            start = starting_offset_at(backup, refs, (t, p), start_ts, o, extents[(t, p)][1])
        if end_ts is not None:
            end = first_offset_at(backup, refs, end_ts, o.verify_checksums)  # None: latest
        if start is not None or end is not None:
            ranges[(t, p)] = (start, end)
    return ranges


def input_partitions(backup: Backup, pieces: list[SegmentPiece], o: KbsOptions, start_time: int | None,
                     end_time: int | None, manifest_crc32: int | None) -> list[KbsSegmentPartition]:
    """``pieces`` grouped as the options say into input partitions (of a read or a micro-batch);
    each piece carries the bound on its segment's decompressed size that the manifest gives
    (:meth:`Backup.max_uncompressed`: an OSO segment's; None for KBS, whose batches bound themselves)."""
    pieces = [p if (limit := backup.max_uncompressed(p.ref)) is None else replace(p, limit=limit) for p in pieces]
    return [KbsSegmentPartition(i, tuple(group), start_time, end_time, backup.layout, manifest_crc32)
            for i, group in enumerate(group_pieces(pieces, o))]


def plan(backup: Backup, o: KbsOptions, pushed: ScanFilter,
         manifest_crc32: int | None = None) -> list[KbsSegmentPartition]:
    """The input partitions of a read: the segments that may match (manifest only), offsets
    found for the timestamp options, grouped as the options say."""
    sf = o.scan_filter().and_(pushed)
    if sf.start_time is not None and sf.end_time is not None and sf.start_time >= sf.end_time:
        return []
    by_part, extents = refs_by_partition(backup)
    if o.fail_on_data_loss:
        _check_requested(o, extents)
        _check_offsets(o, extents)
    if o.time_lookups:
        sf = sf.and_(ScanFilter(offset_ranges=_time_ranges(backup, o, sf, by_part, extents)))
    pieces = [SegmentPiece(ref, *sf.bounds(ref.topic, ref.partition))
              for ref in KbsDataset(backup, sf).fragments() if o.wants(ref.topic, ref.partition)]
    if o.verify_checksums:
        # A batch-range read checks batch CRCs: never unchecked. (Only segments with a batch
        # index are cut: none of an OSO backup's.)
        pieces = split_by_batches(backup, pieces, o.max_partition_bytes, sf.start_time, sf.end_time)
    return input_partitions(backup, pieces, o, sf.start_time, sf.end_time, manifest_crc32)
