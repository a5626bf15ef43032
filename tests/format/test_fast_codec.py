"""The compiled codec against its own interpreted fallback, plus the fast paths' own machinery.

The reference decoder is the same kernel code run by the Python interpreter: in a subprocess
with ``FSSPEC_KBS_NO_JIT=1`` (nothing compiled at all) and in-process through ``py_func``.
Both must agree with the compiled kernels on valid batches, on random byte mutations of valid
batches and on every corrupt conformance case: same records, or the same error class and code,
never a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsspec_kbs
from fsspec_kbs.dataset import KbsDataset
from fsspec_kbs.errors import KbsError
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.format import kernels as k
from fsspec_kbs.format.codecs import Codec
from fsspec_kbs.format.records import (
    ColumnsBuilder,
    Payload,
    RecordDecodeError,
    ViewsBuilder,
    decode_payloads,
    encode_batches,
)
from fsspec_kbs.format.segment import (
    SegmentReader,
    encode_segment,
)
from fsspec_kbs.store import BackupWriter
from tests.conftest import CONFORMANCE

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("offsets", "timestamps", "key_offsets", "key_data", "key_valid", "value_offsets", "value_data",
          "value_valid", "header_offsets", "header_key_offsets", "header_key_data", "header_value_offsets",
          "header_value_data", "header_value_valid")

pytestmark = pytest.mark.skipif(not k.JIT_ENABLED, reason="compares the compiled kernels with the fallback")


def _records(rng: np.random.Generator, n: int) -> RecordColumns:
    recs = []
    off = int(rng.integers(0, 1000))
    ts = 1_700_000_000_000
    for _ in range(n):
        off += int(rng.integers(1, 4))
        ts += int(rng.integers(-50, 50))
        hs = [(f"h{j}", None if rng.random() < 0.2 else rng.bytes(int(rng.integers(0, 20))))
              for j in range(int(rng.integers(0, 3)))]
        recs.append({"offset": off, "timestamp": ts,
                     "key": None if rng.random() < 0.1 else rng.bytes(int(rng.integers(0, 40))),
                     "value": None if rng.random() < 0.1 else rng.bytes(int(rng.integers(0, 300))),
                     "headers": hs})
    return RecordColumns.from_records(recs)


def _payloads(seed: int, n: int = 60, max_bytes: int = 2000) -> list[Payload]:
    cols = _records(np.random.default_rng(seed), n)
    return [Payload(b.data, b.base_offset, b.count) for b in encode_batches(cols, max_bytes)]


def _mutate(rng: np.random.Generator, p: Payload) -> Payload:
    data = bytearray(p.data.tobytes())
    kind = int(rng.integers(0, 4))
    if kind == 0 and data:  # flip bytes
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
    elif kind == 1 and data:  # cut
        data = data[: int(rng.integers(0, len(data)))]
    elif kind == 2:  # insert
        at = int(rng.integers(0, len(data) + 1))
        data[at:at] = rng.bytes(int(rng.integers(1, 12)))
    else:  # wrong record count
        return Payload(np.frombuffer(bytes(data), np.uint8), p.base_offset, max(1, p.count + int(rng.integers(-2, 3))))
    return Payload(np.frombuffer(bytes(data), np.uint8), p.base_offset, p.count)


def _decoded(builder: ColumnsBuilder | ViewsBuilder, p: Payload, digest: Callable) -> tuple:
    """("ok", ``digest`` of the decoded columns) or ("error", code, position) of ``builder`` on ``p``."""
    try:
        builder.add(p)
    except RecordDecodeError as e:
        return ("error", e.code, e.position)
    return ("ok", digest(builder.finish()))


def _columns(fields: tuple[str, ...]) -> Callable:
    return lambda cols: [getattr(cols, f).tolist() for f in fields]


def _outcome(payload: Payload) -> tuple:
    """("ok", digest of every column) or ("error", code, position), via the current kernels."""
    return _decoded(ColumnsBuilder(), payload, _columns(FIELDS))


def _fill_py(p: Payload) -> tuple:
    """Decode with the interpreted kernels (``py_func``) in this process."""
    return _decoded(ColumnsBuilder(scan=k.scan_records.py_func, fill=k.fill_records.py_func), p, _columns(FIELDS))


VIEW_FIELDS = ("offsets", "timestamps", "key_views", "key_valid", "value_views", "value_valid",
               "header_offsets", "header_key_views", "header_value_views", "header_value_valid")


def _views(p: Payload, py: bool) -> tuple:
    """("ok", every view column) or ("error", code, position) of the views decoder."""
    b = (ViewsBuilder(p.count, scan=k.scan_records.py_func, fill=k.fill_views.py_func) if py
         else ViewsBuilder(p.count))
    return _decoded(b, p, _columns(VIEW_FIELDS))


def _views_as_copies(p: Payload) -> tuple:
    """The views decoder's outcome in the shape of :func:`_outcome` (bytes read through Arrow)."""
    from fsspec_kbs.arrow.convert import columns_to_batch

    def rows(cols: ViewColumns) -> list:
        return columns_to_batch(cols, "t", 0).cast(columns_to_batch(decode_payloads([p]), "t", 0).schema).to_pylist()

    return _decoded(ViewsBuilder(p.count), p, rows)


