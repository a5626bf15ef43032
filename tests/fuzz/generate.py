"""Base backups for the fuzzer: written by the library itself, plus the conformance vectors.

Each base is a directory ``<bases>/<name>/<backup-id>/``. Kinds:

* ``kbs12-<codec>-<n>``: KBS manifest 1.2 with a batch index per segment (several
  topics/partitions/segments/batches);
* ``kbs10-<codec>-<n>``: the same stripped to a 1.0 manifest (no segment_index, version "1.0")
  and without the index files (1.0 cannot name them);
* ``oso-<codec>-<n>``: the OSO kafka-backup tool's layout (written by ``convert_backup(to="oso")``);
* ``conf-...``: copies of ``/work/shared/conformance/{valid,oso-native}`` when present.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

CONFORMANCE = Path(os.environ.get("KBS_CONFORMANCE", "/work/shared/conformance"))
CODECS = ("none", "lz4", "zstd")
#: Part of the base cache's directory name: bump it when the bases' content changes
#: (2: written as KBS 1.2, with batch indexes).
BASES_VERSION = 2


def _records(rng: random.Random, n: int) -> dict:
    """Columns of ``n`` records of one partition: offset gaps, nulls, negative ts deltas."""
    offsets, ts, keys, values, headers = [], [], [], [], []
    off = rng.randint(0, 50)
    t = 1_700_000_000_000 + rng.randint(0, 10_000)
    for _ in range(n):
        offsets.append(off)
        off += 1 if rng.random() < 0.8 else rng.randint(2, 6)
        ts.append(t)
        t += rng.randint(-40, 400)
        r = rng.random()
        keys.append(None if r < 0.15 else f"key-{rng.randint(0, 99)}".encode())
        r = rng.random()
        values.append(None if r < 0.07 else rng.randbytes(rng.choice((0, 3, 20, 60, 200))))
        hs = []
        for h in range(rng.choice((0, 0, 1, 2))):
            hs.append({"key": rng.choice(("trace", "nullable", "ü-key", f"h{h}")),
                       "value": None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 12))})
        headers.append(hs)
    return {"offset": offsets, "timestamp": ts, "key": keys, "value": values, "headers": headers}


def write_kbs(dst: Path, codec: str, seed: int) -> Path:
    import pyarrow as pa

    from fsspec_kbs.api import write_table

    rng = random.Random(seed)
    url = dst / "backup-1"
    topics = {"orders": rng.choice((1, 2)), "user.events-v2": 1}
    if rng.random() < 0.5:
        topics["audit_log"] = 1
    hdr_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    tables = []
    for topic, nparts in topics.items():
        for p in range(nparts):
            cols = _records(rng, rng.randint(30, 140))
            n = len(cols["offset"])
            tables.append(pa.table({
                "topic": pa.array([topic] * n, pa.string()),
                "partition": pa.array([p] * n, pa.int32()),
                "offset": pa.array(cols["offset"], pa.int64()),
                "timestamp": pa.array(cols["timestamp"], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                "key": pa.array(cols["key"], pa.binary()),
                "value": pa.array(cols["value"], pa.binary()),
                "headers": pa.array(cols["headers"], hdr_type),
            }))
    table = pa.concat_tables(tables)
    write_table(str(url), table, compression=codec, segment_max_records=rng.choice((20, 35, 50)),
                batch_max_bytes=rng.choice((512, 1500, 4000)))
    return url


def to_v10(backup: Path) -> None:
    mp = backup / "manifest.json"
    m = json.loads(mp.read_text())
    m["version"] = "1.0"
    for t in m["topics"]:
        for p in t["partitions"]:
            p.pop("segment_index", None)
    mp.write_text(json.dumps(m, indent=2))
    for index in backup.rglob("segment-*.index"):
        index.unlink()


def write_oso(src: Path, dst: Path, codec: str, seed: int) -> Path:
    from fsspec_kbs.maintenance.convert import convert_backup

    rng = random.Random(seed)
    url = dst / "oso-backup-1"
    convert_backup(str(src), str(url), to="oso", compression=codec,
                   segment_max_records=rng.choice((25, 40, 60)))
    return url


def make_bases(root: Path, per_kind: int = 2, seed: int = 0) -> list[Path]:
    """Write (or reuse) every base under ``root``; returns the backup directories."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / "DONE"
    if done.exists():
        return [root / line for line in done.read_text().split()]
    out: list[Path] = []
    for codec in CODECS:
        for n in range(per_kind):
            s = seed * 1000 + CODECS.index(codec) * 10 + n
            b = write_kbs(root / f"kbs12-{codec}-{n}", codec, s)
            out.append(b)
            c = root / f"kbs10-{codec}-{n}" / "backup-1"
            shutil.copytree(b, c)
            to_v10(c)
            out.append(c)
            out.append(write_oso(b, root / f"oso-{codec}-{n}", codec, s))
    for kind in ("valid", "oso-native"):
        base = CONFORMANCE / kind
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            for b in sorted(d.glob("*backup-1")):
                c = root / f"conf-{kind}-{d.name}" / b.name
                shutil.copytree(b, c)
                for p in c.rglob("*"):
                    p.chmod(0o755 if p.is_dir() else 0o644)
                out.append(c)
    done.write_text("\n".join(str(p.relative_to(root)) for p in out))
    return out
