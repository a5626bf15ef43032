"""Publishing files atomically: readers see the whole file or nothing."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable

import fsspec
from fsspec.implementations.local import LocalFileSystem


def put_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file.

    Local disks: write a temporary file in the same directory, fsync it, then ``os.replace``
    (atomic on POSIX) and fsync the directory. Object stores (s3, gcs, azure) and memory://
    publish a single PUT atomically, so one ``pipe_file`` is enough there.
    """
    if isinstance(fs, LocalFileSystem):
        local = fs._strip_protocol(path)
        directory = os.path.dirname(local)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(local)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    fs.pipe_file(path, data)


def put_file(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write a segment (or other data file); the manifest is what makes it visible."""
    put_atomic(fs, path, data)


def remove_files(fs: fsspec.AbstractFileSystem, paths: Iterable[str]) -> None:
    """Delete files a writer wrote before it gave up (no manifest names them); gone is fine."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