def _copies(p: Payload) -> tuple:
    from fsspec_kbs.arrow.convert import columns_to_batch

    out = _outcome(p)
    return out if out[0] == "error" else ("ok", columns_to_batch(decode_payloads([p]), "t", 0).to_pylist())


def _mutated_corpus(count: int = 400) -> list[Payload]:
    rng = np.random.default_rng(6)
    base = [p for s in range(8) for p in _payloads(s)]
    return [_mutate(rng, base[int(rng.integers(0, len(base)))]) for _ in range(count)] + base


_NO_JIT_SCRIPT = r"""
import json, sys
import numpy as np
from fsspec_kbs.format import kernels
assert not kernels.JIT_ENABLED
from fsspec_kbs.format.records import Payload, decode_payloads, RecordDecodeError
FIELDS = %r
z = np.load(sys.argv[1])
out = []
for i in range(int(z["n"])):
    p = Payload(z[f"d{i}"], int(z["base"][i]), int(z["count"][i]))
    try:
        cols = decode_payloads([p])
        out.append(["ok", [getattr(cols, f).tolist() for f in FIELDS]])
    except RecordDecodeError as e:
        out.append(["error", e.code, e.position])
print(json.dumps(out))
"""


def _run_no_jit(script: str, *args: str) -> str:
    env = dict(os.environ, FSSPEC_KBS_NO_JIT="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_mutated_batches_agree_with_uncompiled_subprocess(tmp_path: Path) -> None:
    corpus = _mutated_corpus()
    arrays = {f"d{i}": p.data for i, p in enumerate(corpus)}
    np.savez(tmp_path / "corpus.npz", n=len(corpus), base=np.array([p.base_offset for p in corpus]),
             count=np.array([p.count for p in corpus]), **arrays)
    reference = json.loads(_run_no_jit(_NO_JIT_SCRIPT % (FIELDS,), str(tmp_path / "corpus.npz")))
    fast = [list(_outcome(p)) for p in corpus]
    assert len(reference) == len(fast)
    errors = sum(r[0] == "error" for r in reference)
    assert 0 < errors < len(corpus)  # the corpus exercises both outcomes
    for i, (a, b) in enumerate(zip(fast, reference, strict=True)):
        assert a == b, f"payload {i}: compiled {a[:3]!r} vs interpreted {b[:3]!r}"


def test_mutated_batches_agree_with_py_func() -> None:
    for i, p in enumerate(_mutated_corpus(150)):
        assert _outcome(p) == _fill_py(p), f"payload {i}"


def test_views_decoder_agrees_with_copies_and_py_func() -> None:
    """Same verdict (error code and byte) as the copying decoder, same rows; the compiled and
    interpreted view kernels write the same 16 bytes per view (zero padding included)."""
    corpus = _mutated_corpus(200)
    oks = 0
    for i, p in enumerate(corpus):
        assert _views(p, py=False) == _views(p, py=True), f"payload {i}"
        got = _views_as_copies(p)
        assert got == _copies(p), f"payload {i}"
        oks += got[0] == "ok"
    assert 0 < oks < len(corpus)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 4000), st.binary(max_size=64))
def test_random_inputs_agree(seed: int, n: int, max_bytes: int, junk: bytes) -> None:
    cols = _records(np.random.default_rng(seed), n)
    batches = encode_batches(cols, max_bytes)
    decoded = decode_payloads([Payload(b.data, b.base_offset, b.count) for b in batches])
    assert decoded.records() == cols.records()
    for b in batches:
        p = Payload(b.data, b.base_offset, b.count)
        assert _outcome(p) == _fill_py(p)
        assert _views(p, py=False) == _views(p, py=True)
        assert _views_as_copies(p) == _copies(p)
    # Arbitrary bytes as a batch: never a crash, same verdict.
    for count in (1, 3):
        p = Payload(np.frombuffer(junk, np.uint8), 0, count)
        assert _outcome(p) == _fill_py(p)
        assert _views(p, py=False) == _views(p, py=True)
        assert _views_as_copies(p)[0] == _outcome(p)[0]


