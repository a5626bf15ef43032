"""Streamed reads of large segments (store/stream.py) agree with the whole-segment reader."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from fsspec_kbs.errors import KbsError
from fsspec_kbs.format import Codec, RecordColumns, SegmentReader, encode_batches, encode_segment
from fsspec_kbs.format.segment import BATCH_HEADER_SIZE, FOOTER_SIZE, HEADER_SIZE
from fsspec_kbs.store import BackupWriter
from fsspec_kbs.store.open import open_backup
from fsspec_kbs.store.stream import SegmentStream

STREAM_ALL = 0  # a stream_min_bytes that streams every segment


def _records(chunks: list[RecordColumns]) -> list[dict]:
    return [r for c in chunks for r in c.records()]


def _random_columns(seed: int, n: int = 400) -> RecordColumns:
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.integers(1, 4, n)) + int(rng.integers(0, 1000))
    recs = []
    for i in range(n):
        def blob(p_null: float, hi: int) -> bytes | None:
            return None if rng.random() < p_null else rng.bytes(int(rng.integers(0, hi)))
        headers = [(f"h{j}", blob(0.2, 8)) for j in range(int(rng.integers(0, 3)))]
        recs.append({"offset": int(offsets[i]), "timestamp": int(1_700_000_000_000 + rng.integers(-5000, 5000)),
                     "key": blob(0.2, 20), "value": blob(0.1, 300), "headers": headers})
    return RecordColumns.from_records(recs)


def _segment(codec: Codec, seed: int = 1) -> bytes:
    data, _ = encode_segment(encode_batches(_random_columns(seed), max_bytes=2000), codec)
    return data


def _stream(path: Path, **kw: object) -> list[RecordColumns]:
    with open(path, "rb") as f:
        return list(SegmentStream(f, path.stat().st_size, str(path)).iter_columns(**kw))  # type: ignore[arg-type]


def _outcome(fn) -> tuple[str, str | None, int | None, str]:  # type: ignore[no-untyped-def]
    """(error class, path, offset, message) of calling ``fn``, or ("ok", ...) with its records."""
    try:
        out = fn()
    except KbsError as e:
        return type(e).__name__, getattr(e, "path", None), getattr(e, "offset", None), str(e)
    return "ok", None, None, repr(_records(out))


def _read_backup(url: str, stream_min_bytes: int, chunk: int = 32 << 20, threads: int | None = None) -> list[RecordColumns]:
    backup = open_backup(url)
    backup.stream_min_bytes = stream_min_bytes
    return [c for ref in backup.segments() for c in backup.iter_columns(ref, max_chunk_bytes=chunk, threads=threads)]


@pytest.mark.conformance
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk", [1, 4096, 32 << 20])
def test_conformance_vectors_streamed_equal_whole(conformance: Path, threads: int, chunk: int) -> None:
    valid = sorted(conformance.glob("valid/*/backup-1"))
    assert valid
    for url in valid:
        streamed = _read_backup(str(url), STREAM_ALL, chunk, threads)
        whole = _read_backup(str(url), 2**62, chunk, threads)
        assert _records(streamed) == _records(whole)
        assert len(_records(streamed)) > 0


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("threads", [1, 2])
def test_random_segments_streamed_equal_whole(tmp_path: Path, codec: Codec, threads: int) -> None:
    for seed in range(3):
        data = _segment(codec, seed)
        path = tmp_path / f"s{seed}.kbs"
        path.write_bytes(data)
        whole = SegmentReader(data, str(path)).read_all()
        assert whole is not None
        for chunk in (1, 3000, 1 << 30):
            chunks = _stream(path, max_chunk_bytes=chunk, threads=threads)
            if chunk == 1:
                assert len(chunks) == SegmentReader(data).footer.batch_count > 1
            assert _records(chunks) == whole.records()


def test_empty_segment_streams(tmp_path: Path) -> None:
    data, _ = encode_segment([], Codec.ZSTD)
    path = tmp_path / "e.kbs"
    path.write_bytes(data)
    assert _stream(path) == []


def test_backup_roundtrip_streamed(tmp_path: Path) -> None:
    url = str(tmp_path / "backup-1")
    cols = _random_columns(7, 3000)
    with BackupWriter(url, segment_max_bytes=20_000, batch_max_bytes=3000) as w:
        w.write_columns("t", 0, cols)
    backup = open_backup(url)
    assert len(backup.segments()) > 2
    for threads in (1, 2):
        assert _records(_read_backup(url, STREAM_ALL, 5000, threads)) == cols.records()


@pytest.mark.conformance
def test_corrupt_vectors_same_error(conformance: Path, tmp_path: Path) -> None:
    cases = sorted(p.parent for p in conformance.glob("corrupt/*/backup-1"))
    assert cases
    for case in cases:
        url = str(case / "backup-1")
        seen = [_outcome(partial(_read_backup, url, t)) for t in (STREAM_ALL, 2**62)]
        assert seen[0] == seen[1], case.name
        assert seen[0][0] != "ok", case.name
    # The stream's own checks (without re-diagnosis) also reject every corrupt segment,
    # naming the file and a byte offset inside it.
    for case in cases:
        for seg in (case / "backup-1").rglob("*.kbs"):
            good = conformance / "valid" / "zstd-v1.1" / seg.relative_to(case)
            if good.exists() and good.read_bytes() == seg.read_bytes():
                continue
            name, path, offset, _ = _outcome(partial(_stream, seg))
            if seg.stat().st_size == good.stat().st_size or name != "ok":
                assert name != "ok", seg
                assert path == str(seg) and offset is not None and 0 <= offset <= good.stat().st_size


def _flip_positions(data: bytes) -> list[int]:
    """Every header, batch header and footer byte, and a few bytes of each frame."""
    reader = SegmentReader(data)
    out = list(range(HEADER_SIZE)) + list(range(len(data) - FOOTER_SIZE, len(data)))
    for info in reader.batches():
        out += range(info.position, info.position + BATCH_HEADER_SIZE)
        out += [info.data_position, (info.data_position + info.end) // 2, info.end - 1]
    return sorted(set(out))


@pytest.mark.parametrize("codec", list(Codec))
def test_flips_and_truncations_same_error(tmp_path: Path, codec: Codec) -> None:
    src = tmp_path / "src" / "backup-1"
    cols = _random_columns(3, 300)
    with BackupWriter(str(src), compression=codec.name.lower(), segment_max_bytes=1 << 30,
                      batch_max_bytes=2000) as w:
        w.write_columns("t", 0, cols)
    (seg,) = list(src.rglob("*.kbs"))
    data = seg.read_bytes()
    work = tmp_path / "work" / "backup-1"
    shutil.copytree(src, work)
    target = work / seg.relative_to(src)

    def both() -> list[tuple]:
        return [_outcome(partial(_read_backup, str(work), t, 3000)) for t in (STREAM_ALL, 2**62)]

    checked = 0
    for pos in _flip_positions(data):
        for bit in (0x01, 0x80):
            buf = bytearray(data)
            buf[pos] ^= bit
            target.write_bytes(bytes(buf))
            streamed, whole = both()
            assert streamed == whole, (pos, bit)
            # The stream alone: a clear error with file and offset, or the same records.
            name, path, offset, msg = _outcome(lambda: _stream(target, max_chunk_bytes=3000))
            if whole[0] == "ok":
                assert (name, msg) == ("ok", whole[3]), (pos, bit)
            else:
                assert name != "ok", (pos, bit)
                assert path == str(target) and offset is not None and 0 <= offset <= len(data), (pos, bit, msg)
            checked += 1
    for cut in (1, 10, FOOTER_SIZE, FOOTER_SIZE + 1, len(data) // 2, len(data) - HEADER_SIZE, len(data)):
        target.write_bytes(data[: len(data) - cut])
        streamed, whole = both()
        assert streamed == whole and streamed[0] != "ok", cut
        name, path, offset, _ = _outcome(lambda: _stream(target))
        assert name != "ok" and path == str(target) and offset is not None, cut
    assert checked > 100


@pytest.mark.s3
def test_streamed_from_s3_with_flip(s3_root: str, s3_storage_options: dict, tmp_path: Path) -> None:
    import fsspec

    from fsspec_kbs.store.backup import KbsBackup

    local = tmp_path / "backup-1"
    cols = _random_columns(11, 2000)
    with BackupWriter(str(local), segment_max_bytes=30_000, batch_max_bytes=3000) as w:
        w.write_columns("t", 0, cols)
    url = f"{s3_root}/backup-1"
    s3 = fsspec.filesystem("s3", **s3_storage_options)
    s3.put(str(local), url, recursive=True)
    backup = KbsBackup.open(url, s3_storage_options)
    backup.stream_min_bytes = STREAM_ALL
    assert _records([c for r in backup.segments() for c in backup.iter_columns(r, max_chunk_bytes=4000)]) \
        == cols.records()
    ref = backup.segments()[1]
    data = bytearray(s3.cat_file(ref.path))
    data[len(data) // 2] ^= 0x10
    s3.pipe_file(ref.path, bytes(data))
    seen = []
    for t in (STREAM_ALL, 2**62):
        b = KbsBackup.open(url, s3_storage_options)
        b.stream_min_bytes = t
        seen.append(_outcome(partial(list, b.iter_columns(b.segments()[1]))))
    assert seen[0] == seen[1] and seen[0][0] != "ok" and seen[0][1] == ref.path


def test_segment_shrinking_while_streamed_names_where_it_ends(tmp_path: Path) -> None:
    """The size is taken when the stream opens; a file cut later fails at the byte it ends."""
    from fsspec_kbs.errors import TruncatedSegmentError

    path = tmp_path / "s.kbs"
    data = _segment(Codec.ZSTD)
    path.write_bytes(data)
    cut = len(data) // 2
    with open(path, "rb") as f:
        stream = SegmentStream(f, len(data), str(path))
        with open(path, "r+b") as g:
            g.truncate(cut)
        with pytest.raises(TruncatedSegmentError) as e:
            list(stream.iter_columns())
    assert e.value.offset == cut and str(path) in str(e.value)


def test_read_pooled_gathers_short_reads_and_stops_at_the_end() -> None:
    import io

    from fsspec_kbs.store.pooled import read_pooled

    class Trickle(io.RawIOBase):  # hands out at most 7 bytes per call, like a slow pipe
        def __init__(self, data: bytes) -> None:
            self.src = io.BytesIO(data)

        def readinto(self, b) -> int:  # type: ignore[no-untyped-def, override]
            chunk = self.src.read(min(7, len(b)))
            b[: len(chunk)] = chunk
            return len(chunk)

    data = bytes(range(256)) * 3
    assert bytes(read_pooled(Trickle(data), 500)) == data[:500]
    assert bytes(read_pooled(Trickle(data), 10_000)) == data  # fewer only at the end
    assert bytes(read_pooled(Trickle(b""), 16)) == b""
