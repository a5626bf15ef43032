"""Storage primitives of the commit protocol: atomic puts, create-only puts, commit state.

The protocol itself (staging, commit records, roll forward) is in :mod:`fsspec_kbs.store.txn`;
this module holds what every store must provide for it, in one place, and the cheap check a
reader runs when it opens a backup.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fsspec_kbs.errors import CommitInProgressError, UnsupportedStoreError

#: Numbered commit records, ``_commits/NNNNNNNN.json``, each created exactly once.
COMMITS_DIR = "_commits"
#: Per-transaction staging directories, ``_staging/<txn-id>/``.
STAGING_DIR = "_staging"
#: The manifest field naming the commit it publishes: ``{"version": n, "txn": "..."}``.
COMMIT_FIELD = "commit"
_ENTRY = re.compile(r"(\d{8,})\.(json|done)")

#: fsspec protocols whose ``pipe_file(..., mode="create")`` is a conditional create that fails
#: when the object exists (s3: If-None-Match: *, gcs: ifGenerationMatch=0, azure: overwrite=False).
#: Local files and memory:// are handled here without the store's help.
CREATE_ONLY_PROTOCOLS = frozenset({"file", "local", "memory", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
# memory:// checks existence and then stores: threads must not interleave the two.
_MEMORY_LOCK = threading.Lock()


#: A file's bytes, or its parts in order (a list: written one after another where the store
#: allows, instead of first joined into one buffer).
FileData = bytes | bytearray | memoryview | list[bytes]


def _protocols(fs: fsspec.AbstractFileSystem) -> set[str]:
    proto = fs.protocol
    return {proto} if isinstance(proto, str) else set(proto)


def require_create_only(fs: fsspec.AbstractFileSystem, url: str) -> None:
    """Refuse a filesystem on which a create-only write is not known to be atomic.

    Without it two writers could both "win" a commit number; failing loudly is better
    than racing silently.
    """
    if isinstance(fs, LocalFileSystem) or _protocols(fs) & CREATE_ONLY_PROTOCOLS:
        return
    raise UnsupportedStoreError(
        f"cannot commit to {url}: filesystem {type(fs).__name__} ({fs.protocol}) is not known to support "
        "create-only (conditional) writes, so concurrent commits could overwrite each other. "
        f"Supported: local files, memory://, s3://, gs://, az:// (see docs/format-decisions.md, Commit protocol)")


def _fsync_dir(directory: str) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_local_tmp(local: str, data: FileData) -> str:
    directory = os.path.dirname(local)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(local)}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        if isinstance(data, list):
            f.writelines(data)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def put_atomic(fs: fsspec.AbstractFileSystem, path: str, data: FileData) -> None:
    """Write ``data`` (or its parts, one after another) to ``path`` so that no reader ever
    sees a partial file.

    Local disks: write a temporary file in the same directory, fsync it, then ``os.replace``
    (atomic on POSIX) and fsync the directory. Object stores (s3, gcs, azure) and memory://
    publish a single PUT atomically, so one ``pipe_file`` is enough there.
    """
    if isinstance(fs, LocalFileSystem):
        local = fs._strip_protocol(path)
        tmp = _write_local_tmp(local, data)
        try:
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _fsync_dir(os.path.dirname(local))
        return
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    fs.pipe_file(path, b"".join(data) if isinstance(data, list) else data)


def put_create(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data`` only if it does not exist yet, atomically.

    Raises :class:`FileExistsError` when it exists (another writer won). Local disks: a
    fsynced temporary file hard-linked to the final name (``link`` fails if the name exists),
    then the directory fsynced. Object stores: a conditional PUT (``mode="create"``).
    """
    if isinstance(fs, LocalFileSystem):
        local = fs._strip_protocol(path)
        tmp = _write_local_tmp(local, data)
        try:
            os.link(tmp, local)
        finally:
            os.unlink(tmp)
        _fsync_dir(os.path.dirname(local))
        return
    require_create_only(fs, path)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if "memory" in _protocols(fs):
        with _MEMORY_LOCK:
            fs.pipe_file(path, data, mode="create")
        return
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        raise
    except Exception as e:
        # Drivers that report the failed precondition otherwise (adlfs may pass azure-core's
        # ResourceExistsError through; some report HTTP 412 as a plain OSError).
        text = f"{type(e).__name__} {e}".lower()
        if "resourceexists" in text or "precondition" in text or "already exists" in text:
            raise FileExistsError(path) from e
        raise


def put_file(fs: fsspec.AbstractFileSystem, path: str, data: FileData) -> None:
    """Write a segment (or other data file); the manifest is what makes it visible."""
    put_atomic(fs, path, data)


def remove_files(fs: fsspec.AbstractFileSystem, paths: Iterable[str]) -> None:
    """Delete files a writer wrote before it gave up (no manifest names them); gone is fine."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)


def invalidate_tree(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Forget cached listings of ``path`` and everything below it.

    ``invalidate_cache(path)`` of s3fs and gcsfs drops ``path`` and its parents only; a
    cached ``topics/<t>/<p>`` listing from before another process's commit would make its
    new segments look missing.
    """
    fs.invalidate_cache(path)
    cache = getattr(fs, "dircache", None)
    if cache:
        prefix = fs._strip_protocol(path).rstrip("/") + "/"
        for key in [k for k in list(cache) if k.startswith(prefix)]:
            cache.pop(key, None)


