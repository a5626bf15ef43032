"""What every backup layout shares: :class:`Backup`, the base of the KBS layout
(:class:`~fsspec_kbs.store.backup.KbsBackup`) and the OSO tool's
(:class:`~fsspec_kbs.store.oso_backup.OsoBackup`), and what ``kbs describe`` and ``kbs convert``
take from either (:class:`BackupDescription`, :class:`Origin`).

Readers (dataset, CLI, Spark, the ``kbs`` protocol, maintenance jobs) type against
:class:`Backup`; what differs between the layouts is a method the layout class implements,
never a test of ``layout`` by its callers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from fsspec_kbs.errors import (
    BackupNotFoundError,
    IncompleteBackupError,
    KbsError,
    SegmentFormatError,
)
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.format.batch_index import BatchIndex
from fsspec_kbs.store.names import MANIFEST, backup_id_of
from fsspec_kbs.store.opened import OpenedSegment, iter_opened
from fsspec_kbs.store.pooled import read_pooled
from fsspec_kbs.store.segment_ref import (
    Bounds,
    SegmentRef,
    check_order,
    check_size,
    segment_missing,
)

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11; the package supports 3.10


def resolve(url: str, storage_options: dict | None = None,
            fs: fsspec.AbstractFileSystem | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of ``url`` (``url`` is already a path when ``fs`` is given)."""
    if fs is None:
        fs, url = url_to_fs(url, **(storage_options or {}))
    return fs, url.rstrip("/")


def read_manifest_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes | None:
    """``manifest.json`` of the backup at ``path``, or None when there is none."""
    try:
        return fs.cat_file(f"{path}/{MANIFEST}")
    except FileNotFoundError:
        return None


def iso_from_ms(ms: int | None) -> str | None:
    """Epoch milliseconds (the OSO manifest's times) as the KBS manifest writes times."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ms_from_iso(value: Any) -> int | None:
    """A KBS manifest's ISO 8601 time as epoch milliseconds; None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


@dataclass(frozen=True)
class BackupDescription:
    """What ``kbs describe`` shows of a backup, the same for every layout.

    ``compression`` is the manifest's object (``{"algorithm": ..., "level": ...}``),
    ``source_cluster`` the cluster it was taken from, ``statistics`` and ``time_range`` the
    manifest's claims (None where the layout records none), ``gaps`` what the OSO tool noted.
    """

    url: str
    backup_id: str
    layout: str
    complete: bool
    segments: list[SegmentRef]
    version: str | None = None
    created_at: str | None = None
    completed_at: str | None = None
    compression: dict[str, Any] | None = None
    source_cluster: dict[str, Any] | None = None
    statistics: dict[str, Any] | None = None
    time_range: dict[str, Any] | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The description without its segments, as JSON-ready values (``kbs describe --json``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "segments"}


@dataclass(frozen=True)
class Origin:
    """When and from which cluster a backup was taken, in both layouts' terms: what a copy
    in either layout carries over (``kbs convert``). All None (``brokers`` empty) when the
    backup has no manifest."""

    #: ISO 8601, as a KBS manifest's ``created_at``.
    created_at: str | None = None
    #: Epoch milliseconds, as an OSO manifest's ``created_at``.
    created_at_ms: int | None = None
    #: A KBS manifest's ``source_cluster`` object.
    source_cluster: dict[str, Any] | None = None
    #: An OSO manifest's ``source_cluster_id`` and ``source_brokers``.
    cluster_id: str | None = None
    brokers: list[str] = field(default_factory=list)


class ValidationSink(Protocol):
    """Where :meth:`Backup.validate_segment` reports (``maintenance.validate.ValidationReport``)."""

    records_checked: int

    def add(self, path: str, error: Exception) -> None: ...


class _Manifest(Protocol):
    @property
    def backup_id(self) -> str: ...


M = TypeVar("M", bound=_Manifest)


