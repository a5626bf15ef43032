"""Independent reference decoder for KBS and oso-native backups (written from the specs only).

Does NOT import fsspec_kbs. Given a backup directory on local disk, :func:`decode_backup` returns a
:class:`Reference`:

* ``verdict`` ``"valid"``: ``records`` is exactly what the backup holds, in (topic, partition,
  offset) order;
* ``verdict`` ``"invalid"``: some file is corrupt, or the manifest contradicts the segments in a way
  the spec defines (counts, offsets, timestamps, sizes, crc64, segment list...), or the backup is
  incomplete; ``reasons`` says why;
* ``verdict`` ``"either"``: the data is fully determined by the segments, but the manifest has a
  defect the spec does not tie to the data (metadata fields, unknown fields nested absurdly deep...):
  a reader may refuse it or return ``records``.

The SEGMENT FILES are the truth. ``partial`` holds the records of every segment that decodes
cleanly (used to judge filtered reads that legitimately pruned a corrupt segment) and ``salvaged``
the records of batches of corrupt segments whose own CRC-32 and records are fine.

Record tuple: ``(topic, partition, offset, timestamp, key|None, value|None, ((hkey, hval|None), ...))``.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any

import lz4.block
import lz4.frame
import zstandard

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
#: Reference cap on any single decompressed unit (bounded memory for the oracle itself).
MAX_UNIT = 256 * 1024 * 1024

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
PARTITION_RE = re.compile(r"^(0|[1-9][0-9]*)$")
KBS_SEG_RE = re.compile(r"^segment-([0-9]+)\.kbs$")


class Invalid(Exception):
    """The backup is invalid; the message says why (and names the file)."""


class Either(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# checksums (pure Python)

def _crc64_table() -> list[int]:
    poly = 0xC96C5795D7870F42  # reflected 0x42F0E1EBA9EA3693
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_T64 = _crc64_table()


def crc64_xz(data: bytes) -> int:
    crc = U64_MAX
    t = _T64
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ U64_MAX


assert crc64_xz(b"123456789") == 0x995DC9BBDF1939FA


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# strict JSON

class Huge:
    """An integer literal too long to be any legal value (kept as its digit count)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<{self.digits}-digit integer>"


def _depth(text: str) -> int:
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


@dataclass
class JsonDoc:
    value: Any
    deep: bool = False
    huge: bool = False


def parse_json(raw: bytes, where: str) -> JsonDoc:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid(f"{where}: not UTF-8 ({e})") from None
    doc = JsonDoc(None)
    doc.deep = _depth(text) > 64

    def pairs(items: list) -> dict:
        out: dict = {}
        for k, v in items:
            if k in out:
                raise Invalid(f"{where}: duplicate key {k!r}")
            out[k] = v
        return out

    def pint(s: str) -> Any:
        digits = len(s.lstrip("-"))
        if digits > 20:  # as many as any u64; readers may refuse longer ones anywhere
            doc.huge = True
            return Huge(digits)
        return int(s)

    def pconst(s: str) -> Any:
        raise Invalid(f"{where}: {s} is not JSON")

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        doc.value = json.loads(text, object_pairs_hook=pairs, parse_int=pint, parse_constant=pconst)
    except json.JSONDecodeError as e:
        raise Invalid(f"{where}: not JSON ({e})") from None
    except RecursionError:
        raise Either(f"{where}: JSON nested too deep to parse") from None
    finally:
        sys.setrecursionlimit(old)
    return doc


def _r(v: Any) -> str:
    """A short repr that never recurses into (possibly absurdly deep) containers."""
    if isinstance(v, (list, dict)):
        return f"<{type(v).__name__} of {len(v)}>"
    return repr(v)[:80]


class Checker:
    """Collects 'either' notes; raises Invalid on contradictions."""

    def __init__(self) -> None:
        self.either: list[str] = []

    def note(self, msg: str) -> None:
        self.either.append(msg)

    def int_(self, obj: Any, key: str, where: str, lo: int = I64_MIN, hi: int = U64_MAX,
             nullable: bool = False) -> int | None:
        if not isinstance(obj, dict) or key not in obj:
            raise Invalid(f"{where}: missing {key!r}")
        v = obj[key]
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Invalid(f"{where}: {key} = {_r(v)} is not an integer")
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")) or v != int(v):
                raise Invalid(f"{where}: {key} = {_r(v)} is not an integer")
            self.note(f"{where}: {key} = {v!r} written as a float")
            v = int(v)
        if not lo <= v <= hi:
            raise Invalid(f"{where}: {key} = {v} out of range")
        return v

    def eq(self, what: str, manifest_value: Any, truth: Any) -> None:
        if manifest_value != truth:
            raise Invalid(f"{what}: manifest says {_r(manifest_value)}, segments say {truth!r}")


# ---------------------------------------------------------------------------------------------
# decompression with bounded output

def zstd_exact(comp: bytes, size: int, where: str) -> bytes:
    """One complete zstd frame decompressing to exactly ``size`` bytes, nothing after it."""
    if not comp:
        raise Invalid(f"{where}: empty zstd frame")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    pos = 0
    try:
        while pos < len(comp) and not dobj.eof:
            out += dobj.decompress(comp[pos:pos + 64])
            pos += 64
            if len(out) > size:
                raise Invalid(f"{where}: zstd frame decompresses to more than {size} bytes")
    except zstandard.ZstdError as e:
        raise Invalid(f"{where}: bad zstd frame ({e})") from None
    if not dobj.eof:
        raise Invalid(f"{where}: zstd frame incomplete")
    if dobj.unused_data or pos < len(comp) and comp[pos:]:
        # bytes fed after the frame ended land in unused_data; bytes never fed are left over too
        raise Invalid(f"{where}: data after the zstd frame")
    if len(out) != size:
        raise Invalid(f"{where}: zstd frame gives {len(out)} bytes, {size} declared")
    return bytes(out)


