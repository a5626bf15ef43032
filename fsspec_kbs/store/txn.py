"""The commit protocol every writer uses: stage, claim commit n+1 create-only, roll forward, publish.

Like Delta Lake's log (docs/format-decisions.md, "Commit protocol"):

1. A :class:`Transaction` reads the backup's state (rolling forward a commit another writer
   claimed but did not publish) and checks the write mode against it.
2. The writer puts its files under its own ``_staging/<txn-id>/``: never over a file another
   writer made.
3. :meth:`Transaction.commit` claims commit ``n+1`` by creating ``_commits/NNNNNNNN.json``
   create-only. The record holds the full new manifest, the staged -> final moves (size and
   header CRC-64 of each final segment; size and whole-file CRC-32 of each batch index, which
   has no CRC-64 header) and the files to delete, so that anyone can finish it.
4. Only the creator publishes; a loser re-reads the winner's record and rebases (appends
   after appends) or raises :class:`CommitConflictError` after deleting its own staging.
5. :func:`roll_forward` applies a record idempotently: overwrite removes ``manifest.json``
   first (readers see "commit in progress", never a mix), moves what is not yet in place,
   deletes, publishes ``manifest.json`` atomically, removes the staging directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NoReturn

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fsspec_kbs.errors import CommitConflictError, CommitError, ManifestError
from fsspec_kbs.format.checksums import crc32
from fsspec_kbs.store.commit import (
    COMMIT_FIELD,
    STAGING_DIR,
    done_path,
    invalidate_tree,
    list_records,
    manifest_commit,
    put_atomic,
    put_create,
    record_path,
    require_create_only,
)
from fsspec_kbs.store.names import MANIFEST, TOPICS_DIR

#: Called with the name of each step of a commit (tests inject crashes here).
FaultHook = Callable[[str], None]
KINDS = ("create", "append", "overwrite")
#: What a writer does when a backup exists: refuse, replace it, add to it, or finish an
#: incomplete one (the writer's own, by its transaction id).
WriteMode = Literal["error", "overwrite", "append", "resume"]


@dataclass
class Move:
    """A staged file and its final name, both relative to the backup directory."""

    src: str
    dst: str
    size: int
    #: Header CRC-64 of a KBS segment (bytes 24..32); None for other files.
    crc64: int | None = None
    #: CRC-32 of the whole file: batch indexes (kbs-format.md §7), the manifest's ``index_crc32``.
    crc32: int | None = None


@dataclass
class CommitRecord:
    """``_commits/NNNNNNNN.json``: everything needed to finish commit ``version``."""

    version: int
    txn: str
    base: int
    kind: str
    manifest: dict
    moves: list[Move] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    staging: str | None = None

    def to_json(self) -> bytes:
        doc = asdict(self)
        for m in doc["moves"]:  # only index moves have one: other records read as before
            if m["crc32"] is None:
                del m["crc32"]
        return (json.dumps(doc, indent=1) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, path: str) -> CommitRecord:
        try:
            doc = json.loads(data)
            return cls(version=int(doc["version"]), txn=str(doc["txn"]), base=int(doc["base"]),
                       kind=str(doc["kind"]), manifest=dict(doc["manifest"]),
                       moves=[Move(**m) for m in doc.get("moves", [])],
                       delete=[str(d) for d in doc.get("delete", [])], staging=doc.get("staging"))
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"unreadable commit record: {e}", path) from e


@dataclass
class BackupState:
    """What is published at a backup: commit number (-1: none, or written before commit
    records) and the manifest as a JSON object (None: no backup)."""

    version: int
    manifest: dict | None
    #: The commit this load rolled forward (another writer's, claimed but not published).
    rolled_forward: int | None = None
    #: Files that roll forward moved into place.
    moved: int = 0


def read_record(fs: fsspec.AbstractFileSystem, path: str, version: int) -> CommitRecord:
    rpath = record_path(path, version)
    return CommitRecord.from_json(fs.cat_file(rpath), rpath)


def _noop(step: str) -> None:
    pass


def load_state(fs: fsspec.AbstractFileSystem, path: str, fault: FaultHook | None = None) -> BackupState:
    """The published state of the backup at ``path``, after rolling forward a pending commit."""
    invalidate_tree(fs, path)
    try:
        doc: dict | None = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
    except FileNotFoundError:
        doc = None
    except ValueError as e:
        raise ManifestError(f"not valid JSON: {e}", f"{path}/{MANIFEST}") from e
    published = manifest_commit(doc) if doc is not None else -1
    if published < 0:
        # No manifest, or one without the commit field (older writers, oso-native layout).
        records, done = list_records(fs, path)
        if not records:
            return BackupState(-1, doc)
        latest = records[-1]
        if doc is not None and latest in done:
            return BackupState(latest, doc)
    else:
        latest = published
        # Normally at most one claimed, unpublished record; a stale publisher may leave more.
        while fs.exists(record_path(path, latest + 1)):
            latest += 1
        if latest == published:
            return BackupState(published, doc)
    record = read_record(fs, path, latest)
    moved = roll_forward(fs, path, record, fault)
    return BackupState(record.version, record.manifest, record.version, len(moved))


# -- applying a record ----------------------------------------------------------------------------
def _sizes(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, int]:
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    return {fs._strip_protocol(p).rstrip("/"): int(info.get("size") or 0) for p, info in found.items()}


def _header_crc(fs: fsspec.AbstractFileSystem, path: str) -> int | None:
    try:
        head = fs.cat_file(path, start=24, end=32)
    except FileNotFoundError:
        return None
    return int.from_bytes(head, "little") if len(head) == 8 else None


def _file_crc32(fs: fsspec.AbstractFileSystem, path: str) -> int | None:
    try:
        return crc32(fs.cat_file(path))
    except FileNotFoundError:
        return None


def _in_place(fs: fsspec.AbstractFileSystem, final: str, move: Move, sizes: dict[str, int]) -> bool:
    """The final file is there with the expected size and header CRC-64 (segments) or
    whole-file CRC-32 (batch indexes: small, and without a CRC-64 header)."""
    size = sizes.get(fs._strip_protocol(final))
    if size != move.size:
        return False
    if move.crc32 is not None and _file_crc32(fs, final) != move.crc32:
        return False
    return move.crc64 is None or _header_crc(fs, final) == move.crc64


def _move_files(fs: fsspec.AbstractFileSystem, pairs: list[tuple[str, str]]) -> None:
    """Move staged files to their final names: renames on a local disk, otherwise one batched
    concurrent copy then one batched delete (never a serial ``mv`` loop on an object store)."""
    if not pairs:
        return
    if isinstance(fs, LocalFileSystem):
        dirs = set()
        for src, dst in pairs:
            d = os.path.dirname(fs._strip_protocol(dst))
            if d not in dirs:
                os.makedirs(d, exist_ok=True)
                dirs.add(d)
            with contextlib.suppress(FileNotFoundError):  # a concurrent roll forward moved it
                os.replace(fs._strip_protocol(src), fs._strip_protocol(dst))
        for d in dirs:
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    with contextlib.suppress(FileNotFoundError):  # a concurrent roll forward moved some
        fs.copy(srcs, dsts)
    _remove_all(fs, srcs)


def _remove_all(fs: fsspec.AbstractFileSystem, paths: list[str]) -> None:
    """Delete files, batched where the store allows; missing ones are fine."""
    if not paths:
        return
    if not isinstance(fs, LocalFileSystem) and "memory" not in str(fs.protocol):
        with contextlib.suppress(FileNotFoundError):
            fs.rm(paths)
            return
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(p)


def _prune_empty_dirs(fs: fsspec.AbstractFileSystem, root: str) -> None:
    """Local disks keep the directories of deleted files; object stores have none to prune."""
    if not isinstance(fs, LocalFileSystem):
        return
    top = fs._strip_protocol(root)
    for d, _subdirs, _files in os.walk(top, topdown=False):
        with contextlib.suppress(OSError):  # not empty (another writer is at work) or gone
            if not os.listdir(d):
                os.rmdir(d)


def _superseded(fs: fsspec.AbstractFileSystem, path: str, record: CommitRecord) -> bool:
    return bool(fs.exists(record_path(path, record.version + 1)))


def roll_forward(fs: fsspec.AbstractFileSystem, path: str, record: CommitRecord,
                 fault: FaultHook | None = None) -> list[Move]:
    """Apply ``record`` to the backup at ``path``; idempotent, safe to run twice at once.

    Returns the moves this call performed (empty when another applier had done them).
    """
    fault = fault or _noop
    removed = False
    if record.kind == "overwrite":
        if _superseded(fs, path, record):
            return []  # whoever claimed the next commit applied this one first
        # First: from here to the publish, readers get CommitInProgressError, never a mix.
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{path}/{MANIFEST}")
            removed = True
        fault("manifest-removed")
    invalidate_tree(fs, path)
    sizes = _sizes(fs, f"{path}/{TOPICS_DIR}")
    todo = [m for m in record.moves if not _in_place(fs, f"{path}/{m.dst}", m, sizes)]
    for m in todo:
        if m.src == m.dst:
            raise CommitError(f"{path}/{m.dst}: file adopted in place does not match commit record "
                              f"{record.version} (size {m.size}, crc64 {m.crc64})")
    _move_files(fs, [(f"{path}/{m.src}", f"{path}/{m.dst}") for m in todo])
    fault("moved")
    invalidate_tree(fs, path)
    if todo:
        sizes = _sizes(fs, f"{path}/{TOPICS_DIR}")
        for m in todo:
            if not _in_place(fs, f"{path}/{m.dst}", m, sizes):
                raise CommitError(
                    f"{path}/{m.dst}: staged file {path}/{m.src} of commit {record.version} is missing or "
                    f"damaged (expected {m.size} bytes, " + (f"crc32 {m.crc32})" if m.crc32 is not None
                                                             else f"crc64 {m.crc64})"))
    # A later commit exists: this record was finished by someone else, who may since have
    # replaced these files; deleting or publishing now would undo that commit.
    if _superseded(fs, path, record):
        if removed:  # perhaps the later commit's manifest, published since the check above
            _apply_latest(fs, path, record.version + 1)
        return todo
    _remove_all(fs, [f"{path}/{d}" for d in record.delete])
    if record.delete:
        _prune_empty_dirs(fs, f"{path}/{TOPICS_DIR}")
    fault("deleted")
    if not _superseded(fs, path, record):
        fault("publishing")
        put_atomic(fs, f"{path}/{MANIFEST}", (json.dumps(record.manifest, indent=2) + "\n").encode("utf-8"))
        if COMMIT_FIELD not in record.manifest:
            put_atomic(fs, done_path(path, record.version), b"")
        if _superseded(fs, path, record):
            # A later commit was claimed, and may have been published, between the check above
            # and this write, which then put this older manifest back over it: whoever
            # publishes last applies the latest record again, so no writer returns leaving
            # readers a stale manifest (they would see "commit in progress").
            _apply_latest(fs, path, record.version + 1)
    fault("published")
    if record.staging:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{path}/{record.staging}", recursive=True)
        _prune_empty_dirs(fs, f"{path}/{STAGING_DIR}")
    invalidate_tree(fs, path)
    return todo


def _apply_latest(fs: fsspec.AbstractFileSystem, path: str, version: int) -> None:
    """Roll forward the newest commit record from ``version`` on (it exists). A record that
    fails because an even later commit replaced its files since is left to that commit."""
    while True:
        while fs.exists(record_path(path, version + 1)):
            version += 1
        try:
            roll_forward(fs, path, read_record(fs, path, version))
            return
        except CommitError:
            if not fs.exists(record_path(path, version + 1)):
                raise


# -- a writer's transaction -----------------------------------------------------------------------
#: ``build(state)`` returns the new manifest (a JSON object) and the moves, against ``state``.
Builder = Callable[[BackupState], tuple[dict, list[Move]]]


class Transaction:
    """One writer's commit to the backup at ``path``: prepare the destination, stage, commit.

    Parameters
    ----------
    fs, path, url
        The backup directory (``url`` is for messages).
    mode : {"error", "overwrite", "append", "resume"}
        What the writer wants if a backup exists: refuse, replace it, add to it, or (resume)
        finish an incomplete one.
    txn_id : str, optional
        Names the staging directory ``_staging/<txn-id>/``; a resumed writer passes its own.
    fault : callable, optional
        Called with the name of each commit step (crash injection in tests).
    tag_manifest : bool, default True
        Record the commit in the manifest (``"commit": {"version", "txn"}``); layouts whose
        manifest must stay as another tool writes it (oso-native) get ``_commits/N.done``.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, url: str, mode: WriteMode,
                 txn_id: str | None = None, fault: FaultHook | None = None, tag_manifest: bool = True) -> None:
        require_create_only(fs, url)
        self.tag_manifest = tag_manifest
        self.fs, self.path, self.url, self.mode = fs, path.rstrip("/"), url, mode
        self.txn_id = txn_id or uuid.uuid4().hex
        self.fault = fault
        self.staging_rel = f"{STAGING_DIR}/{self.txn_id}"
        self.base = load_state(fs, self.path, fault)
        exists = self.base.manifest is not None
        if exists and mode == "error":
            raise CommitConflictError(f"a backup already exists at {url}; use mode='overwrite' or mode='append'")
        if exists and mode == "resume":
            raise CommitConflictError(f"{url} is already complete; nothing to resume")
        if not exists and mode == "error" and fs.exists(f"{self.path}/{TOPICS_DIR}"):
            raise CommitConflictError(
                f"{url} holds segments but no manifest (an incomplete backup); "
                "use mode='overwrite' to replace it or resume it with the tool that wrote it")
        self.record: CommitRecord | None = None
        self._done = False

    @property
    def staging(self) -> str:
        """This transaction's staging directory (a path on ``fs``)."""
        return f"{self.path}/{self.staging_rel}"

    def relative(self, full: str) -> str:
        """``full`` relative to the backup directory (moves are stored that way)."""
        full = self.fs._strip_protocol(full).rstrip("/")
        base = self.fs._strip_protocol(self.path).rstrip("/")
        if not full.startswith(base + "/"):
            raise CommitError(f"{full} is outside the backup {self.url}: staged files must be inside it")
        return full[len(base) + 1:]

    def _kind(self, state: BackupState) -> str:
        if self.mode == "overwrite":
            return "overwrite"
        return "create" if state.manifest is None else "append"

    def _check_rebase(self, seen: int, state: BackupState) -> None:
        """Commits landed since ``seen``: an append may follow creates and appends; anything
        else (create vs create, anything vs overwrite) is a conflict."""
        for v in range(seen + 1, state.version + 1):
            try:
                other = read_record(self.fs, self.path, v)
            except FileNotFoundError:  # a legacy manifest replaced by hand: treat as a conflict
                other = CommitRecord(v, "?", v - 1, "overwrite", {})
            if self.mode != "append" or other.kind == "overwrite":
                self._conflict(f"commit {v} ({other.kind}, transaction {other.txn}) landed first")

    def _conflict(self, why: str) -> NoReturn:
        self.abort()
        raise CommitConflictError(f"{self.url}: {why}; this {self.mode} write was not committed and its staged "
                                  "files were removed (the other writer's backup is untouched)")

    def commit(self, build: Builder) -> tuple[CommitRecord, list[Move]]:
        """Claim the next commit number for what ``build`` returns and apply it.

        ``build`` is called again with the new state when another append landed first; it
        may raise :class:`CommitConflictError` (e.g. overlapping offsets). Returns the
        record and the moves this writer applied.
        """
        if self._done:
            raise CommitError(f"transaction {self.txn_id} on {self.url} is already finished")
        fault = self.fault or _noop
        state, seen = self.base, self.base.version
        while True:
            if state.version != seen:
                self._check_rebase(seen, state)
                seen = state.version
            try:
                manifest, moves = build(state)
            except CommitConflictError as e:
                self._conflict(str(e))
            version = state.version + 1
            kind = self._kind(state)
            if self.tag_manifest:
                manifest = {**manifest, COMMIT_FIELD: {"version": version, "txn": self.txn_id}}
            delete: list[str] = []
            if kind == "overwrite":
                keep = {m.dst for m in moves}
                existing = _sizes(self.fs, f"{self.path}/{TOPICS_DIR}")
                delete = sorted(d for d in (self.relative(p) for p in existing) if d not in keep)
            record = CommitRecord(version, self.txn_id, state.version, kind, manifest, moves, delete,
                                  self.staging_rel)
            fault("before-claim")
            try:
                put_create(self.fs, record_path(self.path, version), record.to_json())
            except FileExistsError:
                state = load_state(self.fs, self.path, self.fault)  # finish the winner's commit too
                continue
            self.record = record
            self._done = True
            fault("claimed")
            applied = roll_forward(self.fs, self.path, record, self.fault)
            return record, applied

    def abort(self) -> None:
        """Delete this transaction's staging directory (never anything else)."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.staging, recursive=True)
        invalidate_tree(self.fs, self.path)


def json_of(manifest: Any) -> dict:
    """A manifest (anything with ``to_json()``) as a JSON object for a commit record."""
    return json.loads(manifest.to_json())


# -- repair ---------------------------------------------------------------------------------------
@dataclass
class RepairReport:
    """What :func:`repair` did."""

    url: str
    #: Commit number now published (-1: none, or a backup from before commit records).
    version: int
    #: The commit rolled forward, if one was pending.
    rolled_forward: int | None = None
    moved: int = 0
    #: Staging directories removed (with ``clean_staging``).
    staging_removed: list[str] = field(default_factory=list)
    complete: bool = False


def repair(url: str, storage_options: dict | None = None, *, clean_staging: bool = False,
           fs: fsspec.AbstractFileSystem | None = None) -> RepairReport:
    """Finish a commit that was claimed but not published (its writer died or is slow).

    Parameters
    ----------
    url : str
        The backup directory.
    clean_staging : bool, default False
        Also delete ``_staging/``: files of writers that died before claiming a commit.
        Only when no writer is running on this backup (a running one would lose its work).
    """
    from fsspec_kbs.store.layout import resolve

    fs, path = resolve(url, storage_options, fs)
    require_create_only(fs, url)
    state = load_state(fs, path)
    report = RepairReport(url, state.version, state.rolled_forward, state.moved,
                          complete=state.manifest is not None)
    if clean_staging:
        try:
            entries = fs.ls(f"{path}/{STAGING_DIR}", detail=False)
        except FileNotFoundError:
            entries = []
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(entry, recursive=True)
            report.staging_removed.append(entry.rstrip("/").rsplit("/", 1)[-1])
        _prune_empty_dirs(fs, f"{path}/{STAGING_DIR}")
        invalidate_tree(fs, path)
    return report