class Backup(ABC, Generic[M]):
    """A backup on any fsspec filesystem, of one layout: its manifest (``M``, None for a backup
    without one), the refs of its segments, reading and checking them.

    Use :meth:`open` (or :func:`~fsspec_kbs.store.open.open_backup`, which picks the layout);
    the constructor takes an already-resolved filesystem and path.
    """

    #: ``SegmentRef.layout`` and ``kbs describe``'s name of the layout.
    layout: ClassVar[str]
    #: Backup ids of this layout follow kbs-format.md §1.
    check_id: ClassVar[bool] = True
    #: The manifest is written once, after every segment (then a manifest means a whole
    #: backup); False: the layout's tool rewrites it as it goes (:attr:`complete` checks).
    manifest_written_last: ClassVar[bool] = True

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, manifest: M | None,
                 url: str | None = None, storage_options: dict | None = None,
                 allow_incomplete: bool = False) -> None:
        self.fs = fs
        self.path = path.rstrip("/")
        self.manifest = manifest
        self.url = url or path
        self.storage_options = dict(storage_options or {})
        self.allow_incomplete = allow_incomplete
        self._segments: list[SegmentRef] | None = None
        #: Segments whose header (and footer) agree with the manifest (:meth:`check_unread`).
        self._checked: set[str] = set()

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, allow_incomplete: bool = False,
             fs: fsspec.AbstractFileSystem | None = None) -> Self:
        """Open the backup at ``url`` (``<root>/<backup-id>``) in this layout.

        Parameters
        ----------
        url : str
            Any fsspec URL or local path of the backup directory.
        storage_options : dict, optional
            Passed to the fsspec filesystem (e.g. ``{"endpoint_url": ...}`` for s3).
        allow_incomplete : bool, default False
            Read a backup without ``manifest.json`` (an interrupted backup) by listing its
            segments. Without it such a backup raises :class:`IncompleteBackupError`.

        Raises
        ------
        BackupNotFoundError, IncompleteBackupError, ManifestError, UnsupportedVersionError
        """
        fs, path = resolve(url, storage_options, fs)
        return cls.from_storage(fs, path, read_manifest_bytes(fs, path), url, storage_options, allow_incomplete)

    @classmethod
    def from_storage(cls, fs: fsspec.AbstractFileSystem, path: str, raw: bytes | None, url: str,
                     storage_options: dict | None = None, allow_incomplete: bool = False) -> Self:
        """Build from manifest bytes already read (None: no manifest there)."""
        from fsspec_kbs.store.commit import check_commit_state

        if cls.check_id:
            backup_id_of(path)
        if raw is None:
            if not fs.exists(path):
                raise BackupNotFoundError(f"no backup at {url}")
            # No manifest but a claimed commit: an overwrite being applied, not an incomplete backup.
            check_commit_state(fs, path, None, url)
            if not allow_incomplete:
                raise IncompleteBackupError(
                    f"{url} has no {MANIFEST}: the backup is incomplete (interrupted or still running). "
                    "Pass allow_incomplete=True (CLI: --allow-incomplete) to read what it holds."
                )
            return cls(fs, path, None, url, storage_options, allow_incomplete)
        manifest = cls.parse_manifest(raw, f"{path}/{MANIFEST}")
        check_commit_state(fs, path, manifest, url)  # a newer commit claimed: never read a mix
        return cls(fs, path, manifest, url, storage_options, allow_incomplete)

    @classmethod
    @abstractmethod
    def parse_manifest(cls, raw: bytes, path: str) -> M:
        """The layout's manifest model of ``raw`` (read from ``path``), checked."""

    @property
    def backup_id(self) -> str:
        return self.manifest.backup_id if self.manifest is not None else self.path.rsplit("/", 1)[-1]

    @property
    def complete(self) -> bool:
        """The backup has a manifest (and, where the layout says more, it lists every segment)."""
        return self.manifest is not None

    # -- planning --------------------------------------------------------------------------------
    def segments(self) -> list[SegmentRef]:
        """Every segment in (topic, partition, sequence) order, listed once and checked."""
        if self._segments is None:
            self._segments = check_order(sorted(self._list_segments(), key=lambda r: (r.topic, r.partition, r.seq)))
        return list(self._segments)

    @abstractmethod
    def _list_segments(self) -> list[SegmentRef]:
        """The refs of every segment (any order): from the manifest, checked against the
        store, or (no manifest) from a listing of the store."""

    def select(
        self,
        topics: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> list[SegmentRef]:
        """Segments that may hold records matching the filters (pruned on metadata only)."""
        tset = None if topics is None else set(topics)
        pset = None if partitions is None else set(partitions)
        return [
            r for r in self.segments()
            if (tset is None or r.topic in tset)
            and (pset is None or r.partition in pset)
            and r.may_contain(start_offset, end_offset, start_time, end_time)
        ]

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in self.segments():
            parts = out.setdefault(r.topic, [])
            if r.partition not in parts:
                parts.append(r.partition)
        return out

    @abstractmethod
    def check_unread(self, refs: Iterable[SegmentRef]) -> None:
        """Probe the segments a scan prunes on the manifest's offsets (a small ranged read
        each) and compare what their files say with it: a pruned segment whose file holds
        other offsets is an error, never rows silently left out."""

    # -- batch indexes (a layout without them: none to use) ------------------------------------
    def batch_index(self, ref: SegmentRef) -> BatchIndex | None:
        """The segment's checked batch index (kbs-format.md §7), or None when there is none to use."""
        return None

    def check_time_bounds(self, refs: list[SegmentRef]) -> list[SegmentRef]:
        """``refs`` with ``time_checked`` set where data confirms the manifest's time range
        (then a time filter may prune the segment)."""
        return list(refs)

    # -- reading ---------------------------------------------------------------------------------
    def read_segment_bytes(self, ref: SegmentRef) -> bytes:
        """A whole segment file, its size checked against the ref."""
        try:
            data = self.fs.cat_file(ref.path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        check_size(ref, len(data))
        return data

    def read_segment(self, ref: SegmentRef) -> bytes | memoryview:
        """A whole segment file, for decoding: :meth:`read_segment_bytes`, except that local
        files are read straight into Arrow pool memory (see :mod:`~fsspec_kbs.store.pooled`;
        other filesystems' bytes come from their network layer anyway)."""
        if not isinstance(self.fs, LocalFileSystem):
            return self.read_segment_bytes(ref)
        try:
            with self.fs.open(ref.path, "rb") as f:
                data = read_pooled(f, f.size + 1)  # one byte more: a file grown past its size shows
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e
        check_size(ref, len(data))
        return data

    def _segment_size(self, ref: SegmentRef) -> int:
        try:
            return int(self.fs.size(ref.path))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise segment_missing(ref, e) from e

    @abstractmethod
    def open_chunks(self, ref: SegmentRef, verify_checksums: bool = True,
                    bounds: Bounds | None = None) -> OpenedSegment:
        """Open a segment for decoding chunk by chunk (see :meth:`iter_columns`); ``bounds``
        (start and end offset, start and end time; end exclusive) let a layout read less.
        Close the result (or let :func:`iter_opened` do it)."""

    @abstractmethod
    def rediagnose(self, ref: SegmentRef, verify_checksums: bool, err: SegmentFormatError) -> NoReturn:
        """Raise the error a read of ``ref`` whole names first (``err`` if it finds none), so
        the error of a failed read does not depend on the order its checks ran in."""

    def iter_columns(self, ref: SegmentRef, verify_checksums: bool = True,
                     max_chunk_bytes: int = 32 * 1024 * 1024,
                     views: bool = False, threads: int | None = None,
                     bounds: Bounds | None = None) -> Iterator[RecordColumns | ViewColumns]:
        """Decode one segment in chunks of about ``max_chunk_bytes`` of record data, each
        cross-checked against what the manifest says of it (:meth:`open_chunks`); any format
        error is re-diagnosed (:meth:`rediagnose`).

        With ``views`` the chunks may be :class:`~fsspec_kbs.format.ViewColumns`: Arrow views
        into the decompressed batches, no copy of the record data (KBS; OSO records are
        copied). ``threads`` decode chunks at once (default:
        :data:`~fsspec_kbs.threads.DECODE_THREADS`).
        """
        try:
            yield from iter_opened(self.open_chunks(ref, verify_checksums, bounds), max_chunk_bytes, views, threads)
        except SegmentFormatError as err:
            self.rediagnose(ref, verify_checksums, err)

    # -- checking --------------------------------------------------------------------------------
    @abstractmethod
    def validate_segment(self, ref: SegmentRef, deep: bool, report: ValidationSink,
                         check_columns: Callable[[RecordColumns], None] | None = None) -> None:
        """Check one segment for ``kbs validate`` (quick: its file against the manifest;
        ``deep``: also every checksum and record, each chunk passed to ``check_columns``).
        Raises the first defect; defects that do not stop the segment's checks go to ``report``."""

    def manifest_defects(self, refs: list[SegmentRef]) -> list[KbsError]:
        """Disagreements inside the manifest (totals against its own segment entries), for ``kbs validate``."""
        return []

    def check_totals(self) -> None:
        """Once every segment was read whole: the manifest's totals equal what the segments
        hold (where the layout's manifest claims totals)."""

    # -- what a reader elsewhere is told ---------------------------------------------------------
    def max_uncompressed(self, ref: SegmentRef) -> int | None:
        """A bound on ``ref``'s decompressed size for a reader built without the manifest
        (:meth:`set_max_uncompressed`); None: the layout bounds its units itself."""
        return None

    def set_max_uncompressed(self, limits: Mapping[str, int]) -> None:  # noqa: B027 - optional hook
        """Take the bounds :meth:`max_uncompressed` gave (segment path -> bytes) on a backup
        built without its manifest (Spark executors)."""

    # -- describing ------------------------------------------------------------------------------
    @abstractmethod
    def describe(self) -> BackupDescription:
        """What ``kbs describe`` shows."""

    def gaps(self) -> list[dict[str, Any]]:
        """Offset ranges the source no longer had when the backup was taken (as noted)."""
        return []

    @property
    def manifest_extra(self) -> dict[str, Any]:
        """The manifest's fields beyond the layout's model (kbs-format.md §3: kept by every
        rewrite): e.g. ``kafka.partition_counts``, streaming sinks' batch records."""
        return {}

    @abstractmethod
    def origin(self) -> Origin:
        """When and from which cluster the backup was taken (for a copy in either layout)."""

    @abstractmethod
    def copy_fields(self) -> dict[str, Any]:
        """The manifest fields a KBS copy of this backup carries over (``kbs convert``)."""
