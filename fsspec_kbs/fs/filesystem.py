"""``kbs://``: one backup, wherever it is stored, as a browsable read-only fsspec filesystem.

The tree::

    manifest.json                       the backup's manifest, as stored
    <topic>/                            one directory per topic
    <topic>/<partition>/                one directory per partition ("0", "1", ...)
    <topic>/<partition>/<segment file>  raw segment bytes (served from the storage, range reads)
    <topic>/<partition>/records.jsonl   decoded records as JSON lines (the ``kbs cat`` form)
    <topic>/<partition>/records.parquet decoded records in the Kafka Arrow schema

Registered under the entry point ``fsspec.specs`` so ``fsspec.filesystem("kbs", ...)`` and
``kbs::`` URLs work without importing this package first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from fsspec_kbs.errors import BackupNotFoundError, InvalidNameError
from fsspec_kbs.fs.views import (
    DEFAULT_SPOOL_BYTES,
    JSONL,
    PARQUET,
    VIEWS,
    KbsViewFile,
    jsonl_chunks,
    segment_info,
    summary,
    view_info,
    write_parquet,
)
from fsspec_kbs.store import Backup, SegmentRef, open_backup
from fsspec_kbs.store.names import MANIFEST
from fsspec_kbs.store.segment_ref import segment_missing

try:  # fsspec >= 2025.x: url_to_fs hands a chained filesystem the full target path as its path too
    from fsspec.implementations.chained import ChainedFileSystem as _Base
except ImportError:  # pragma: no cover - older fsspec
    _Base = AbstractFileSystem

_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Node:
    """What a path inside a backup names: the backup itself, its manifest, a topic or partition
    directory, a segment file (``ref``) or a decoded view of a partition (``view``)."""

    kind: Literal["root", "manifest", "topic", "partition", "segment", "view"]
    topic: str = ""
    partition: int = -1
    ref: SegmentRef | None = None
    view: str = ""


_READ_ONLY = "kbs:// is read-only: a backup is written with fsspec_kbs.write_table / BackupWriter, not through the filesystem"


_OWN_KWARGS = {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache",
               "asynchronous", "loop", "batch_size"}
_NO_FO = ("kbs:// needs the backup it browses: write kbs::<URL of the backup or of a file in it> "
          "(kbs::s3://bucket/backups/backup-1/orders/0/records.jsonl, kbs::/data/backups/backup-1), "
          "kbs:///<absolute local path>, or pass fo=<URL of the backup> "
          "(fsspec.filesystem('kbs', fo=...), storage_options={'fo': ...})")


def _is_partition_name(name: str) -> bool:
    return bool(re.fullmatch(r"0|[1-9][0-9]*", name))


def _plausible_inner(parts: list[str]) -> bool:
    """Whether ``parts`` could be a path inside the kbs tree (glob patterns allowed)."""
    if not parts or len(parts) > 3:
        return False
    if len(parts) >= 2 and not (_is_partition_name(parts[1]) or _GLOB.search(parts[1])):
        return False
    return all(p not in ("", ".", "..") for p in parts)


class KbsFileSystem(_Base):
    """A KBS backup as a read-only filesystem (protocol ``kbs``).

    Parameters
    ----------
    fo : str
        URL or path of the backup directory (``s3://bucket/backups/backup-1``, a local path…).
        It may go on into the backup (``…/backup-1/orders/0/records.jsonl``): the backup root
        is the deepest prefix holding a ``manifest.json``, which is how chained URLs
        ``kbs::s3://bucket/backups/backup-1/orders/0/records.jsonl`` open a file directly.
    target_protocol : str, optional
        Protocol of the storage, if ``fo`` does not carry it (chained URLs set it).
    target_options : dict, optional
        Storage options for the target filesystem (``{"key": ..., "client_kwargs": ...}``).
    fs : fsspec.AbstractFileSystem, optional
        An existing filesystem holding the backup; ``fo`` is then a path on it and
        ``target_protocol`` / ``target_options`` are ignored.
    allow_incomplete : bool, default False
        Browse a backup without ``manifest.json`` (interrupted); its segments are listed from
        storage.
    verify_checksums : bool, default True
        Check CRCs while decoding ``records.jsonl`` / ``records.parquet``.
    spool_bytes : int, default 16 MiB
        Bytes of a decoded view kept in memory before it spills to a temporary file.
    **kwargs
        Passed to :class:`fsspec.AbstractFileSystem`.

    Notes
    -----
    The manifest and segment listing are read once per instance and cached (a committed backup
    does not change); :meth:`invalidate_cache` re-reads them, e.g. after an append. Like
    fsspec's ``reference`` filesystem, instances are not shared between calls
    (``cachable = False``): each ``fsspec.filesystem("kbs", ...)`` reads the manifest anew.

    Raises
    ------
    BackupNotFoundError
        (a ``FileNotFoundError``) when ``fo`` holds no backup; IncompleteBackupError when it
        has no manifest and ``allow_incomplete`` is False.
    PermissionError
        on any write.

    Examples
    --------
    >>> import fsspec
    >>> fs = fsspec.filesystem("kbs", fo="s3://bucket/backups/backup-1",
    ...                        target_options={"anon": False})  # doctest: +SKIP
    >>> fs.ls("orders/0", detail=False)  # doctest: +SKIP
    ['orders/0/segment-00000000.kbs', 'orders/0/records.jsonl', 'orders/0/records.parquet']
    >>> with fsspec.open("kbs::s3://bucket/backups/backup-1/orders/0/records.jsonl", "rt") as f:
    ...     first = f.readline()  # doctest: +SKIP

    .. versionadded:: 0.1.0
    """

    protocol = "kbs"
    root_marker = ""
    cachable = False

    def __init__(self, fo: str | None = None, target_protocol: str | None = None,
                 target_options: dict | None = None, fs: fsspec.AbstractFileSystem | None = None,
                 allow_incomplete: bool = False, verify_checksums: bool = True,
                 spool_bytes: int = DEFAULT_SPOOL_BYTES, **kwargs: Any) -> None:
        # Flat storage options (fsspec.filesystem("kbs", fo=..., endpoint_url=..., key=...)) go
        # to the target, as target_options do; fsspec's own instance options stay here.
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in _OWN_KWARGS}
        if kwargs:
            if fs is not None:
                raise TypeError(f"kbs://: storage options {sorted(kwargs)} cannot apply to the fs= given")
            target_options = {**kwargs, **(target_options or {})}
        super().__init__(**own)
        if not isinstance(fo, str) or not fo:
            raise ValueError(_NO_FO)
        if fs is None:
            if target_protocol:
                fs = fsspec.filesystem(target_protocol, **(target_options or {}))
                path = fs._strip_protocol(fo)
            else:
                fs, path = url_to_fs(fo, **(target_options or {}))
        else:
            path = fs._strip_protocol(fo)
        self.fo = fo
        self.target = fs
        self.allow_incomplete = allow_incomplete
        self.verify_checksums = verify_checksums
        self.spool_bytes = spool_bytes
        backup, self.fo_inner = self._resolve_backup(fs, path.rstrip("/"))
        self._backup: Backup | None = backup
        self._backup_path = backup.path
        self._root_key = backup.path.strip("/")
        #: URL of the backup root on its storage (for messages and ``info("")``)
        self.url = fs.unstrip_protocol(backup.path)
        self._tree: dict[str, dict[int, list[SegmentRef]]] | None = None
        self._sizes: dict[tuple[str, int], dict[str, int]] = {}
        self._by_name: dict[tuple[str, int], dict[str, SegmentRef]] = {}
        self._view_sizes: dict[str, int] = {}
        self._manifest_raw: bytes | None = None

    # -- opening -----------------------------------------------------------------------------------
    def _resolve_backup(self, fs: fsspec.AbstractFileSystem, path: str) -> tuple[Backup, str]:
        """The backup at ``path`` or at a prefix of it, and the rest of ``path`` inside it.

        A backup root is where ``manifest.json`` is: checked at ``path`` first (the usual case,
        one HEAD), then at the up to three prefixes whose remainder could be a kbs path. Without
        a manifest anywhere, a prefix holding ``topics/`` is an incomplete backup.
        """
        candidates = [(path, "")] if not _GLOB.search(path) else []
        candidates += self._deeper_candidates(path)
        for root, inner in candidates:
            if fs.exists(f"{root}/{MANIFEST}"):
                return open_backup(root, allow_incomplete=self.allow_incomplete, fs=fs), inner
        for root, inner in candidates:
            if fs.isdir(f"{root}/topics"):  # IncompleteBackupError unless allow_incomplete
                return open_backup(root, allow_incomplete=self.allow_incomplete, fs=fs), inner
        try:  # an existing, empty directory is an incomplete backup; anything else is not found
            return open_backup(path, allow_incomplete=self.allow_incomplete, fs=fs), ""
        except InvalidNameError as e:
            raise BackupNotFoundError(f"no backup at {fs.unstrip_protocol(path)}: {e}") from e

    @staticmethod
    def _deeper_candidates(path: str) -> list[tuple[str, str]]:
        """(backup root, inner path) splits of ``path`` with a plausible inner path, shortest inner last."""
        parts = path.split("/")
        out = []
        for k in (3, 2, 1):
            root, inner = parts[:-k], parts[-k:]
            if len(root) >= 1 and root[-1] and not any(_GLOB.search(p) for p in root) and _plausible_inner(inner):
                out.append(("/".join(root), "/".join(inner)))
        return out

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        """``kbs:///data/backups/backup-1/...``: a local absolute path names the backup itself."""
        if isinstance(path, str) and path.startswith("kbs:///") and "::" not in path:
            return {"fo": path[len("kbs://"):]}
        return {}

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        # paths are relative to the backup root, as in zip:// (no leading "/")
        return super()._strip_protocol(path).strip("/")

    def _rel(self, path: str) -> str:
        """Path inside the backup: also accepts the full target path chained URLs pass."""
        p = self._strip_protocol(path)
        if p == self._root_key:
            return ""
        if self._root_key and p.startswith(self._root_key + "/"):
            return p[len(self._root_key) + 1:]
        return p

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the manifest and listing; the next call re-reads them from storage."""
        super().invalidate_cache(path)
        self._backup = None
        self._tree = None
        self._by_name.clear()
        self._sizes.clear()
        self._view_sizes.clear()
        self._manifest_raw = None

    # -- the tree ----------------------------------------------------------------------------------
    @property
    def backup(self) -> Backup:
        """The opened backup (``fsspec_kbs.store``); re-opened after :meth:`invalidate_cache`."""
        if self._backup is None:
            self._backup = open_backup(self._backup_path, allow_incomplete=self.allow_incomplete, fs=self.target)
        return self._backup

    @property
    def tree(self) -> dict[str, dict[int, list[SegmentRef]]]:
        """{topic: {partition: [segments in order]}}, from the manifest (read once)."""
        if self._tree is None:
            tree: dict[str, dict[int, list[SegmentRef]]] = {}
            for ref in self.backup.segments():
                tree.setdefault(ref.topic, {}).setdefault(ref.partition, []).append(ref)
            self._tree = tree
        return self._tree

    def _manifest_bytes(self) -> bytes | None:
        if self._manifest_raw is None:
            if not self.backup.complete:
                return None
            self._manifest_raw = self.backup.fs.cat_file(f"{self.backup.path}/{MANIFEST}")
        return self._manifest_raw

    def _missing(self, path: str) -> FileNotFoundError:
        return FileNotFoundError(f"{path!r}: no such file or directory in backup {self.url}")

    def _node(self, path: str) -> Node:
        """Resolve a relative path to what it names; FileNotFoundError otherwise."""
        if path == "":
            return Node("root")
        parts = path.split("/")
        if parts == [MANIFEST] and self.backup.complete:
            return Node("manifest")
        topic = parts[0]
        if topic not in self.tree:
            raise self._missing(path)
        if len(parts) == 1:
            return Node("topic", topic)
        if not _is_partition_name(parts[1]) or int(parts[1]) not in self.tree[topic]:
            raise self._missing(path)
        partition = int(parts[1])
        if len(parts) == 2:
            return Node("partition", topic, partition)
        if len(parts) == 3:
            if parts[2] in VIEWS:
                return Node("view", topic, partition, view=parts[2])
            ref = self._segments_by_name(topic, partition).get(parts[2])
            if ref is not None:
                return Node("segment", topic, partition, ref=ref)
        raise self._missing(path)

    def _segments_by_name(self, topic: str, partition: int) -> dict[str, SegmentRef]:
        key = (topic, partition)
        index = self._by_name.get(key)
        if index is None:  # a dict per partition: lookups stay O(1) with thousands of segments
            index = self._by_name[key] = {r.name: r for r in self.tree[topic][partition]}
        return index

    def _segment_size(self, topic: str, partition: int, ref: SegmentRef) -> int | None:
        if ref.size_bytes is not None:
            return ref.size_bytes
        sizes = self._sizes.get((topic, partition))
        if sizes is None:  # a 1.0 manifest has no sizes: one listing of the directory gives them all
            folder = ref.path.rsplit("/", 1)[0]
            try:
                listing = self.backup.fs.ls(folder, detail=True)
            except FileNotFoundError:
                listing = []
            sizes = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in listing}
            self._sizes[(topic, partition)] = sizes
        return sizes.get(ref.name)

    def _info_of(self, path: str, node: Node) -> dict[str, Any]:
        kind = node.kind
        if kind == "root":
            refs = [r for parts in self.tree.values() for rs in parts.values() for r in rs]
            info = {**self.backup.describe().to_dict(), **summary(refs)}
            return {**info, "url": self.url, "name": "", "type": "directory", "size": 0, "kind": "backup",
                    "topics": len(self.tree), "partitions": sum(len(p) for p in self.tree.values())}
        if kind == "manifest":
            raw = self._manifest_bytes() or b""
            return {"name": path, "type": "file", "size": len(raw), "kind": "manifest",
                    "target": f"{self.backup.path}/{MANIFEST}"}
        if kind == "topic":
            parts = self.tree[node.topic]
            refs = [r for rs in parts.values() for r in rs]
            return {"name": path, "type": "directory", "size": 0, "kind": "topic", "topic": node.topic,
                    "partitions": len(parts), **summary(refs)}
        if kind == "partition":
            refs = self.tree[node.topic][node.partition]
            sizes = [self._segment_size(node.topic, node.partition, r) for r in refs]
            return {"name": path, "type": "directory", "size": 0, "kind": "partition", "topic": node.topic,
                    "partition": node.partition, **summary(refs),
                    "stored_bytes": None if None in sizes else sum(sizes)}  # type: ignore[arg-type]
        if kind == "segment":
            ref = node.ref
            return segment_info(path, ref, self._segment_size(node.topic, node.partition, ref), ref.path)
        # a view: its size is known once this instance has produced it
        return view_info(path, node.view, node.topic, node.partition, self.tree[node.topic][node.partition],
                         self._view_sizes.get(path))

    # -- listing -----------------------------------------------------------------------------------
    def ls(self, path: str = "", detail: bool = True, **kwargs: Any) -> list:
        path = self._rel(path)
        node = self._node(path)
        kind = node.kind
        prefix = f"{path}/" if path else ""
        if kind == "root":
            children = [f"{prefix}{t}" for t in sorted(self.tree)]
            if self.backup.complete:
                children.insert(0, MANIFEST)
        elif kind == "topic":
            children = [f"{prefix}{p}" for p in sorted(self.tree[node.topic])]
        elif kind == "partition":
            children = [f"{prefix}{r.name}" for r in self.tree[node.topic][node.partition]]
            children += [f"{prefix}{v}" for v in VIEWS]
        else:  # a file lists as itself, as in fsspec's local and memory filesystems
            return [self._info_of(path, node)] if detail else [path]
        if not detail:
            return children
        return [self._info_of(c, self._node(c)) for c in children]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._rel(path)
        return self._info_of(path, self._node(path))

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self._node(self._rel(path))
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: str) -> bool:
        try:
            return self._node(self._rel(path)).kind in ("root", "topic", "partition")
        except FileNotFoundError:
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self._node(self._rel(path)).kind in ("manifest", "segment", "view")
        except FileNotFoundError:
            return False

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        return super().glob(self._rel(path), maxdepth=maxdepth, **kwargs)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        return super().find(self._rel(path), maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def du(self, path: str, total: bool = True, maxdepth: int | None = None, withdirs: bool = False,
           **kwargs: Any) -> Any:
        """Bytes under ``path``; decoded views not yet produced count as 0 (their size is unknown)."""
        sizes = {name: info.get("size") or 0
                 for name, info in self.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=True).items()}
        return sum(sizes.values()) if total else sizes

    def size(self, path: str) -> int:
        """Bytes of ``path``. A decoded view not produced yet is produced once (decoded and
        spooled) to learn it: tools such as DuckDB need the size before reading."""
        info = self.info(path)
        if info.get("size") is None and info.get("kind") == "view":
            with self.open(path, "rb") as f:
                f.seek(0, 2)
                return f.tell()
        return info.get("size") or 0

    def modified(self, path: str) -> Any:
        """When the backup was completed (its manifest's ``completed_at``, else ``created_at``),
        for every path: a committed backup does not change. Falls back to the storage's
        modification time of the manifest or segment."""
        from datetime import datetime, timezone

        path = self._rel(path)
        node = self._node(path)
        described = self.backup.describe()  # both layouts' times, as ISO 8601
        stamp = described.completed_at or described.created_at
        if stamp is not None:
            try:
                return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            except ValueError:
                pass
        target = node.ref.path if node.kind == "segment" else f"{self.backup.path}/{MANIFEST}"
        try:
            return self.backup.fs.modified(target)
        except (NotImplementedError, FileNotFoundError, OSError):
            return datetime.fromtimestamp(0, tz=timezone.utc)

    def ukey(self, path: str) -> str:
        """A key that changes when the content does: a segment's CRC-64, else the backup and path
        with their manifest metadata (a view's size, known only once produced, is left out)."""
        from fsspec.utils import tokenize

        info = self.info(path)
        if info.get("kind") == "segment" and info.get("crc64") is not None:
            return f"crc64:{info['crc64']}"
        return tokenize(self.url, {k: v for k, v in info.items() if k != "size"})

    def __repr__(self) -> str:
        return f"<KbsFileSystem {self.url}>"

    # -- reading -----------------------------------------------------------------------------------
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        path = self._rel(path)
        node = self._node(path)
        if node.kind == "segment":
            return self._target_call(node.ref, "cat_file", node.ref.path, start=start, end=end)
        if node.kind == "manifest":
            return (self._manifest_bytes() or b"")[start:end]
        if node.kind in ("root", "topic", "partition"):
            raise IsADirectoryError(f"{path!r} is a directory in backup {self.url}")
        return super().cat_file(path, start=start, end=end, **kwargs)

    def _target_call(self, ref: SegmentRef, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.backup.fs, method)(*args, **kwargs)
        except FileNotFoundError as e:
            raise segment_missing(ref) from e

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict | None = None, **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"cannot open {path!r} with mode {mode!r}: {_READ_ONLY}")
        path = self._rel(path)
        if path == "" and self.fo_inner:  # older fsspec passes "" for `kbs::<url of a file>`
            path = self.fo_inner
        node = self._node(path)
        kind = node.kind
        if kind in ("root", "topic", "partition"):
            raise IsADirectoryError(f"{path!r} is a directory in backup {self.url}")
        if kind == "segment":
            return self._target_call(node.ref, "open", node.ref.path, mode="rb", block_size=block_size,
                                     cache_options=cache_options)
        details = self._info_of(path, node)
        if kind == "manifest":
            return KbsViewFile(self, path, iter([self._manifest_bytes() or b""]), details, self.spool_bytes)
        topic, partition, view = node.topic, node.partition, node.view
        refs = self.tree[topic][partition]

        def done(size: int) -> None:
            self._view_sizes[path] = size

        if view == JSONL:
            chunks = jsonl_chunks(refs, self._iter_columns)
            return KbsViewFile(self, path, chunks, details, self.spool_bytes, on_complete=done)
        assert view == PARQUET
        return self._open_parquet(path, topic, partition, details, done)

    def _iter_columns(self, ref: SegmentRef) -> Iterator[Any]:
        return self.backup.iter_columns(ref, verify_checksums=self.verify_checksums)

    def _open_parquet(self, path: str, topic: str, partition: int, details: dict, done: Any) -> KbsViewFile:
        import tempfile

        from fsspec_kbs.dataset import KbsDataset

        ds = KbsDataset(self.backup).filter(topics=topic, partitions=partition)
        spool = tempfile.SpooledTemporaryFile(max_size=self.spool_bytes)  # noqa: SIM115 - outlives this call
        try:
            write_parquet(ds.to_batches(verify_checksums=self.verify_checksums), ds.schema, spool)
        except BaseException:
            spool.close()
            raise
        return KbsViewFile(self, path, None, details, spool=spool, on_complete=done)

    # -- writing: refused ----------------------------------------------------------------------------
    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(_READ_ONLY)

    pipe_file = put_file = put = pipe = _refuse
    rm_file = rm = rmdir = _rm = _refuse
    mkdir = makedirs = touch = _refuse
    cp_file = copy = mv = move = rename = _refuse
    mkdirs = _refuse  # type: ignore[assignment]
