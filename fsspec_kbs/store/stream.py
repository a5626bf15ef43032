"""Stream one large KBS segment through a file object instead of reading it whole.

:class:`~fsspec_kbs.format.segment.SegmentReader` needs the complete segment in memory (it
checks the CRC-64 before decoding anything). For large segments that buffer dominates a
scan's peak memory, so :class:`SegmentStream` reads header, batches and footer sequentially,
keeping only the compressed frames of the chunks being decoded. Like
``SegmentReader(crc64_last=True)``, each decoding thread checks every batch CRC-32 before
decoding that batch and computes its chunk's share of the segment CRC-64; the shares are
joined in order and checked, with the footer and header counts, after the last batch.

Consequence (docs/format-decisions.md, "Large segments are streamed"): a CRC-64 mismatch is
raised after the batches before it were yielded, each of them having passed its own CRC-32.
Materialising readers still fail as a whole.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import IO, NoReturn

from fsspec_kbs.errors import TruncatedSegmentError
from fsspec_kbs.format import segment as seg
from fsspec_kbs.format.checksums import crc64_xz
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.segment import (
    BATCH_HEADER_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    BatchDecoder,
    BatchInfo,
    SegmentChecks,
    SegmentFooter,
    SegmentHeader,
    read_batch_header,
)
from fsspec_kbs.store.pooled import read_pooled

#: Segments at least this large are streamed by ``KbsBackup.iter_columns``. One read-ahead
#: block: a smaller file would be fetched in one request anyway. Segments read whole are held
#: ahead of the consumer by the scan's reading threads, so this bounds what they hold (at
#: 16 MiB, a 5 GB scan whose partitions end in 15 MB segments peaked ~28 MB higher).
STREAM_MIN_BYTES = 4 * 1024 * 1024
#: fsspec block size of a streamed file (the read-ahead on remote filesystems).
STREAM_BLOCK_SIZE = 4 * 1024 * 1024


class _ChunkBytes(BatchDecoder):
    """The bytes of a run of whole batches read from the file one batch at a time (each
    batch's header and frame together, by the file position of its header): the decoder's
    checks and decoding over non-contiguous buffers."""

    def __init__(self, parts: dict[int, memoryview], codec: Codec, path: str | None, verify: bool) -> None:
        super().__init__(b"", 0, codec, path, check_crc32=verify, crc64_shares=verify)
        self.parts = parts

    def frame(self, info: BatchInfo) -> memoryview:
        return self.parts[info.position][BATCH_HEADER_SIZE:]

    def crc64_share(self, group: Sequence[BatchInfo]) -> int:
        crc = 0
        for info in group:
            crc = crc64_xz(self.parts[info.position], crc)
        return crc


class SegmentStream:
    """Checks and decodes one segment read sequentially from an open binary file.

    Parameters
    ----------
    f : file-like
        Opened for reading (``fs.open(path, "rb", ...)``); must support ``seek``.
    size : int
        The file's size in bytes.
    path : str, optional
        Named in every error.
    verify_checksums : bool, default True
        Check every batch CRC-32 (before decoding that batch) and the segment CRC-64 (at the end).
    """

    _counts: tuple[int, int] | None = None  # (records, batches), once every batch was read

    def __init__(self, f: IO[bytes], size: int, path: str | None = None, verify_checksums: bool = True) -> None:
        self.f = f
        self.size = size
        self.path = path
        self.verify = verify_checksums
        f.seek(0)
        self.header = SegmentHeader.parse(self._read(min(size, HEADER_SIZE), 0), path)
        self.footer = self._parse_footer()
        self.checks = SegmentChecks(self.header, self.footer, size, path, crc64_last=verify_checksums)
        self._first_base: int | None = None

    @property
    def codec(self) -> Codec:
        return self.header.codec

    def _read(self, n: int, pos: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            self._truncated(pos + len(data))
        return data

    def _truncated(self, at: int) -> NoReturn:
        # Only when the file shrank after its size was taken.
        raise TruncatedSegmentError(f"file ends after {at} bytes, expected {self.size}", self.path, at)

    def _parse_footer(self) -> SegmentFooter:
        if self.size < HEADER_SIZE + FOOTER_SIZE:
            return SegmentFooter.parse_tail(b"", self.size, self.path)  # raises: file too short
        self.f.seek(self.size - FOOTER_SIZE)
        tail = self._read(FOOTER_SIZE, self.size - FOOTER_SIZE)
        self.f.seek(HEADER_SIZE)
        return SegmentFooter.parse_tail(tail, self.size, self.path)

    def _batch(self, pos: int, index: int, prev_base: int) -> tuple[BatchInfo, memoryview]:
        """Read the batch at ``pos`` (header and frame, in one buffer), with the header checks
        of ``SegmentReader.batches``."""
        end = self.size - FOOTER_SIZE
        # Read no header bytes past the footer: read_batch_header reports the stray bytes.
        head = self._read(BATCH_HEADER_SIZE, pos) if end - pos >= BATCH_HEADER_SIZE else b""
        info = read_batch_header(head, pos, index, prev_base, end, self.codec, self.path, data_start=pos)
        data = read_pooled(self.f, info.compressed_size, prefix=head)  # one CRC-64 call covers both
        if len(data) != info.end - pos:
            self._truncated(pos + len(data))
        return info, data

    def _chunks(self, max_chunk_bytes: int) -> Iterator[tuple[_ChunkBytes, list[BatchInfo]]]:
        """Runs of whole batches of about ``max_chunk_bytes`` (uncompressed), not yet checksummed."""
        end = self.size - FOOTER_SIZE
        pos = HEADER_SIZE
        batches = records = 0
        prev_base = -1
        while pos < end:
            size = 0
            group: list[BatchInfo] = []
            parts: dict[int, memoryview] = {}
            while pos < end and size < max_chunk_bytes:
                info, parts[pos] = self._batch(pos, batches, prev_base)
                group.append(info)
                size += info.uncompressed_size
                records += info.record_count
                prev_base = info.base_offset
                batches += 1
                pos = info.end
            if self._first_base is None and group:
                self._first_base = group[0].base_offset
            yield _ChunkBytes(parts, self.codec, self.path, self.verify), group
            del parts
        self._counts = (records, batches)

    def decode_tasks(self, max_chunk_bytes: int, views: bool = False) -> Iterator[seg.DecodeTask]:
        """Read the batches chunk by chunk (here, on the calling thread); decode each on call."""
        for chunk, group in self._chunks(max_chunk_bytes):
            task = functools.partial(chunk.decode, group, views)
            del chunk  # only the task keeps the chunk's bytes, until it ran
            yield group, task

    def iter_columns(self, max_chunk_bytes: int = 32 * 1024 * 1024, threads: int | None = None,
                     views: bool = False) -> Iterator[RecordColumns | ViewColumns]:
        """Decode in chunks of whole batches of about ``max_chunk_bytes`` (uncompressed).

        With ``threads`` > 1 (default as :meth:`SegmentReader.iter_columns`) the next chunks
        are read while the ones before them are decoded on the shared decode pool; chunks
        are still yielded, checked and failed in order. ``views`` as for
        :meth:`SegmentReader.iter_columns`.
        """
        return seg.iter_checked(self, max_chunk_bytes, threads, views)

    # ChunkSource: the walk reads batch by batch, so the counts are checked at the end.
    def check_first(self, group: Sequence[BatchInfo]) -> None:
        self.checks.first(group)

    def check_order(self, group: Sequence[BatchInfo], cols: RecordColumns | ViewColumns, prev_last: int) -> int:
        return self.checks.order(group, cols, prev_last)

    def join_crc64(self, shares: list[int], groups: list[Sequence[BatchInfo]]) -> int:
        return self.checks.join(shares, groups)

    def check_end(self, crc: int, last: int) -> None:
        records, batches = self._counts or (0, 0)
        self.checks.end(crc, last, (records, batches, self._first_base))
