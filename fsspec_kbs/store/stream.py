"""Stream one large KBS segment through a file object instead of reading it whole.

:class:`~fsspec_kbs.format.segment.SegmentReader` needs the complete segment in memory (it
checks the CRC-64 before decoding anything). For large segments that buffer dominates a
scan's peak memory, so :class:`SegmentStream` reads header, batches and footer sequentially,
keeping only the compressed frames of the chunk being decoded. It checks every batch CRC-32
before decoding that batch (the segment CRC-64 is only known at the end), computes the
CRC-64 incrementally and checks it, with the footer and header counts, after the last batch.

Consequence (docs/format-decisions.md, "Large segments are streamed"): a CRC-64 mismatch is
raised after the batches before it were yielded, each of them having passed its own CRC-32.
Materialising readers still fail as a whole.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from collections.abc import Iterator
from typing import IO

import numpy as np

from fsspec_kbs.errors import (
    ChecksumError,
    DecompressionError,
    SegmentMismatchError,
    TruncatedSegmentError,
)
from fsspec_kbs.format import segment as seg
from fsspec_kbs.format.checksums import crc32, crc64_xz
from fsspec_kbs.format.codecs import Codec, decompress
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.records import Payload, as_uint8
from fsspec_kbs.format.segment import (
    BATCH_HEADER_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    BatchInfo,
    SegmentFooter,
    SegmentHeader,
    SegmentReader,
    read_batch_header,
)

#: Segments at least this large are streamed by ``KbsBackup.iter_columns``.
STREAM_MIN_BYTES = 16 * 1024 * 1024
#: fsspec block size of a streamed file (the read-ahead on remote filesystems).
STREAM_BLOCK_SIZE = 4 * 1024 * 1024


class _Chunk(SegmentReader):
    """The compressed frames of a run of whole batches, by the file position of their header.

    Decoding and order checks are :class:`SegmentReader`'s own (``_decode``, ``_check_order``);
    the :class:`BatchInfo` positions stay file positions, so every error names the file offset.
    """

    def __init__(self, frames: dict[int, bytes], header: SegmentHeader, path: str | None) -> None:
        # No super().__init__(): it parses and checks a whole file. The CRC-32s of these
        # batches were checked while they were read.
        self.frames = frames
        self.header = header
        self.path = path
        self._check_batch_crc = False

    def payload(self, info: BatchInfo) -> Payload:
        frame = self.frames[info.position]
        try:
            raw = decompress(self.codec, frame, info.uncompressed_size)
        except DecompressionError as e:
            raise e.located(self.path or "<segment>", info.position) from e
        return Payload(as_uint8(raw), info.base_offset, info.record_count)


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

    def __init__(self, f: IO[bytes], size: int, path: str | None = None, verify_checksums: bool = True) -> None:
        self.f = f
        self.size = size
        self.path = path
        self.verify = verify_checksums
        f.seek(0)
        self.header = SegmentHeader.parse(self._read(min(size, HEADER_SIZE), 0), path)
        self.footer = self._parse_footer()

    @property
    def codec(self) -> Codec:
        return self.header.codec

    def _read(self, n: int, pos: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:  # only when the file shrank after its size was taken
            raise TruncatedSegmentError(
                f"file ends after {pos + len(data)} bytes, expected {self.size}", self.path, pos + len(data))
        return data

    def _parse_footer(self) -> SegmentFooter:
        if self.size < HEADER_SIZE + FOOTER_SIZE:
            return SegmentFooter.parse(bytes(self.size), self.path)  # raises: file too short
        self.f.seek(self.size - FOOTER_SIZE)
        tail = self._read(FOOTER_SIZE, self.size - FOOTER_SIZE)
        self.f.seek(HEADER_SIZE)
        # SegmentFooter.parse takes the whole file (its size is in its checks and messages).
        # np.zeros is calloc'd: the untouched pages of this stand-in are never backed by memory.
        stand_in = np.zeros(self.size, dtype=np.uint8)
        stand_in[-FOOTER_SIZE:] = np.frombuffer(tail, dtype=np.uint8)
        return SegmentFooter.parse(memoryview(stand_in), self.path)

    def _batch(self, pos: int, index: int, prev_base: int) -> tuple[BatchInfo, bytes, bytes]:
        """Read the batch at ``pos``: header checks as ``SegmentReader.batches``, then CRC-32."""
        end = self.size - FOOTER_SIZE
        # Read no header bytes past the footer: read_batch_header reports the stray bytes.
        head = self._read(BATCH_HEADER_SIZE, pos) if end - pos >= BATCH_HEADER_SIZE else b""
        info = read_batch_header(head, pos, index, prev_base, end, self.codec, self.path, data_start=pos)
        frame = self._read(info.compressed_size, info.data_position)
        if self.verify:
            actual = crc32(frame)
            if actual != info.crc:
                raise ChecksumError(
                    f"batch {index} CRC-32 is {actual:#010x} but its header says {info.crc:#010x}",
                    self.path, pos + 20)
        return info, head, frame

    def _chunks(self, max_chunk_bytes: int) -> Iterator[tuple[_Chunk, list[BatchInfo]]]:
        """Runs of whole checked batches of about ``max_chunk_bytes`` (uncompressed); then the end checks."""
        crc = crc64_xz(b"")
        end = self.size - FOOTER_SIZE
        pos = HEADER_SIZE
        batches = records = 0
        prev_base = -1
        while pos < end:
            size = 0
            group: list[BatchInfo] = []
            frames: dict[int, bytes] = {}
            while pos < end and size < max_chunk_bytes:
                info, head, frame = self._batch(pos, batches, prev_base)
                if self.verify:
                    crc = crc64_xz(frame, crc64_xz(head, crc))
                group.append(info)
                frames[pos] = frame
                size += info.uncompressed_size
                records += info.record_count
                prev_base = info.base_offset
                batches += 1
                pos = info.end
            yield _Chunk(frames, self.header, self.path), group
            del frames
        # The whole-segment checks of SegmentReader, in its order, now that every byte was read.
        if self.verify and crc != self.header.checksum:
            raise ChecksumError(
                f"segment CRC-64 is {crc:#018x} but the header says {self.header.checksum:#018x}", self.path, 24)
        h = self.header
        if records != h.record_count:
            raise SegmentMismatchError(
                f"header says {h.record_count} records but the batches hold {records}", self.path, 16)
        if batches != self.footer.batch_count:
            raise SegmentMismatchError(
                f"footer says {self.footer.batch_count} batches but the file holds {batches}",
                self.path, self.size - FOOTER_SIZE + 8)
        if batches == 0 and h.first_offset != 0:
            raise SegmentMismatchError(
                f"header first offset {h.first_offset} but the first batch starts at 0", self.path, 8)

    def iter_columns(self, max_chunk_bytes: int = 32 * 1024 * 1024, threads: int | None = None,
                     views: bool = False) -> Iterator[RecordColumns | ViewColumns]:
        """Decode in chunks of whole batches of about ``max_chunk_bytes`` (uncompressed).

        With ``threads`` > 1 (default as :meth:`SegmentReader.iter_columns`) the next chunk
        is read while the ones before it are decoded on the shared decode pool; chunks are
        still yielded, checked and failed in order. ``views`` as for
        :meth:`SegmentReader.iter_columns`.
        """
        if threads is None:
            threads = getattr(seg._local, "threads", None) or seg.DECODE_THREADS
        prev_last = -1
        first_checked = False
        pending: deque[tuple[_Chunk, list[BatchInfo], cf.Future]] = deque()
        try:
            for chunk, group in self._chunks(max_chunk_bytes):
                if not first_checked:
                    first_checked = True
                    if self.header.first_offset != group[0].base_offset:
                        raise SegmentMismatchError(
                            f"header first offset {self.header.first_offset} but the first batch starts at "
                            f"{group[0].base_offset}", self.path, 8)
                if threads <= 1:
                    cols = chunk._decode(group, views)
                    prev_last = chunk._check_order(group, cols, prev_last)
                    yield cols
                    continue
                pending.append((chunk, group, seg._decode_pool().submit(chunk._decode, group, views)))
                del chunk
                if len(pending) >= threads * seg.CHUNKS_AHEAD_PER_THREAD:
                    done, dgroup, fut = pending.popleft()
                    cols = fut.result()
                    prev_last = done._check_order(dgroup, cols, prev_last)
                    del done, fut
                    yield cols
            while pending:
                done, dgroup, fut = pending.popleft()
                cols = fut.result()
                prev_last = done._check_order(dgroup, cols, prev_last)
                del done, fut
                yield cols
        finally:
            for _c, _g, f in pending:
                f.cancel()
        last = prev_last if first_checked else 0
        if last != self.footer.last_offset:
            raise SegmentMismatchError(
                f"footer last offset {self.footer.last_offset} but the last record is at {last}",
                self.path, self.size - FOOTER_SIZE)
