"""Find and open backups under a storage root, whatever their layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from fsspec_kbs.errors import InvalidNameError, KbsError, ManifestError
from fsspec_kbs.store import manifest_json
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.layout import Backup, read_manifest_bytes, resolve
from fsspec_kbs.store.names import check_backup_id
from fsspec_kbs.store.oso_backup import OsoBackup, looks_like_oso_without_manifest
from fsspec_kbs.store.oso_manifest import is_oso_manifest

#: The class of each layout, by :attr:`Backup.layout` (``SegmentRef.layout``).
LAYOUTS: dict[str, type[Backup[Any]]] = {cls.layout: cls for cls in (KbsBackup, OsoBackup)}


def backup_class(layout: str) -> type[Backup[Any]]:
    """The :class:`Backup` class of ``layout`` (``"kbs"`` or ``"oso"``), e.g. to rebuild a
    backup from a planned read's refs without reading its manifest again."""
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown backup layout {layout!r}; known: {sorted(LAYOUTS)}") from None


def open_backup(url: str, storage_options: dict | None = None, allow_incomplete: bool = False,
                fs: fsspec.AbstractFileSystem | None = None) -> Backup[Any]:
    """Open the backup at ``url``; the layout is detected from what is stored there.

    A manifest without ``version`` whose partitions have ``partition_id``/``segments`` is the
    OSO kafka-backup tool's (:class:`~fsspec_kbs.store.oso_backup.OsoBackup`); without a
    manifest, ``topics/<t>/partition=<p>/`` directories tell the same. Anything else is KBS.
    """
    fs, path = resolve(url, storage_options, fs)
    raw = read_manifest_bytes(fs, path)
    return backup_class(layout_of(fs, path, raw)).from_storage(fs, path, raw, url, storage_options, allow_incomplete)


def detect_layout(url: str, storage_options: dict | None = None,
                  fs: fsspec.AbstractFileSystem | None = None) -> str:
    """``"oso"`` or ``"kbs"`` for the backup at ``url`` (one small read, two listings at most)."""
    fs, path = resolve(url, storage_options, fs)
    return layout_of(fs, path, read_manifest_bytes(fs, path))


def layout_of(fs: fsspec.AbstractFileSystem, path: str, raw: bytes | None) -> str:
    """The layout (a key of :data:`LAYOUTS`) of the backup at ``path`` whose manifest bytes are
    ``raw`` (None: there is none)."""
    if raw is None:
        return "oso" if looks_like_oso_without_manifest(fs, path) else "kbs"
    try:
        doc = manifest_json.loads(raw, None)
    except ManifestError:
        return "kbs"  # KbsBackup reports the broken manifest
    return "oso" if is_oso_manifest(doc) else "kbs"


@dataclass(frozen=True)
class BackupListing:
    backup_id: str
    url: str
    complete: bool


def list_backups(root_url: str, storage_options: dict | None = None) -> list[BackupListing]:
    """Backups directly under ``root_url``: directories with a legal backup id.

    ``complete`` is True when the directory has a ``manifest.json`` that (OSO layout, whose
    tool rewrites its manifest as it goes) lists every segment file stored there.
    """
    fs, root = url_to_fs(root_url, **(storage_options or {}))
    root = root.rstrip("/")
    fs.invalidate_cache(root)  # a listing reflects the store now, not a cached earlier one
    out = []
    for info in fs.ls(root, detail=True):
        if info["type"] != "directory":
            continue
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        try:
            check_backup_id(name)
        except InvalidNameError:
            continue
        out.append(BackupListing(name, f"{root_url.rstrip('/')}/{name}", _complete(fs, info["name"].rstrip("/"))))
    return sorted(out, key=lambda b: b.backup_id)


def _complete(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    raw = read_manifest_bytes(fs, path)
    if raw is None:
        return False
    cls = backup_class(layout_of(fs, path, raw))
    if cls.manifest_written_last:
        return True
    try:
        return cls.from_storage(fs, path, raw, path).complete
    except KbsError:
        return False  # a manifest that does not parse: `kbs validate` says why
