"""The oso-native kernels give the same results un-compiled (``FSSPEC_KBS_NO_JIT=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.oso.helpers import vector

_SCRIPT = """
import json, sys
from fsspec_kbs.format import kernels
from fsspec_kbs.format.oso import decode_segment, encode_segment, OsoCodec
from fsspec_kbs.format.columns import RecordColumns
assert kernels.JIT_ENABLED == (sys.argv[2] == "jit")
out = []
for path in sys.argv[3:]:
    data = open(path, "rb").read()
    seg = decode_segment(data, path)
    recs = [r for c in seg.iter_columns(4096) for r in c.records()]
    again, _ = encode_segment(RecordColumns.from_records(recs), seg.header.codec)
    seg2 = decode_segment(again, path)
    assert [r for c in seg2.iter_columns() for r in c.records()] == recs
    hx = lambda b: None if b is None else b.hex()
    out.append([[r["offset"], r["timestamp"], hx(r["key"]), hx(r["value"]), [[k, hx(v)] for k, v in r["headers"]]]
                for r in recs])
open(sys.argv[1], "w").write(json.dumps(out))
"""


@pytest.mark.conformance
def test_kernels_without_jit_match(conformance: Path, tmp_path: Path) -> None:
    files = sorted(str(p) for p in (vector(conformance, "none") / "topics").rglob("segment-*"))[:2]
    results = []
    for mode in ("jit", "nojit"):
        env = {**os.environ, "FSSPEC_KBS_NO_JIT": "1" if mode == "nojit" else "0"}
        out = tmp_path / f"{mode}.json"
        subprocess.run([sys.executable, "-c", _SCRIPT, str(out), mode, *files], check=True, env=env,
                       cwd=Path(__file__).resolve().parents[2], timeout=300)
        results.append(out.read_text())
    assert results[0] == results[1] and len(results[0]) > 1000