def lz4_frame_exact(comp: bytes, size: int, where: str) -> bytes:
    if not comp:
        raise Invalid(f"{where}: empty lz4 frame")
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out = d.decompress(comp, max_length=size + 1)
    except RuntimeError as e:
        raise Invalid(f"{where}: bad lz4 frame ({e})") from None
    if len(out) > size:
        raise Invalid(f"{where}: lz4 frame decompresses to more than {size} bytes")
    if not d.eof:
        # max_length may stop early; a frame whose output fits must end here
        raise Invalid(f"{where}: lz4 frame incomplete or larger than declared")
    if d.unused_data:
        raise Invalid(f"{where}: data after the lz4 frame")
    if len(out) != size:
        raise Invalid(f"{where}: lz4 frame gives {len(out)} bytes, {size} declared")
    return out


# ---------------------------------------------------------------------------------------------
# KBS records

def varint(buf: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    u = 0
    shift = 0
    for i in range(10):
        if pos >= end:
            raise Invalid(f"{where}: varint runs past the batch")
        b = buf[pos]
        pos += 1
        if i == 9 and b > 1:
            raise Invalid(f"{where}: varint overflows 64 bits")
        u |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (u >> 1) ^ -(u & 1), pos
    raise Invalid(f"{where}: varint longer than 10 bytes")


def decode_kbs_records(raw: bytes, base: int, count: int, where: str) -> list[tuple]:
    """[(offset, timestamp, key, value, headers)] of one decompressed batch."""
    out = []
    pos, end = 0, len(raw)
    prev_delta = -1
    ts = 0
    for i in range(count):
        w = f"{where} record {i}"
        delta, pos = varint(raw, pos, end, w)
        if i == 0 and delta != 0:
            raise Invalid(f"{w}: first offset delta {delta} != 0")
        if delta <= prev_delta:
            raise Invalid(f"{w}: offset deltas not strictly increasing")
        prev_delta = delta
        off = base + delta
        if off > I64_MAX:
            raise Invalid(f"{w}: offset {off} exceeds int64")
        tdelta, pos = varint(raw, pos, end, w)
        ts = tdelta if i == 0 else ts + tdelta
        if not I64_MIN <= ts <= I64_MAX:
            raise Invalid(f"{w}: timestamp overflows int64")

        def blob(pos: int, nullable: bool = True) -> tuple[bytes | None, int]:
            n, pos = varint(raw, pos, end, w)  # noqa: B023
            if n == -1 and nullable:
                return None, pos
            if n < 0:
                raise Invalid(f"{w}: negative length {n}")  # noqa: B023
            if pos + n > end:
                raise Invalid(f"{w}: length {n} runs past the batch")  # noqa: B023
            return raw[pos:pos + n], pos + n

        key, pos = blob(pos)
        value, pos = blob(pos)
        hc, pos = varint(raw, pos, end, w)
        if hc < 0 or hc * 2 > end - pos:
            raise Invalid(f"{w}: bad header count {hc}")
        headers = []
        for _ in range(hc):
            hk, pos = blob(pos, nullable=False)
            try:
                hks = hk.decode("utf-8")
            except UnicodeDecodeError:
                raise Invalid(f"{w}: header key not UTF-8") from None
            hv, pos = blob(pos)
            headers.append((hks, hv))
        out.append((off, ts, key, value, tuple(headers)))
    if pos != end:
        raise Invalid(f"{where}: {end - pos} bytes left after the records")
    return out


@dataclass
class KbsSegment:
    codec: int
    first_offset: int
    records: list  # (offset, ts, key, value, headers)
    uncompressed: int
    size: int
    crc64: int
    batches: int
    #: (position, base offset, last offset, min timestamp, max timestamp) of each batch.
    batch_info: list = field(default_factory=list)


def decode_kbs_segment(path: str, salvage: list | None = None) -> KbsSegment:
    w = path
    if os.path.isdir(path) or not os.path.isfile(path):
        raise Invalid(f"{w}: not a regular file")
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < 48:
        raise Invalid(f"{w}: {size} bytes, shorter than header + footer")
    magic, ver, codec, _flags, first, count, crc = struct.unpack_from("<4sBBHQQQ", data, 0)
    if magic != b"KBS1":
        raise Invalid(f"{w}: bad magic")
    if ver != 1:
        raise Invalid(f"{w}: segment version {ver}")
    if codec not in (0, 1, 2):
        raise Invalid(f"{w}: codec {codec}")
    last, nbatches, fmagic = struct.unpack_from("<QI4s", data, size - 16)
    if fmagic != b"KBSF":
        raise Invalid(f"{w}: bad footer magic (truncated?)")
    end = size - 16
    bad: str | None = None
    if crc64_xz(data[32:end]) != crc:
        bad = f"{w}: CRC-64 mismatch"
    pos = 32
    recs: list = []
    nb = 0
    unc = 0
    prev_last = -1
    infos: list = []
    while pos < end:
        if end - pos < 24:
            raise Invalid(f"{w} at {pos}: partial batch header")
        base, rc, csize, usize, bcrc = struct.unpack_from("<QIIII", data, pos)
        bw = f"{w} batch at {pos}"
        if rc == 0:
            raise Invalid(f"{bw}: record count 0")
        if pos + 24 + csize > end:
            raise Invalid(f"{bw}: compressed size runs past the footer")
        comp = data[pos + 24:pos + 24 + csize]
        try:
            if crc32(comp) != bcrc:
                raise Invalid(f"{bw}: CRC-32 mismatch")
            if codec == 0:
                if csize != usize:
                    raise Invalid(f"{bw}: codec none but sizes differ")
                raw = comp
            elif codec == 1:
                raw = lz4_frame_exact(comp, usize, bw)
            else:
                raw = zstd_exact(comp, usize, bw)
            if base <= prev_last and nb > 0:
                raise Invalid(f"{bw}: base offset {base} not above previous {prev_last}")
            brecs = decode_kbs_records(raw, base, rc, bw)
        except Invalid:
            if bad is None:
                raise
            raise Invalid(bad) from None
        if salvage is not None:
            salvage.extend(brecs)
        bts = [r[1] for r in brecs]
        infos.append((pos, base, brecs[-1][0], min(bts), max(bts)))
        recs.extend(brecs)
        prev_last = brecs[-1][0]
        unc += usize
        nb += 1
        pos += 24 + csize
    if bad:
        raise Invalid(bad)
    if nb != nbatches:
        raise Invalid(f"{w}: footer batch count {nbatches}, read {nb}")
    if recs:
        if first != recs[0][0]:
            raise Invalid(f"{w}: header first offset {first} != {recs[0][0]}")
        if last != recs[-1][0]:
            raise Invalid(f"{w}: footer last offset {last} != {recs[-1][0]}")
    elif first != 0 or last != 0:
        raise Invalid(f"{w}: empty segment with nonzero offsets")
    if count != len(recs):
        raise Invalid(f"{w}: header record count {count} != {len(recs)}")
    return KbsSegment(codec, first, recs, unc, size, crc, nb, infos)


# ---------------------------------------------------------------------------------------------
# Result

@dataclass
class Reference:
    layout: str
    verdict: str
    reasons: list[str] = field(default_factory=list)
    records: list = field(default_factory=list)
    partial: list = field(default_factory=list)
    salvaged: list = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    #: Batch indexes (kbs-format.md §7) a reader must not use (missing, a CRC does not match,
    #: unknown version): reads fall back to the segment and are right; validate reports them.
    index_damaged: list[str] = field(default_factory=list)
    #: Indexes whose CRCs match but whose entries contradict the segment: a read through them
    #: may fail (naming the index), never return other rows; validate reports them.
    index_lies: list[str] = field(default_factory=list)
    #: Records of the batches of corrupt segments that are intact on their own (CRC-32 and
    #: records): what a read through a batch index, which checks only the batches it reads
    #: (kbs-format.md §7), may return from such a segment.
    intact_batches: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"layout": self.layout, "verdict": self.verdict, "reasons": self.reasons[:20],
                "records": len(self.records), "corrupt": self.corrupt,
                "index_damaged": self.index_damaged[:5], "index_lies": self.index_lies[:5]}


