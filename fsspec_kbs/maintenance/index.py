"""Add batch indexes (kbs-format.md §7) to an existing backup: ``kbs index`` / :func:`add_indexes`.

Backups written before KBS 1.2 (or with ``BackupWriter(index=False)``) have no
``segment-NNNNNNNN.index`` files, so bounded reads decode whole segments. This reads every
segment once, checks it whole (CRC-64, every batch CRC-32, what the manifest says of it),
writes its index and commits a 1.2 manifest naming each index's ``index_crc32``, through the
commit protocol like any other write (:mod:`fsspec_kbs.store.txn`): readers see the old
manifest or the new one, never a mix, and a crash leaves the old backup readable.

Idempotent: a segment whose manifest entry already names an index is checked against that
index (which must be present, intact and agree with the segment read whole); only missing or
damaged indexes are written again. Running it twice, or twice at once, gives the same backup:
index bytes depend only on the segment. A concurrent append rebases the commit (its
segments keep whatever index they came with); a concurrent overwrite makes it fail with
:class:`~fsspec_kbs.errors.CommitConflictError` and nothing changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fsspec_kbs.errors import (
    BatchIndexError,
    CommitConflictError,
    UnsupportedLayoutError,
)
from fsspec_kbs.format.batch_index import (
    encode_index,
    parse_index,
    verify_index,
)
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.format.segment import SegmentReader
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.batch_index import index_path
from fsspec_kbs.store.commit import COMMIT_FIELD, put_file
from fsspec_kbs.store.layout import resolve
from fsspec_kbs.store.manifest import WRITE_VERSION, Manifest, SegmentEntry, summarize
from fsspec_kbs.store.names import MANIFEST, TOPICS_DIR, partition_dir, segment_name
from fsspec_kbs.store.open import open_backup
from fsspec_kbs.store.segment_ref import SegmentRef
from fsspec_kbs.store.txn import BackupState, Move, Transaction

#: ``progress(done, total, ref, action)`` after each segment; action is "indexed", "verified" or "rebuilt".
Progress = Callable[[int, int, SegmentRef, str], None]


@dataclass
class IndexReport:
    """What :func:`add_indexes` did."""

    url: str
    segments: int = 0
    #: Segments that had no index and got one.
    indexed: int = 0
    #: Segments whose index was there, intact and agreeing with the segment.
    verified: int = 0
    #: Segments whose named index was missing or damaged and was written again (why, by path).
    rebuilt: dict[str, str] = field(default_factory=dict)
    #: Commit number published (None: nothing to commit, every index was already there).
    committed: int | None = None
    version_before: str | None = None

    def to_dict(self) -> dict:
        return {"url": self.url, "segments": self.segments, "indexed": self.indexed, "verified": self.verified,
                "rebuilt": dict(self.rebuilt), "committed": self.committed, "version_before": self.version_before}


@dataclass(frozen=True)
class _Indexed:
    """A segment read whole and the index written for it (None: its own one is fine)."""

    ref: SegmentRef
    entry: SegmentEntry
    index: bytes | None
    staged: str | None


def add_indexes(url: str, storage_options: dict | None = None, *, progress: Progress | None = None,
                fs: object | None = None) -> IndexReport:
    """Write a batch index beside every segment of the KBS backup at ``url`` that lacks a
    usable one, and commit a 1.2 manifest naming them.

    Every segment is read whole and checked first; a segment that disagrees with the manifest
    stops the run (:class:`~fsspec_kbs.errors.SegmentFormatError` or
    :class:`~fsspec_kbs.errors.ManifestMismatchError`; run ``kbs validate``) with nothing
    committed. OSO-layout backups are refused: their format has no batch index.

    Returns an :class:`IndexReport`; ``committed`` is None when every segment already had a
    good index (nothing is written then).
    """
    fsys, path = resolve(url, storage_options, fs)  # type: ignore[arg-type]
    backup = open_backup(url, storage_options, fs=fsys)
    if not isinstance(backup, KbsBackup):
        raise UnsupportedLayoutError(f"{url} is an OSO kafka-backup ({backup.layout} layout): that format has no batch index; "
                       "convert it to KBS first (kbs convert SRC DST --layout kbs), which writes indexes")
    assert backup.manifest is not None
    txn = Transaction(fsys, path, url, "append")
    try:
        report = IndexReport(url, version_before=backup.manifest.version)
        if txn.base.manifest is not None and txn.base.version != _commit_of(backup):
            # A commit landed (or was rolled forward) between opening and the transaction: use its state.
            backup = KbsBackup(fsys, path, Manifest.from_json(json.dumps(txn.base.manifest), f"{path}/{MANIFEST}"), url)
        refs = backup.segments()
        report.segments = len(refs)
        done: list[_Indexed] = []
        for i, ref in enumerate(refs):
            item, action = _index_one(backup, ref, txn)
            done.append(item)
            if action == "verified":
                report.verified += 1
            elif action == "indexed":
                report.indexed += 1
            else:
                report.rebuilt[ref.path] = action.removeprefix("rebuilt: ")
                action = "rebuilt"
            if progress is not None:
                progress(i + 1, len(refs), ref, action)
        todo = [d for d in done if d.index is not None]
        if not todo and backup.manifest.version == WRITE_VERSION:
            txn.abort()
            return report
        record, _ = txn.commit(lambda state: _build(state, path, done, txn))
    except BaseException:
        txn.abort()
        raise
    report.committed = record.version
    return report


def _commit_of(backup: KbsBackup) -> int:
    assert backup.manifest is not None
    commit = backup.manifest.extra.get(COMMIT_FIELD)
    return int(commit["version"]) if isinstance(commit, dict) and "version" in commit else -1


def _index_one(backup: KbsBackup, ref: SegmentRef, txn: Transaction) -> tuple[_Indexed, str]:
    """Read ``ref`` whole and checked; keep its index if good, else stage a new one."""
    reader, entries, entry = backup.read_whole_checked(ref)  # a disagreeing segment stops the run
    action = "indexed"
    if ref.index_crc32 is not None:
        why = _existing_problem(backup, ref, reader)
        if why is None:
            return _Indexed(ref, replace(entry, index_crc32=ref.index_crc32), None, None), "verified"
        action = f"rebuilt: {why}"
    data = encode_index(entries)
    staged = f"{partition_dir(txn.staging, ref.topic, ref.partition)}/{index_path(segment_name(ref.seq))}"
    put_file(txn.fs, staged, data)
    entry.index_crc32 = crc32(data)
    return _Indexed(ref, entry, data, staged), action


def _existing_problem(backup: KbsBackup, ref: SegmentRef, reader: SegmentReader) -> str | None:
    """Why the index the manifest names cannot stay (None: present, intact, agreeing)."""
    ipath = index_path(ref.path)
    try:
        data = backup.fs.cat_file(ipath)
    except FileNotFoundError:
        return f"{ipath} is missing"
    try:
        index = parse_index(data, ipath, ref.path, len(reader.data), ref.index_crc32)
        verify_index(index, reader)
        if len(index) and index.entries["last_offset"][-1] != ref.last_offset:
            return f"{ipath}: its last offset {index.entries['last_offset'][-1]} is not the segment's"
    except BatchIndexError as e:
        return str(e)
    return None


def _build(state: BackupState, path: str, done: list[_Indexed], txn: Transaction) -> tuple[dict, list[Move]]:
    """The manifest of ``state`` with an ``index_crc32`` on each segment indexed here, as 1.2."""
    assert state.manifest is not None
    manifest = Manifest.from_json(json.dumps(state.manifest), f"{path}/{MANIFEST}")
    by_key = {(d.ref.topic, d.ref.partition, d.ref.seq): d for d in done}
    moves: list[Move] = []
    filled = False
    for topic in manifest.topics:
        for part in topic.partitions:
            mine: list[tuple[int, _Indexed]] = []
            if part.segment_index is None:
                # 1.0: no segment_index to hold index_crc32; every segment of it was read here.
                found = [by_key.get((topic.name, part.partition, seq)) for seq in range(part.segments)]
                if any(d is None for d in found):
                    raise CommitConflictError(f"{topic.name}/{part.partition}: the manifest changed while indexing; run again")
                part.segment_index = [replace(d.entry) for d in found]  # type: ignore[union-attr]
                mine = list(enumerate(found))  # type: ignore[arg-type]
                filled = True
            else:
                for seq, seg in enumerate(part.segment_index):
                    d = by_key.get((topic.name, part.partition, seq))
                    # A segment another writer appended since (or replaced) keeps what it has.
                    if d is not None and (d.entry.crc64, d.entry.size_bytes) == (seg.crc64, seg.size_bytes):
                        seg.index_crc32 = d.entry.index_crc32
                        mine.append((seq, d))
            for seq, d in mine:
                if d.index is not None and d.staged is not None:
                    final = f"{TOPICS_DIR}/{topic.name}/{part.partition}/{index_path(segment_name(seq))}"
                    moves.append(Move(txn.relative(d.staged), final, len(d.index), crc32=crc32(d.index)))
    if filled:  # 1.2 has a segment_index everywhere: statistics and time range follow from it (§3)
        statistics, time_range = summarize({t.name: t.partitions for t in manifest.topics},
                                           int(manifest.statistics.get("uncompressed_bytes") or 0))
        manifest.statistics = {**manifest.statistics, **statistics}
        manifest.time_range = {**manifest.time_range, **time_range}
    manifest.version = WRITE_VERSION
    manifest.extra = {k: v for k, v in manifest.extra.items() if k != COMMIT_FIELD}
    return json.loads(manifest.to_json()), moves