# -- commit state ---------------------------------------------------------------------------------
def record_name(version: int) -> str:
    return f"{version:08d}.json"


def record_path(backup: str, version: int) -> str:
    """``<backup>/_commits/NNNNNNNN.json``: the record claiming commit ``version``."""
    return f"{backup}/{COMMITS_DIR}/{record_name(version)}"


def manifest_commit(manifest: Any) -> int:
    """The commit number a parsed manifest publishes; -1 for one written before commit records.

    Takes a :class:`~fsspec_kbs.store.manifest.Manifest` (the field is in ``extra``) or a plain
    dict (an oso-native manifest).
    """
    doc = manifest.extra if hasattr(manifest, "extra") else manifest
    info = doc.get(COMMIT_FIELD) if isinstance(doc, dict) else None
    version = info.get("version") if isinstance(info, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) and version >= 0 else -1


def done_path(backup: str, version: int) -> str:
    """``_commits/NNNNNNNN.done``: marks a published commit whose manifest cannot carry the
    ``commit`` field (the oso-native layout, whose manifest must stay the tool's)."""
    return f"{backup}/{COMMITS_DIR}/{version:08d}.done"


def list_records(fs: fsspec.AbstractFileSystem, backup: str) -> tuple[list[int], set[int]]:
    """Commit numbers recorded under ``_commits/`` (ascending) and those marked done (one listing)."""
    try:
        names = fs.ls(f"{backup}/{COMMITS_DIR}", detail=False)
    except FileNotFoundError:
        return [], set()
    records: list[int] = []
    done: set[int] = set()
    for name in names:
        m = _ENTRY.fullmatch(name.rstrip("/").rsplit("/", 1)[-1])
        if m and m.group(2) == "json":
            records.append(int(m.group(1)))
        elif m:
            done.add(int(m.group(1)))
    return sorted(records), done


def _in_progress(url: str, version: int) -> CommitInProgressError:
    return CommitInProgressError(
        f"{url}: commit {version} in progress or interrupted; readers see neither the old nor the new "
        f"backup until it is published. Wait, or run `kbs repair {url}` to finish it")


def check_commit_state(fs: fsspec.AbstractFileSystem, path: str, manifest: Any, url: str | None = None) -> None:
    """Raise :class:`CommitInProgressError` if a commit newer than ``manifest`` was claimed.

    One ``exists()`` of ``_commits/<n+1>`` with ``n`` the manifest's commit number. Without
    a manifest (``manifest`` None) one listing of ``_commits/``: any record there means an
    overwrite is being applied (it removes the old manifest first). A manifest without the
    field: one listing too, the latest record must be marked done.
    """
    url = url or path
    # Listings cached by this process (s3fs, gcsfs) predate any commit another process made
    # since: the segments the manifest names must not look missing.
    invalidate_tree(fs, path)
    n = -1 if manifest is None else manifest_commit(manifest)
    if n >= 0:
        if fs.exists(record_path(path, n + 1)):
            raise _in_progress(url, n + 1)
        return
    # No manifest, or one without the field (written before commit records, or oso-native).
    records, done = list_records(fs, path)
    if records and (manifest is None or records[-1] not in done):
        raise _in_progress(url, records[-1])


# -- streaming sinks' batch records ---------------------------------------------------------------
#: The manifest field recording, per streaming query, the last micro-batch committed to the
#: backup (like Delta Lake's ``txn`` action: app id + version): ``{"<query id>": {"batch": n,
#: "txn": "...", "committed_at": "..."}}``. An extra field (kbs-format.md §3: ignored by readers,
#: kept by tools that rewrite a manifest); every commit carries it over from its base.
STREAMS_FIELD = "streams"


def stream_batch(manifest: Any, query_id: str) -> int:
    """The last micro-batch of streaming query ``query_id`` committed to a manifest; -1 for none.

    Takes a :class:`~fsspec_kbs.store.manifest.Manifest` (the field is in ``extra``) or a dict.
    """
    doc = manifest.extra if hasattr(manifest, "extra") else manifest
    streams = doc.get(STREAMS_FIELD) if isinstance(doc, dict) else None
    entry = streams.get(query_id) if isinstance(streams, dict) else None
    batch = entry.get("batch") if isinstance(entry, dict) else None
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 0 else -1


def merge_streams(a: Any, b: Any) -> dict:
    """Two ``streams`` records as one: per query, the later batch. A copy appended into a
    backup that streams write too (compaction, convert) must not roll a query back (a replayed
    micro-batch would then be written twice) nor drop one."""
    out = dict(a) if isinstance(a, dict) else {}
    for query, entry in (b.items() if isinstance(b, dict) else ()):
        if stream_batch({STREAMS_FIELD: {query: entry}}, query) >= stream_batch({STREAMS_FIELD: out}, query):
            out[query] = entry
    return out


def with_stream_batch(extra: dict, query_id: str, batch: int, txn: str, at: str) -> dict:
    """``extra`` (a manifest's extra fields) recording micro-batch ``batch`` of ``query_id``;
    the other queries' entries are kept."""
    streams = extra.get(STREAMS_FIELD)
    streams = dict(streams) if isinstance(streams, dict) else {}
    streams[query_id] = {"batch": batch, "txn": txn, "committed_at": at}
    return {**extra, STREAMS_FIELD: streams}