def _listdir(p: str) -> list[str]:
    try:
        return sorted(os.listdir(p))
    except (FileNotFoundError, NotADirectoryError):
        return []


CODEC_NAMES = {0: "none", 1: "lz4", 2: "zstd"}


def _decode_all(jobs: list[tuple], decode: Any, ref: Reference) -> dict:
    """Decode every segment; remember corrupt ones; returns {path: segment}."""
    out = {}
    for key, path in jobs:
        salvage: list = []
        try:
            out[path] = decode(path, salvage)
            ref.partial.extend((*key, *r) for r in out[path].records)
        except Invalid as e:
            ref.corrupt.append(path)
            ref.reasons.append(str(e))
            ref.salvaged.extend((*key, *r) for r in salvage)
            if path.endswith(".kbs"):
                ref.intact_batches.extend((*key, *r) for r in intact_kbs_batches(path))
    return out


def disk_truth(backup_dir: str, ref: Reference) -> None:
    """What the segment files on disk hold, ignoring the manifest (for invalid manifests)."""
    ref.partial, ref.salvaged = [], []
    tdir = os.path.join(backup_dir, "topics")
    for t in _listdir(tdir):
        for pd in _listdir(os.path.join(tdir, t)):
            oso = pd.startswith("partition=")
            num = pd[10:] if oso else pd
            if not PARTITION_RE.match(num):
                continue
            for fn in _listdir(os.path.join(tdir, t, pd)):
                path = os.path.join(tdir, t, pd, fn)
                if not fn.startswith("segment-") or fn.endswith(".index") or not os.path.isfile(path):
                    continue
                salvage: list = []
                try:
                    seg = decode_oso_segment(path, MAX_UNIT) if oso else decode_kbs_segment(path, salvage)
                    ref.partial.extend((t, int(num), *r) for r in seg.records)
                except Invalid:
                    ref.salvaged.extend((t, int(num), *r) for r in salvage)


def decode_backup(backup_dir: str) -> Reference:
    ref = _decode_backup(backup_dir.rstrip("/"))
    if ref.verdict == "invalid" and not ref.partial and not ref.corrupt:
        disk_truth(backup_dir.rstrip("/"), ref)
    return ref


