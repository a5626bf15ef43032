"""Find and open backups under a storage root, whatever their layout."""

from __future__ import annotations

from dataclasses import dataclass

import fsspec
from fsspec.core import url_to_fs

from fsspec_kbs.errors import InvalidNameError
from fsspec_kbs.store.backup import KbsBackup
from fsspec_kbs.store.names import MANIFEST, check_backup_id


def open_backup(url: str, storage_options: dict | None = None, allow_incomplete: bool = False,
                fs: fsspec.AbstractFileSystem | None = None) -> KbsBackup:
    """Open the backup at ``url``; the layout is detected from what is stored there."""
    return KbsBackup.open(url, storage_options, allow_incomplete=allow_incomplete, fs=fs)


@dataclass(frozen=True)
class BackupListing:
    backup_id: str
    url: str
    complete: bool


def list_backups(root_url: str, storage_options: dict | None = None) -> list[BackupListing]:
    """Backups directly under ``root_url``: directories with a legal backup id.

    ``complete`` is True when the directory has a ``manifest.json``.
    """
    fs, root = url_to_fs(root_url, **(storage_options or {}))
    root = root.rstrip("/")
    out = []
    for info in fs.ls(root, detail=True):
        if info["type"] != "directory":
            continue
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        try:
            check_backup_id(name)
        except InvalidNameError:
            continue
        out.append(BackupListing(name, f"{root_url.rstrip('/')}/{name}", fs.exists(f"{info['name'].rstrip('/')}/{MANIFEST}")))
    return sorted(out, key=lambda b: b.backup_id)