def test_encoder_agrees_with_py_func() -> None:
    cols = _records(np.random.default_rng(3), 200)
    def plan(fn: Callable) -> tuple[np.ndarray, np.ndarray]:
        cuts = np.empty(len(cols) + 1, np.int64)
        sizes = np.empty(len(cols) + 1, np.int64)
        nb = fn(cols.offsets, cols.timestamps, cols.key_offsets, cols.key_valid, cols.value_offsets,
                cols.value_valid, cols.header_offsets, cols.header_key_offsets,
                cols.header_value_offsets, cols.header_value_valid, 3000, 50, cuts, sizes)
        return cuts[: nb + 1], sizes[:nb]

    cuts, sizes = plan(k.plan_batches)
    cuts_py, sizes_py = plan(k.plan_batches.py_func)
    assert len(sizes) > 3
    assert cuts.tolist() == cuts_py.tolist() and sizes.tolist() == sizes_py.tolist()
    args = (cols.offsets, cols.timestamps, cols.key_offsets, cols.key_data, cols.key_valid,
            cols.value_offsets, cols.value_data, cols.value_valid, cols.header_offsets,
            cols.header_key_offsets, cols.header_key_data, cols.header_value_offsets,
            cols.header_value_data, cols.header_value_valid)
    for b in range(len(sizes)):
        a = np.empty(int(sizes[b]), np.uint8)
        c = np.empty(int(sizes[b]), np.uint8)
        assert k.encode_records(int(cuts[b]), int(cuts[b + 1]), a, *args) == len(a)
        assert k.encode_records.py_func(int(cuts[b]), int(cuts[b + 1]), c, *args) == len(c)
        assert a.tobytes() == c.tobytes()


_ENCODE_SCRIPT = r"""
import sys
import numpy as np
from fsspec_kbs.format import kernels
assert not kernels.JIT_ENABLED
from fsspec_kbs.format.columns import RecordColumns
from fsspec_kbs.format.records import encode_batches
z = np.load(sys.argv[1])
cols = RecordColumns(**{f: z[f] for f in z.files})
sys.stdout.write("|".join(b.data.tobytes().hex() for b in encode_batches(cols, 3000, 50)))
"""


def test_encoder_agrees_with_uncompiled_subprocess(tmp_path: Path) -> None:
    cols = _records(np.random.default_rng(9), 300)
    np.savez(tmp_path / "cols.npz", **{f: getattr(cols, f) for f in FIELDS})
    reference = _run_no_jit(_ENCODE_SCRIPT, str(tmp_path / "cols.npz"))
    assert reference == "|".join(b.data.tobytes().hex() for b in encode_batches(cols, 3000, 50))