def _decode_backup(backup_dir: str) -> Reference:
    mpath = os.path.join(backup_dir, "manifest.json")
    if not os.path.isfile(mpath):
        ref = Reference("unknown", "invalid", [f"{mpath}: missing (incomplete backup)"])
        return ref
    with open(mpath, "rb") as f:
        raw = f.read()
    try:
        doc = parse_json(raw, mpath)
    except Invalid as e:
        return Reference("unknown", "invalid", [str(e)])
    except Either as e:
        return Reference("unknown", "invalid", [f"{e} (treated as invalid)"])
    m = doc.value
    layout = "kbs"
    if isinstance(m, dict) and "version" not in m and isinstance(m.get("topics"), list) and any(
            isinstance(t, dict) and isinstance(t.get("partitions"), list) and any(
                isinstance(p, dict) and "partition_id" in p for p in t["partitions"]) for t in m["topics"]):
        layout = "oso"
    ref = Reference(layout, "valid")
    chk = Checker()
    _commit_state(backup_dir, m, chk)
    try:
        if layout == "kbs":
            _kbs(backup_dir, m, ref, chk)
        else:
            _oso(backup_dir, m, ref, chk)
    except Invalid as e:
        ref.verdict = "invalid"
        ref.reasons.insert(0, str(e))
        return ref
    if ref.corrupt:
        ref.verdict = "invalid"
        return ref
    if doc.deep:
        chk.note("manifest nested more than 64 levels deep (in fields readers ignore)")
    if doc.huge:
        chk.note("manifest has integer literals of more than 20 digits (in fields readers ignore)")
    if chk.either:
        ref.verdict = "either"
        ref.reasons.extend(chk.either)
    ref.records = sorted(ref.partial, key=lambda r: (r[0], r[1], r[2]))
    return ref


def _commit_state(backup_dir: str, m: Any, chk: Checker) -> None:
    """Commit records newer than the manifest (docs/format-decisions.md, "Commit protocol"):
    the manifest may be about to be replaced, so a reader may refuse it (commit in progress)."""
    info = m.get("commit") if isinstance(m, dict) else None
    n = info.get("version") if isinstance(info, dict) else None
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else -1
    names = _listdir(os.path.join(backup_dir, "_commits"))
    records = sorted(int(x[:8]) for x in names if re.fullmatch(r"[0-9]{8}\.json", x))
    done = {int(x[:8]) for x in names if re.fullmatch(r"[0-9]{8}\.done", x)}
    if n >= 0 and n + 1 in records:
        chk.note(f"commit {n + 1} is recorded but the manifest publishes commit {n}")
    elif n < 0 and records and records[-1] not in done:
        chk.note(f"commit {records[-1]} is recorded but the manifest names no commit")


# ---------------------------------------------------------------------------------------------
# KBS backup

def _kbs(backup_dir: str, m: Any, ref: Reference, chk: Checker) -> None:
    mp = os.path.join(backup_dir, "manifest.json")
    if not isinstance(m, dict):
        raise Invalid(f"{mp}: not an object")
    version = m.get("version")
    if not isinstance(version, str) or not re.fullmatch(r"1\.[0-9]+", version):
        raise Invalid(f"{mp}: version {_r(version)} is not a known 1.x")
    for key in ("backup_id", "created_at", "completed_at", "source_cluster"):
        if key not in m:
            chk.note(f"{mp}: missing metadata field {key}")
    bid = m.get("backup_id")
    if bid != os.path.basename(backup_dir):
        chk.note(f"{mp}: backup_id {_r(bid)} differs from the directory name")
    for key in ("created_at", "completed_at"):
        if key in m and not isinstance(m[key], str):
            chk.note(f"{mp}: {key} is not a string")
    comp = m.get("compression")
    if not isinstance(comp, dict) or comp.get("algorithm") not in ("none", "lz4", "zstd"):
        raise Invalid(f"{mp}: compression {_r(comp)}")
    stats = m.get("statistics")
    if not isinstance(stats, dict):
        raise Invalid(f"{mp}: statistics missing")
    tr = m.get("time_range")
    if not isinstance(tr, dict):
        raise Invalid(f"{mp}: time_range missing")
    topics = m.get("topics")
    if not isinstance(topics, list):
        raise Invalid(f"{mp}: topics is not a list")
    tdir = os.path.join(backup_dir, "topics")
    names = []
    jobs = []
    plan = []  # (topic, partition, pentry, [(seq, name, path)])
    for t in topics:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise Invalid(f"{mp}: topic entry {_r(t)}")
        name = t["name"]
        if not NAME_RE.match(name) or name in (".", "..") or len(name) > 249:
            raise Invalid(f"{mp}: illegal topic name {name!r}")
        if name in names:
            raise Invalid(f"{mp}: topic {name} listed twice")
        names.append(name)
        parts = t.get("partitions")
        if not isinstance(parts, list):
            raise Invalid(f"{mp}: {name}: partitions is not a list")
        seen = set()
        for p in parts:
            pw = f"{mp}: {name}/{_r(p.get('partition') if isinstance(p, dict) else p)}"
            if not isinstance(p, dict):
                raise Invalid(f"{pw}: not an object")
            pn = chk.int_(p, "partition", pw, 0, (1 << 31) - 1)
            if pn in seen:
                raise Invalid(f"{pw}: partition listed twice")
            seen.add(pn)
            pdir = os.path.join(tdir, name, str(pn))
            files = []
            for fn in _listdir(pdir):
                mt = KBS_SEG_RE.match(fn)
                if not fn.startswith("segment-") or fn.endswith(".index"):
                    continue
                if not mt:
                    raise Invalid(f"{pdir}/{fn}: not a legal segment file name")
                seq = int(mt.group(1))
                if fn != f"segment-{seq:08d}.kbs":
                    raise Invalid(f"{pdir}/{fn}: not a legal segment file name")
                files.append((seq, fn, os.path.join(pdir, fn)))
            files.sort()
            for i, (seq, fn, _) in enumerate(files):
                if seq != i:
                    raise Invalid(f"{pdir}: segment sequence not contiguous from 0 ({fn})")
            plan.append((name, pn, p, files, pw))
            jobs.extend(((name, pn), path) for _, _, path in files)
        # partition dirs on disk that the manifest does not list
        for d in _listdir(os.path.join(tdir, name)):
            if PARTITION_RE.match(d) and int(d) not in seen and any(
                    f.startswith("segment-") for f in _listdir(os.path.join(tdir, name, d))):
                raise Invalid(f"{tdir}/{name}/{d}: partition on disk missing from the manifest")
    for d in _listdir(tdir):
        if d not in names and os.path.isdir(os.path.join(tdir, d)) and any(
                any(f.startswith("segment-") for f in _listdir(os.path.join(tdir, d, pd)))
                for pd in _listdir(os.path.join(tdir, d))):
            raise Invalid(f"{tdir}/{d}: topic on disk missing from the manifest")

    segs = _decode_all(jobs, decode_kbs_segment, ref)
    if ref.corrupt:
        return
    algo = comp["algorithm"]
    tot_parts = tot_segs = tot_recs = tot_unc = tot_size = 0
    all_ts: list[int] = []
    for name, pn, p, files, pw in plan:  # noqa: B007
        n_recs = 0
        prev_last = None
        first = last = None
        index = p.get("segment_index")
        if "segment_index" in p and index is None:
            index = None
        if index is not None and not isinstance(index, list):
            raise Invalid(f"{pw}: segment_index is not a list")
        if index is None and version != "1.0":
            chk.note(f"{pw}: version {version} manifest without segment_index")
        if index is not None and len(index) != len(files):
            raise Invalid(f"{pw}: segment_index has {len(index)} entries, {len(files)} files on disk")
        for i, (_seq, fn, path) in enumerate(files):
            s = segs[path]
            if CODEC_NAMES[s.codec] != algo:
                raise Invalid(f"{path}: codec {CODEC_NAMES[s.codec]}, manifest says {algo}")
            if s.records:
                if prev_last is not None and s.records[0][0] <= prev_last:
                    raise Invalid(f"{path}: offsets overlap the previous segment")
                prev_last = s.records[-1][0]
                first = s.records[0][0] if first is None else first
                last = s.records[-1][0]
            ts = [r[1] for r in s.records]
            all_ts.extend(ts)
            n_recs += len(s.records)
            tot_unc += s.uncompressed
            tot_size += s.size
            if index is not None:
                e = index[i]
                ew = f"{pw} segment_index[{i}]"
                if not isinstance(e, dict):
                    raise Invalid(f"{ew}: not an object")
                chk.eq(f"{ew}.file", e.get("file"), fn)
                if s.records:
                    for k, truth in (("first_offset", s.records[0][0]), ("last_offset", s.records[-1][0]),
                                     ("records", len(s.records)), ("min_timestamp", min(ts)),
                                     ("max_timestamp", max(ts)), ("size_bytes", s.size), ("crc64", s.crc64)):
                        chk.eq(f"{ew}.{k} ({path})", chk.int_(e, k, ew), truth)
                else:
                    chk.note(f"{path}: empty segment (index fields unchecked)")
                if "index_crc32" in e:
                    icrc = chk.int_(e, "index_crc32", ew, 0, 2**32 - 1, nullable=True)
                    if icrc is not None:
                        _check_batch_index(path, s, icrc, e, ref)
        tot_parts += 1
        tot_segs += len(files)
        tot_recs += n_recs
        chk.eq(f"{pw}.segments", chk.int_(p, "segments", pw, 0), len(files))
        chk.eq(f"{pw}.records", chk.int_(p, "records", pw, 0), n_recs)
        if n_recs:
            chk.eq(f"{pw}.first_offset", chk.int_(p, "first_offset", pw, 0), first)
            chk.eq(f"{pw}.last_offset", chk.int_(p, "last_offset", pw, 0), last)
    sw = f"{mp}: statistics"
    chk.eq(f"{sw}.topics", chk.int_(stats, "topics", sw), len(names))
    chk.eq(f"{sw}.partitions", chk.int_(stats, "partitions", sw), tot_parts)
    chk.eq(f"{sw}.segments", chk.int_(stats, "segments", sw), tot_segs)
    chk.eq(f"{sw}.records", chk.int_(stats, "records", sw), tot_recs)
    chk.eq(f"{sw}.uncompressed_bytes", chk.int_(stats, "uncompressed_bytes", sw), tot_unc)
    chk.eq(f"{sw}.compressed_bytes", chk.int_(stats, "compressed_bytes", sw), tot_size)
    tw = f"{mp}: time_range"
    chk.eq(f"{tw}.earliest_timestamp", chk.int_(tr, "earliest_timestamp", tw, nullable=True),
           min(all_ts) if all_ts else None)
    chk.eq(f"{tw}.latest_timestamp", chk.int_(tr, "latest_timestamp", tw, nullable=True),
           max(all_ts) if all_ts else None)


# ---------------------------------------------------------------------------------------------
# oso-native backup