_CONFORMANCE_SCRIPT = r"""
import json, sys
import fsspec_kbs
from fsspec_kbs.format import kernels
assert not kernels.JIT_ENABLED
out = {}
for case in sys.argv[2:]:
    try:
        t = fsspec_kbs.read_table(sys.argv[1] + "/" + case + "/backup-1")
        out[case] = ["ok", t.num_rows]
    except Exception as e:
        out[case] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.mark.conformance
def test_corrupt_conformance_cases_agree(conformance: Path) -> None:
    cases = sorted(p.name for p in (conformance / "corrupt").iterdir() if p.is_dir())
    fast = {}
    for case in cases:
        try:
            fast[case] = ["ok", fsspec_kbs.read_table(str(conformance / "corrupt" / case / "backup-1")).num_rows]
        except Exception as e:
            assert isinstance(e, KbsError), f"{case}: {type(e).__name__}: {e}"
            fast[case] = [type(e).__name__, str(e)]
    reference = json.loads(_run_no_jit(_CONFORMANCE_SCRIPT, str(conformance / "corrupt"), *cases))
    assert fast == reference
    assert all(v[0] != "ok" for v in fast.values())
    for case in cases:  # the zero-copy decoder fails the same way
        with pytest.raises(KbsError) as err:
            fsspec_kbs.read_table(str(conformance / "corrupt" / case / "backup-1"), binary_view=True)
        assert [type(err.value).__name__, str(err.value)] == fast[case], case


# -- fast-path machinery --------------------------------------------------------------------------

def _segment(n: int = 3000, codec: Codec = Codec.ZSTD) -> tuple[bytes, RecordColumns]:
    cols = _records(np.random.default_rng(11), n)
    return encode_segment(encode_batches(cols, 4000), codec)[0], cols


def test_parallel_chunks_equal_sequential() -> None:
    data, cols = _segment()
    seq = list(SegmentReader(data).iter_columns(20_000, threads=1))
    par = list(SegmentReader(data).iter_columns(20_000, threads=2))
    assert len(seq) == len(par) > 2
    for a, b in zip(seq, par, strict=True):
        for f in FIELDS:
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert [r for c in par for r in c.records()] == cols.records()


def test_parallel_chunks_raise_in_order() -> None:
    data, _ = _segment()
    buf = bytearray(data)
    reader = SegmentReader(bytes(buf))
    infos = reader.batches()
    bad = infos[len(infos) // 2]
    buf[bad.data_position + 3] ^= 0xFF  # breaks the zstd frame of a middle batch (CRC-64 off)
    got = 0
    with pytest.raises(KbsError) as ei:
        for c in SegmentReader(bytes(buf), "x.kbs", verify_checksums=False).iter_columns(20_000, threads=2):
            got += len(c)
    assert "x.kbs" in str(ei.value)
    assert 0 < got < sum(i.record_count for i in infos)


def test_crc64_last_yields_checked_chunks_then_checks_the_crc64() -> None:
    from fsspec_kbs.errors import ChecksumError
    data, cols = _segment()
    for threads in (1, 2):
        chunks = list(SegmentReader(data, crc64_last=True).iter_columns(20_000, threads=threads))
        assert len(chunks) > 2 and [r for c in chunks for r in c.records()] == cols.records()
    # Every batch intact but the stored CRC-64 wrong: all rows come, then the CRC-64 fails.
    buf = bytearray(data)
    buf[24] ^= 1
    got = 0
    with pytest.raises(ChecksumError, match="segment CRC-64") as ei:
        for c in SegmentReader(bytes(buf), "x.kbs", crc64_last=True).iter_columns(20_000, threads=2):
            got += len(c)
    assert got == len(cols) and ei.value.offset == 24
    # A damaged batch is caught by its CRC-32 before it is decoded, after the chunks before it.
    buf = bytearray(data)
    infos = SegmentReader(data).batches()
    bad = infos[len(infos) // 2]
    buf[bad.data_position + 3] ^= 0xFF
    got = 0
    with pytest.raises(ChecksumError, match=f"batch {bad.index} CRC-32") as ei:
        for c in SegmentReader(bytes(buf), "x.kbs", crc64_last=True).iter_columns(20_000, threads=2):
            got += len(c)
    assert ei.value.offset == bad.position + 20
    assert 0 < got <= sum(i.record_count for i in infos[: bad.index])


def test_batch_crc_checked_when_asked_or_segment_crc_fails() -> None:
    import struct

    from fsspec_kbs.errors import ChecksumError
    from fsspec_kbs.format.checksums import crc64_xz
    data, _ = _segment(200)
    buf = bytearray(data)
    struct.pack_into("<I", buf, 32 + 20, 12345)  # wrong CRC-32 in the first batch header...
    struct.pack_into("<Q", buf, 24, crc64_xz(bytes(buf[32:-16])))  # ...under a matching CRC-64
    assert SegmentReader(bytes(buf)).read_all() is not None  # the CRC-64 vouches for the bytes
    with pytest.raises(ChecksumError, match="CRC-32"):
        SegmentReader(bytes(buf), "x.kbs", batch_crc=True).read_all()
    buf[60] ^= 1  # now the CRC-64 fails too: the batch CRC-32 names the batch
    with pytest.raises(ChecksumError, match="batch 0 CRC-32"):
        SegmentReader(bytes(buf), "x.kbs").read_all()


def test_decoded_columns_live_in_the_arrow_pool_and_are_exact() -> None:
    import pyarrow as pa

    batches = encode_batches(_records(np.random.default_rng(3), 300), 16 * 1024)
    cols = decode_payloads([Payload(b.data, b.base_offset, b.count) for b in batches])
    assert len(cols.value_data) == int(cols.value_offsets[-1]) > 0
    for f in FIELDS:
        arr = getattr(cols, f)
        # Each array is a whole buffer of Arrow's pool, of exactly the size its rows need.
        assert isinstance(arr.base, pa.Buffer), f
        assert arr.base.size == max(1, arr.nbytes), f


def test_dataset_streams_in_order_with_threads(tmp_path: Path) -> None:
    cols = _records(np.random.default_rng(5), 4000)
    url = str(tmp_path / "backup-1")
    with BackupWriter(url, segment_max_bytes=50_000, batch_max_bytes=8_000) as w:
        w.write_columns("t", 0, cols)
        w.write_columns("t", 1, cols)
    ds = KbsDataset.open(url)
    assert len(ds.fragments()) > 4
    a = ds.to_table(use_threads=True)
    b = ds.to_table(use_threads=False)
    assert a.equals(b)
    assert a.num_rows == 8000
    assert a.column("offset").to_pylist()[:4000] == cols.offsets.tolist()


@pytest.mark.skipif(not CONFORMANCE.is_dir(), reason="conformance vectors absent")
def test_conformance_valid_reads_with_one_and_two_decode_threads() -> None:
    for case in sorted((CONFORMANCE / "valid").iterdir()):
        t1 = fsspec_kbs.read_table(str(case / "backup-1"), use_threads=False)
        t2 = fsspec_kbs.read_table(str(case / "backup-1"), use_threads=True)
        assert t1.equals(t2)