OSO_CODECS = {0: "none", 1: "zstd", 2: "lz4"}
OSO_SEG_RE = re.compile(r"^segment-[0-9]+\.bin(\.zst|\.lz4)?$")


@dataclass
class OsoSegment:
    codec: int
    records: list
    uncompressed: int
    size: int


def _oso_records(body: bytes, where: str) -> list:
    out = []
    pos, end = 0, len(body)
    while pos < end:
        rw = f"{where} record at body byte {pos}"
        if end - pos < 4:
            raise Invalid(f"{rw}: partial length")
        (n,) = struct.unpack_from("<I", body, pos)
        pos += 4
        rend = pos + n
        if rend > end:
            raise Invalid(f"{rw}: length {n} runs past the body")

        def take(fmt: str) -> Any:
            nonlocal pos
            k = struct.calcsize(fmt)
            if pos + k > rend:  # noqa: B023
                raise Invalid(f"{rw}: field runs past the record")  # noqa: B023
            v = struct.unpack_from(fmt, body, pos)[0]
            pos += k
            return v

        def blob(n: int) -> bytes:
            nonlocal pos
            if n < 0 or pos + n > rend:  # noqa: B023
                raise Invalid(f"{rw}: length {n} runs past the record")  # noqa: B023
            b = body[pos:pos + n]
            pos += n
            return b

        ts = take("<q")
        off = take("<q")
        kl = take("<i")
        key = None if kl == -1 else blob(kl)
        vl = take("<i")
        value = None if vl == -1 else blob(vl)
        hc = take("<H")
        headers = []
        for _ in range(hc):
            hk = blob(take("<H"))
            try:
                hks = hk.decode("utf-8")
            except UnicodeDecodeError:
                raise Invalid(f"{rw}: header key not UTF-8") from None
            hl = take("<i")
            headers.append((hks, None if hl == -1 else blob(hl)))
        if pos != rend:
            raise Invalid(f"{rw}: {rend - pos} bytes left in the record")
        if off < 0:
            raise Invalid(f"{rw}: negative offset")
        if out and off <= out[-1][0]:
            raise Invalid(f"{rw}: offsets not strictly increasing")
        out.append((off, ts, key, value, tuple(headers)))
    return out


def decode_oso_segment(path: str, cap: int) -> OsoSegment:
    w = path
    if not os.path.isfile(path):
        raise Invalid(f"{w}: not a regular file")
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"KBAK":
        raise Invalid(f"{w}: not a KBAK segment (legacy JSON segments are not generated by the fuzzer)")
    if len(data) < 40:
        raise Invalid(f"{w}: too short")
    _m, ver, codec, _r, count, start, end_off = struct.unpack_from("<4sBBHQqq", data, 0)
    if ver != 1:
        raise Invalid(f"{w}: version {ver}")
    if codec not in OSO_CODECS:
        raise Invalid(f"{w}: codec {codec}")
    if data[-4:] != b"BKAE":
        raise Invalid(f"{w}: bad footer magic")
    if struct.unpack_from("<I", data, len(data) - 8)[0] != crc32(data[:-8]):
        raise Invalid(f"{w}: CRC-32 mismatch")
    body = data[32:-8]
    if codec == 0:
        raw = body
    elif codec == 1:
        raw = _zstd_upto(body, cap, w)
    else:
        if len(body) < 4:
            raise Invalid(f"{w}: lz4 body without size")
        (usize,) = struct.unpack_from("<I", body, 0)
        if usize > cap:
            raise Invalid(f"{w}: lz4 size {usize} above the manifest's {cap}")
        try:
            raw = lz4.block.decompress(body[4:], uncompressed_size=usize)
        except lz4.block.LZ4BlockError as e:
            raise Invalid(f"{w}: bad lz4 block ({e})") from None
        if len(raw) != usize:
            raise Invalid(f"{w}: lz4 block size mismatch")
    recs = _oso_records(raw, w)
    if count != len(recs):
        raise Invalid(f"{w}: header count {count} != {len(recs)}")
    if recs and (start != recs[0][0] or end_off != recs[-1][0]):
        raise Invalid(f"{w}: header offsets {start}..{end_off} != records {recs[0][0]}..{recs[-1][0]}")
    return OsoSegment(codec, recs, len(raw), len(data))


def _zstd_upto(comp: bytes, cap: int, where: str) -> bytes:
    if not comp:
        raise Invalid(f"{where}: empty zstd body")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    pos = 0
    try:
        while pos < len(comp) and not dobj.eof:
            out += dobj.decompress(comp[pos:pos + 64])
            pos += 64
            if len(out) > cap:
                raise Invalid(f"{where}: zstd body larger than the manifest's {cap} bytes")
    except zstandard.ZstdError as e:
        raise Invalid(f"{where}: bad zstd body ({e})") from None
    if not dobj.eof:
        raise Invalid(f"{where}: zstd body incomplete")
    if dobj.unused_data:
        raise Invalid(f"{where}: data after the zstd frame")
    return bytes(out)


def _oso(backup_dir: str, m: dict, ref: Reference, chk: Checker) -> None:
    mp = os.path.join(backup_dir, "manifest.json")
    bid = m.get("backup_id")
    dirname = os.path.basename(backup_dir)
    if bid != dirname:
        raise Invalid(f"{mp}: backup_id {_r(bid)} is not the directory name (keys are relative to it)")
    created = m.get("created_at")
    if not isinstance(created, int) or isinstance(created, bool) or not I64_MIN <= created <= I64_MAX:
        chk.note(f"{mp}: created_at is not an int64")
    # Metadata readers do not need, whose type a reader may still insist on (oso-native-format.md).
    if m.get("source_cluster_id") is not None and not isinstance(m.get("source_cluster_id"), str):
        chk.note(f"{mp}: source_cluster_id is not a string")
    brokers = m.get("source_brokers")
    if brokers is not None and not (isinstance(brokers, list) and all(isinstance(b, str) for b in brokers)):
        chk.note(f"{mp}: source_brokers is not a list of strings")
    algo = m.get("compression")
    if algo not in ("none", "lz4", "zstd"):
        raise Invalid(f"{mp}: compression {_r(algo)}")
    root = os.path.dirname(backup_dir)
    listed = set()
    names = []
    jobs = []  # noqa: F841
    plan = []
    for t in m["topics"]:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise Invalid(f"{mp}: topic entry {_r(t)}")
        name = t["name"]
        if not NAME_RE.match(name) or name in (".", "..") or len(name) > 249:
            raise Invalid(f"{mp}: illegal topic name {name!r}")
        if name in names:
            raise Invalid(f"{mp}: topic {name} listed twice")
        names.append(name)
        if not isinstance(t.get("partitions"), list):
            raise Invalid(f"{mp}: {name}: partitions is not a list")
        seen = set()
        for p in t["partitions"]:
            if not isinstance(p, dict):
                raise Invalid(f"{mp}: {name}: partition entry not an object")
            pw = f"{mp}: {name}/{_r(p.get('partition_id'))}"
            pn = chk.int_(p, "partition_id", pw, 0, (1 << 31) - 1)
            if pn in seen:
                raise Invalid(f"{pw}: partition listed twice")
            seen.add(pn)
            segs = p.get("segments")
            if not isinstance(segs, list):
                raise Invalid(f"{pw}: segments is not a list")
            if "gaps" in p:
                chk.note(f"{pw}: has gaps (reported, not checked)")
            entries = []
            for i, s in enumerate(segs):
                sw = f"{pw} segments[{i}]"
                if not isinstance(s, dict) or not isinstance(s.get("key"), str):
                    raise Invalid(f"{sw}: no key")
                key = s["key"]
                prefix = f"{bid}/topics/{name}/partition={pn}/"
                fn = key[len(prefix):]
                if not key.startswith(prefix) or "/" in fn or not OSO_SEG_RE.match(fn):
                    raise Invalid(f"{sw}: key {key!r} is not a segment of {name}/{pn}")
                if key in listed:
                    raise Invalid(f"{sw}: key {key!r} listed twice")
                listed.add(key)
                vals = {k: chk.int_(s, k, sw) for k in ("start_offset", "end_offset", "start_timestamp",
                                                          "end_timestamp", "record_count",
                                                          "uncompressed_size", "compressed_size")}
                path = os.path.join(root, key)
                entries.append((path, vals, sw))
            plan.append((name, pn, entries, pw))
        for d in _listdir(os.path.join(backup_dir, "topics", name)):
            if d.startswith("partition=") and d[10:].isdigit() and int(d[10:]) not in seen and any(
                    f.startswith("segment-") for f in _listdir(os.path.join(backup_dir, "topics", name, d))):
                raise Invalid(f"{backup_dir}/topics/{name}/{d}: partition on disk missing from the manifest "
                              "(incomplete backup)")
    tdir = os.path.join(backup_dir, "topics")
    for d in _listdir(tdir):
        for pd in _listdir(os.path.join(tdir, d)):
            for fn in _listdir(os.path.join(tdir, d, pd)):
                if fn.startswith("segment-") and f"{bid}/topics/{d}/{pd}/{fn}" not in listed:
                    raise Invalid(f"{tdir}/{d}/{pd}/{fn}: segment on disk missing from the manifest "
                                  "(incomplete backup)")
    decoded = {}
    for name, pn, entries, pw in plan:  # noqa: B007
        for path, vals, sw in entries:
            cap = vals["uncompressed_size"]
            if cap < 0:
                raise Invalid(f"{sw}: negative uncompressed_size")
            try:
                decoded[path] = decode_oso_segment(path, min(cap, MAX_UNIT))
                ref.partial.extend((name, pn, *r) for r in decoded[path].records)
            except Invalid as e:
                ref.corrupt.append(path)
                ref.reasons.append(str(e))
    if ref.corrupt:
        return
    for name, pn, entries, pw in plan:  # noqa: B007
        prev_end = None
        for path, vals, sw in entries:
            s = decoded[path]
            if OSO_CODECS[s.codec] != algo:
                raise Invalid(f"{path}: codec {OSO_CODECS[s.codec]}, manifest says {algo}")
            if not s.records:
                chk.note(f"{path}: empty segment")
                continue
            r = s.records
            for k, truth in (("start_offset", r[0][0]), ("end_offset", r[-1][0]),
                             ("start_timestamp", r[0][1]), ("end_timestamp", r[-1][1]),
                             ("record_count", len(r)), ("uncompressed_size", s.uncompressed),
                             ("compressed_size", s.size)):
                chk.eq(f"{sw}.{k} ({path})", vals[k], truth)
            if prev_end is not None and r[0][0] <= prev_end:
                raise Invalid(f"{path}: segments out of offset order / overlapping")
            prev_end = r[-1][0]


def filter_records(records: list, start_offset: int | None = None, end_offset: int | None = None,
                   start_time: int | None = None, end_time: int | None = None) -> list:
    out = []
    for r in records:
        if start_offset is not None and r[2] < start_offset:
            continue
        if end_offset is not None and r[2] >= end_offset:
            continue
        if start_time is not None and r[3] < start_time:
            continue
        if end_time is not None and r[3] >= end_time:
            continue
        out.append(r)
    return out


def load_expected_jsonl(path: str) -> list:
    import base64
    out = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            b = (lambda v: None if v is None else base64.b64decode(v))  # noqa: E731
            out.append((d["topic"], d["partition"], d["offset"], d["timestamp"], b(d["key"]), b(d["value"]),
                        tuple((h[0], b(h[1])) for h in d["headers"])))
    return out


if __name__ == "__main__":
    r = decode_backup(sys.argv[1])
    print(json.dumps(r.to_json(), indent=1))


# ---------------------------------------------------------------------------------------------
# Batch index (kbs-format.md §7)

def _check_batch_index(path: str, s: KbsSegment, file_crc: int, entry: dict, ref: Reference) -> None:
    """Sort the segment's index into fine, damaged (not to be used) or lying (CRCs vouch for
    entries that contradict the segment, or the manifest's claims about it)."""
    ipath = path[: -len(".kbs")] + ".index"
    if not os.path.isfile(ipath):
        ref.index_damaged.append(f"{ipath}: missing")
        return
    with open(ipath, "rb") as f:
        data = f.read()
    if crc32(data) != file_crc:
        ref.index_damaged.append(f"{ipath}: CRC-32 differs from the manifest's index_crc32")
        return
    if len(data) < 16:
        ref.index_lies.append(f"{ipath}: shorter than its header")
        return
    magic, ver, flags, reserved, count, bcrc = struct.unpack_from("<4sBBHII", data, 0)
    if magic != b"KBSI":
        ref.index_lies.append(f"{ipath}: bad magic")
        return
    if ver != 1 or flags or reserved:
        ref.index_damaged.append(f"{ipath}: unknown version or flags")
        return
    if len(data) != 16 + 40 * count:
        ref.index_lies.append(f"{ipath}: size does not match its entry count")
        return
    if crc32(data[16:]) != bcrc:
        ref.index_damaged.append(f"{ipath}: entries' CRC-32 differs from its header's")
        return
    # (base offset, last offset, position, min timestamp, max timestamp)
    entries = [struct.unpack_from("<QQQqq", data, 16 + 40 * i) for i in range(count)]
    lie = None
    if count != len(s.batch_info):
        lie = f"{count} entries for {len(s.batch_info)} batches"
    else:
        for i, ((base, last, pos, mn, mx), (tpos, tbase, tlast, tmn, tmx)) in enumerate(
                zip(entries, s.batch_info, strict=True)):
            nxt = entries[i + 1][0] if i + 1 < count else None
            if (pos, base) != (tpos, tbase) or last < tlast or mn > tmn or mx < tmx or last >= 2**63 or (
                    nxt is not None and last >= nxt) or mn > mx:
                lie = f"entry {i} {entries[i]} contradicts batch {s.batch_info[i]}"
                break
    if lie is None and entries and s.records:
        # A reader checks the index's range against the manifest's claims about the segment.
        for k, mine in (("first_offset", entries[0][0]), ("last_offset", entries[-1][1]),
                        ("min_timestamp", min(e[3] for e in entries)), ("max_timestamp", max(e[4] for e in entries))):
            if entry.get(k) is not None and entry.get(k) != mine:
                lie = f"its {k} {mine} differs from the manifest's {entry.get(k)}"
                break
    if lie is not None:
        ref.index_lies.append(f"{ipath}: {lie}")


def intact_kbs_batches(path: str) -> list:
    """Records of each batch of a (corrupt) KBS segment that holds up on its own: its CRC-32
    matching, its frame and records decoding."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if len(data) < 32 or data[:4] != b"KBS1" or data[5] not in (0, 1, 2):
        return []
    codec = data[5]
    # Where batches start: walking their headers from byte 32, and (a search aid only: each
    # batch found is checked on its own) the positions its batch index lists, if any.
    starts = set()
    pos = 32
    while pos + 24 <= len(data):
        starts.add(pos)
        csize = struct.unpack_from("<I", data, pos + 12)[0]
        pos += 24 + csize
    try:
        with open(path[: -len(".kbs")] + ".index", "rb") as f:
            idx = f.read()
        count = struct.unpack_from("<I", idx, 8)[0] if len(idx) >= 16 else 0
        starts.update(struct.unpack_from("<Q", idx, 16 + 40 * i + 16)[0]
                      for i in range(count) if 16 + 40 * (i + 1) <= len(idx))
    except OSError:
        pass
    out: list = []
    for pos in sorted(starts):
        if pos < 32 or pos + 24 > len(data):
            continue
        base, rc, csize, usize, bcrc = struct.unpack_from("<QIIII", data, pos)
        if rc == 0 or pos + 24 + csize > len(data):
            continue
        comp = data[pos + 24:pos + 24 + csize]
        if crc32(comp) != bcrc:
            continue
        try:
            if codec == 0:
                if csize != usize:
                    raise Invalid("sizes")
                raw = comp
            elif codec == 1:
                raw = lz4_frame_exact(comp, usize, path)
            else:
                raw = zstd_exact(comp, usize, path)
            out.extend(decode_kbs_records(raw, base, rc, path))
        except Invalid:
            pass
    return out
