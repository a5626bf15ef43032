"""Mutators: each takes a backup directory (a private copy) and a Random, damages it in place and
returns a JSON-able description. Independent of fsspec_kbs (uses the reference's checksums)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lz4.block
import lz4.frame
import zstandard

from tests.fuzz.reference import crc32, crc64_xz

INTERESTING = [0, 1, -1, 2, 255, 256, 65535, 1 << 31, (1 << 31) - 1, 1 << 32, (1 << 32) + 2,
               (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 255 * 1024 * 1024]


class Skip(Exception):
    """The mutator does not apply to this backup."""


# ----------------------------------------------------------------------------------------------
# file helpers

def kbs_segments(b: Path) -> list[Path]:
    return sorted(p for p in (b / "topics").glob("*/*/segment-*.kbs") if p.is_file())


def oso_segments(b: Path) -> list[Path]:
    return sorted(p for p in (b / "topics").glob("*/partition=*/segment-*") if p.is_file())


def layout(b: Path) -> str:
    return "oso" if list((b / "topics").glob("*/partition=*")) else "kbs"


def load_manifest(b: Path) -> Any:
    return json.loads((b / "manifest.json").read_text())


def save_manifest(b: Path, m: Any) -> None:
    (b / "manifest.json").write_text(json.dumps(m, indent=2))


def rel(b: Path, p: Path) -> str:
    return str(p.relative_to(b))


# ----------------------------------------------------------------------------------------------
# codecs

def kbs_compress(codec: int, raw: bytes) -> bytes:
    if codec == 0:
        return raw
    if codec == 1:
        return lz4.frame.compress(raw)
    return zstandard.ZstdCompressor(level=3).compress(raw)


def kbs_decompress(codec: int, comp: bytes) -> bytes:
    if codec == 0:
        return comp
    if codec == 1:
        return lz4.frame.decompress(comp)
    return zstandard.ZstdDecompressor().decompress(comp, max_output_size=64 << 20)


# ----------------------------------------------------------------------------------------------
# KBS segment model

def parse_kbs(data: bytes) -> dict:
    magic, ver, codec, flags, first, count, crc = struct.unpack_from("<4sBBHQQQ", data, 0)
    last, nb, fmagic = struct.unpack_from("<QI4s", data, len(data) - 16)
    batches = []
    pos, end = 32, len(data) - 16
    while pos + 24 <= end:
        base, rc, csize, usize, bcrc = struct.unpack_from("<QIIII", data, pos)
        comp = data[pos + 24:pos + 24 + csize]
        batches.append({"base": base, "rc": rc, "csize": csize, "usize": usize, "crc": bcrc, "comp": comp,
                        "pos": pos})
        pos += 24 + csize
    return {"magic": magic, "ver": ver, "codec": codec, "flags": flags, "first": first, "count": count,
            "crc": crc, "last": last, "nb": nb, "fmagic": fmagic, "batches": batches}


def build_kbs(s: dict, fix_crc32: bool = True, fix_sizes: bool = True, fix_crc64: bool = True) -> bytes:
    body = bytearray()
    for b in s["batches"]:
        if fix_sizes:
            b["csize"] = len(b["comp"])
        if fix_crc32:
            b["crc"] = crc32(b["comp"])
        body += struct.pack("<QIIII", b["base"] & (2**64 - 1), b["rc"] & 0xFFFFFFFF, b["csize"] & 0xFFFFFFFF,
                            b["usize"] & 0xFFFFFFFF, b["crc"]) + b["comp"]
    if fix_crc64:
        s["crc"] = crc64_xz(bytes(body))
    head = struct.pack("<4sBBHQQQ", s["magic"], s["ver"] & 0xFF, s["codec"] & 0xFF, s["flags"] & 0xFFFF,
                       s["first"] & (2**64 - 1), s["count"] & (2**64 - 1), s["crc"])
    foot = struct.pack("<QI4s", s["last"] & (2**64 - 1), s["nb"] & 0xFFFFFFFF, s["fmagic"])
    return head + bytes(body) + foot


def zz(v: int) -> int:
    return ((v << 1) ^ (v >> 63)) & (2**64 - 1) if -(1 << 63) <= v < (1 << 63) else v


def uvarint(u: int) -> bytes:
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _sv(buf: bytes, pos: int) -> tuple[int, int]:
    u = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (u >> 1) ^ -(u & 1), pos


def tokenize(raw: bytes, count: int) -> list[list]:
    """Records of a (valid) batch as token lists [("v", int) | ("b", bytes)]."""
    recs = []
    pos = 0
    for _ in range(count):
        toks: list = []

        def v() -> int:
            nonlocal pos
            x, pos = _sv(raw, pos)
            toks.append(["v", x])  # noqa: B023
            return x

        def blob(n: int) -> None:
            nonlocal pos
            if n > 0:
                toks.append(["b", raw[pos:pos + n]])  # noqa: B023
                pos += n

        v()
        v()
        blob(v())
        blob(v())
        for _h in range(v()):
            blob(v())
            blob(v())
        recs.append(toks)
    return recs


def untokenize(recs: list[list]) -> bytes:
    out = bytearray()
    for toks in recs:
        for kind, x in toks:
            if kind == "v":
                out += uvarint(zz(x))
            elif kind == "raw":
                out += x
            else:
                out += x
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# manifest refresh (so that damage gets past the manifest's crc64/size cross-checks)

def refresh_kbs_manifest(b: Path, full: bool = False) -> None:
    """Recompute segment_index size_bytes/crc64 and statistics byte totals from the files.

    ``full``: also first/last offset, records, min/max timestamps from a tolerant decode, and
    partition/statistics record counts (an adversary who forges everything consistently).
    """
    try:
        m = load_manifest(b)
    except Exception:
        return
    tot_size = tot_unc = 0
    for t in m.get("topics", []):
        for p in t.get("partitions", []):
            pdir = b / "topics" / t["name"] / str(p.get("partition"))
            files = sorted(pdir.glob("segment-*.kbs")) if pdir.is_dir() else []
            idx = {e.get("file"): e for e in p.get("segment_index", []) or [] if isinstance(e, dict)}
            for f in files:
                if not f.is_file():
                    continue
                data = f.read_bytes()
                tot_size += len(data)
                if len(data) < 48:
                    continue
                s = parse_kbs(data)
                tot_unc += sum(x["usize"] for x in s["batches"])
                e = idx.get(f.name)
                if e is None:
                    continue
                e["size_bytes"] = len(data)
                e["crc64"] = s["crc"]
                if full:
                    try:
                        recs = []
                        for x in s["batches"]:
                            raw = kbs_decompress(s["codec"], x["comp"])
                            ts = 0
                            for i, toks in enumerate(tokenize(raw, x["rc"])):
                                ts = toks[1][1] if i == 0 else ts + toks[1][1]
                                recs.append((x["base"] + toks[0][1], ts))
                        e.update(first_offset=recs[0][0], last_offset=recs[-1][0], records=len(recs),
                                 min_timestamp=min(r[1] for r in recs), max_timestamp=max(r[1] for r in recs))
                    except Exception:
                        pass
    st = m.get("statistics")
    if isinstance(st, dict):
        st["compressed_bytes"] = tot_size
        st["uncompressed_bytes"] = tot_unc
    save_manifest(b, m)


def oso_body(data: bytes) -> tuple[int, bytes]:
    codec = data[5]
    body = data[32:-8]
    if codec == 0:
        return codec, body
    if codec == 1:
        return codec, zstandard.ZstdDecompressor().decompress(body, max_output_size=256 << 20)
    n = struct.unpack_from("<I", body, 0)[0]
    return codec, lz4.block.decompress(body[4:], uncompressed_size=n)


def oso_pack(header: bytes, codec: int, raw: bytes) -> bytes:
    if codec == 0:
        body = raw
    elif codec == 1:
        body = zstandard.ZstdCompressor(level=3).compress(raw)
    else:
        body = struct.pack("<I", len(raw)) + lz4.block.compress(raw, store_size=False)
    data = bytearray(header + body + b"\0\0\0\0BKAE")
    return oso_fix_crc(data)


def oso_fix_crc(data: bytearray | bytes) -> bytes:
    data = bytearray(data)
    data[-8:-4] = struct.pack("<I", crc32(bytes(data[:-8])))
    return bytes(data)


def refresh_oso_manifest(b: Path) -> None:
    try:
        m = load_manifest(b)
    except Exception:
        return
    root = b.parent
    for t in m.get("topics", []):
        for p in t.get("partitions", []):
            for s in p.get("segments", []):
                f = root / s["key"]
                if not f.is_file():
                    continue
                data = f.read_bytes()
                s["compressed_size"] = len(data)
                try:  # noqa: SIM105
                    s["uncompressed_size"] = len(oso_body(data)[1])
                except Exception:
                    pass
    save_manifest(b, m)


def oso_records(raw: bytes) -> list[dict]:
    out = []
    pos = 0
    while pos < len(raw):
        n = struct.unpack_from("<I", raw, pos)[0]
        out.append({"pos": pos, "len": n})
        pos += 4 + n
    return out


# ----------------------------------------------------------------------------------------------
# mutators

MUTATORS: dict[str, tuple[tuple[str, ...], int, Callable]] = {}


def mutator(layouts: tuple[str, ...] = ("kbs",), weight: int = 1) -> Callable:
    def deco(fn: Callable) -> Callable:
        MUTATORS[fn.__name__] = (layouts, weight, fn)
        return fn
    return deco


def pick_seg(b: Path, rng: random.Random) -> Path:
    segs = kbs_segments(b) if layout(b) == "kbs" else oso_segments(b)
    if not segs:
        raise Skip("no segments")
    return rng.choice(segs)


def _fix_after(b: Path, rng: random.Random, desc: dict, lay: str = "kbs") -> None:
    r = rng.random()
    if lay == "kbs":
        if r < 0.75:
            refresh_kbs_manifest(b, full=r < 0.35)
            desc["manifest_refreshed"] = "full" if r < 0.35 else "crc64+size"
    elif r < 0.85:
        refresh_oso_manifest(b)
        desc["manifest_refreshed"] = "sizes"


@mutator(("kbs", "oso"), 2)
def seg_byteflip(b: Path, rng: random.Random) -> dict:
    """Flip random bytes anywhere in a segment (checksums left as they are)."""
    p = pick_seg(b, rng)
    data = bytearray(p.read_bytes())
    spots = []
    for _ in range(rng.choice((1, 1, 2, 5))):
        i = rng.randrange(len(data))
        data[i] ^= rng.choice((1, 0x80, 0xFF, rng.randint(1, 255)))
        spots.append(i)
    p.write_bytes(bytes(data))
    return {"file": rel(b, p), "bytes": spots}


@mutator(("kbs",), 4)
def seg_byteflip_fixcrc(b: Path, rng: random.Random) -> dict:
    """Flip bytes inside one batch (header or compressed data), then recompute CRC-32, CRC-64."""
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if not s["batches"]:
        raise Skip("empty")
    bi = rng.randrange(len(s["batches"]))
    bt = s["batches"][bi]
    comp = bytearray(bt["comp"])
    where = rng.choice(("comp", "comp", "header"))
    if where == "comp" and comp:
        for _ in range(rng.choice((1, 2, 4))):
            comp[rng.randrange(len(comp))] ^= rng.randint(1, 255)
        bt["comp"] = bytes(comp)
        fixsize = True
    else:
        field = rng.choice(("base", "rc", "csize", "usize"))
        bt[field] ^= 1 << rng.randrange(32 if field != "base" else 64)
        fixsize = field != "csize"
    p.write_bytes(build_kbs(s, fix_sizes=fixsize))
    desc = {"file": rel(b, p), "batch": bi, "where": where, "crcs": "recomputed"}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs", "oso"), 2)
def seg_truncate(b: Path, rng: random.Random) -> dict:
    p = pick_seg(b, rng)
    data = p.read_bytes()
    k = rng.choice((1, 8, 16, 17, 24, 100, len(data) // 2, len(data) - 1, len(data)))
    k = max(1, min(k, len(data)))
    p.write_bytes(data[:-k])
    desc = {"file": rel(b, p), "cut": k}
    _fix_after(b, rng, desc, layout(b))
    return desc


@mutator(("kbs", "oso"), 1)
def seg_extend(b: Path, rng: random.Random) -> dict:
    """Append junk, or (KBS) insert junk between the last batch and the footer with CRC-64 redone."""
    p = pick_seg(b, rng)
    data = p.read_bytes()
    junk = rng.choice((b"\0", b"\0" * 24, rng.randbytes(rng.randint(1, 64)), data[32:80]))
    lay = layout(b)
    if lay == "kbs" and rng.random() < 0.6:
        s = parse_kbs(data)
        out = bytearray(build_kbs(s))
        out[-16:-16] = junk
        body = bytes(out[32:-16])
        out[24:32] = struct.pack("<Q", crc64_xz(body))
        p.write_bytes(bytes(out))
        how = "before footer, CRC-64 redone"
    elif lay == "oso" and rng.random() < 0.6:
        out = bytearray(data)
        out[-8:-8] = junk
        p.write_bytes(oso_fix_crc(out))
        how = "before footer, CRC-32 redone"
    else:
        p.write_bytes(data + junk)
        how = "after footer"
    desc = {"file": rel(b, p), "added": len(junk), "how": how}
    _fix_after(b, rng, desc, lay)
    return desc


@mutator(("kbs",), 2)
def seg_header_field(b: Path, rng: random.Random) -> dict:
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    field = rng.choice(("ver", "codec", "flags", "first", "first", "count", "count", "magic"))
    old = s[field]
    if field == "magic":
        s["magic"] = rng.choice((b"KBS2", b"kbs1", b"\0\0\0\0"))
    elif field == "codec" and rng.random() < 0.5:
        s["codec"] = rng.choice([c for c in (0, 1, 2) if c != old])
    else:
        s[field] = rng.choice((old + 1, old - 1, 0, rng.choice(INTERESTING))) & (2**64 - 1)
    p.write_bytes(build_kbs(s, False, False, False))
    desc = {"file": rel(b, p), "field": field, "old": str(old), "new": str(s[field])}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 2)
def seg_footer_field(b: Path, rng: random.Random) -> dict:
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    field = rng.choice(("last", "last", "nb", "fmagic"))
    old = s[field]
    if field == "fmagic":
        s["fmagic"] = b"KBSX"
    else:
        s[field] = rng.choice((old + 1, old - 1, 0, rng.choice(INTERESTING))) & (2**64 - 1)
    p.write_bytes(build_kbs(s, False, False, False))
    desc = {"file": rel(b, p), "field": field, "old": str(old), "new": str(s[field])}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 3)
def batch_header_field(b: Path, rng: random.Random) -> dict:
    """Edit a batch header field to an interesting value; CRC-32/CRC-64 recomputed."""
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if not s["batches"]:
        raise Skip("empty")
    bi = rng.randrange(len(s["batches"]))
    bt = s["batches"][bi]
    field = rng.choice(("base", "base", "rc", "rc", "usize", "usize", "csize"))
    old = bt[field]
    bt[field] = rng.choice((old + 1, old - 1, 0, rng.choice(INTERESTING))) & (2**64 - 1 if field == "base" else 2**32 - 1)
    if field == "base" and rng.random() < 0.5:
        # keep the header/footer consistent with the new base offset
        delta = bt["base"] - old
        if bi == 0:
            s["first"] = bt["base"]
        if bi == len(s["batches"]) - 1:
            s["last"] = (s["last"] + delta) & (2**64 - 1)
    p.write_bytes(build_kbs(s, fix_sizes=field != "csize"))
    desc = {"file": rel(b, p), "batch": bi, "field": field, "old": old, "new": bt[field]}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 2)
def batch_usize_bomb(b: Path, rng: random.Random) -> dict:
    """Every batch of several segments declares 255 MiB uncompressed (CRCs recomputed)."""
    segs = kbs_segments(b)
    chosen = rng.sample(segs, min(len(segs), rng.choice((1, 3, len(segs)))))
    for p in chosen:
        s = parse_kbs(p.read_bytes())
        for bt in s["batches"]:
            bt["usize"] = 255 * 1024 * 1024 - rng.randint(0, 3)
            if s["codec"] == 0:
                bt["csize"] = bt["usize"]
        p.write_bytes(build_kbs(s, fix_sizes=s["codec"] != 0))
    desc = {"files": [rel(b, p) for p in chosen], "usize": "255 MiB"}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 1)
def batch_real_bomb(b: Path, rng: random.Random) -> dict:
    """A batch's frame replaced by one that decompresses to 64 MiB, declared as the old size."""
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if s["codec"] == 0 or not s["batches"]:
        raise Skip("needs a codec")
    bt = rng.choice(s["batches"])
    bt["comp"] = kbs_compress(s["codec"], b"\0" * (64 << 20))
    p.write_bytes(build_kbs(s))
    desc = {"file": rel(b, p), "declared": bt["usize"], "real": 64 << 20}
    _fix_after(b, rng, desc)
    return desc


def _edit_batch_records(b: Path, rng: random.Random, edit: Callable[[list, random.Random, dict], bytes | None],
                        name: str) -> dict:
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if not s["batches"]:
        raise Skip("empty")
    bi = rng.randrange(len(s["batches"]))
    bt = s["batches"][bi]
    raw = kbs_decompress(s["codec"], bt["comp"])
    recs = tokenize(raw, bt["rc"])
    desc: dict = {"file": rel(b, p), "batch": bi, "edit": name}
    new = edit(recs, rng, desc)
    if new is None:
        new = untokenize(recs)
    bt["comp"] = kbs_compress(s["codec"], new)
    bt["usize"] = len(new) if rng.random() < 0.9 else len(raw)
    p.write_bytes(build_kbs(s))
    desc["recompressed"] = "sizes+CRC-32+CRC-64 recomputed"
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 5)
def record_varint_edit(b: Path, rng: random.Random) -> dict:
    """Change one varint inside the decompressed records (deltas, lengths, header count)."""
    def edit(recs: list, rng: random.Random, desc: dict) -> None:
        ri = rng.randrange(len(recs))
        vs = [i for i, t in enumerate(recs[ri]) if t[0] == "v"]
        ti = rng.choice(vs)
        old = recs[ri][ti][1]
        r = rng.random()
        if r < 0.1:
            recs[ri][ti] = ["raw", b"\xff" * 10 + b"\x01"]  # 11-byte varint
            new: Any = "11-byte varint"
        elif r < 0.2:
            recs[ri][ti] = ["raw", b"\xff" * 9 + b"\x7f"]  # 10th byte overflows 64 bits
            new = "varint overflowing 64 bits"
        else:
            new = rng.choice((old + 1, old - 1, 0, -1, -2, old * 2 + 1, rng.choice(INTERESTING),
                              -(1 << 63), (1 << 63) - 1))
            recs[ri][ti][1] = new
        desc.update(record=ri, token=ti, old=old, new=str(new),
                    field=["offset_delta", "timestamp_delta"][ti] if ti < 2 else "length/count")
    return _edit_batch_records(b, rng, edit, "varint")


@mutator(("kbs",), 2)
def record_payload_flip(b: Path, rng: random.Random) -> dict:
    """Flip bytes of the decompressed records; recompress."""
    def edit(recs: list, rng: random.Random, desc: dict) -> bytes:
        raw = bytearray(untokenize(recs))
        spots = [rng.randrange(len(raw)) for _ in range(rng.choice((1, 2, 3)))]
        for i in spots:
            raw[i] ^= rng.randint(1, 255)
        desc["spots"] = spots
        return bytes(raw)
    return _edit_batch_records(b, rng, edit, "payload-flip")


@mutator(("kbs",), 1)
def record_trailing(b: Path, rng: random.Random) -> dict:
    """Add bytes after the last record, or drop the last few bytes (recompressed)."""
    def edit(recs: list, rng: random.Random, desc: dict) -> bytes:
        raw = untokenize(recs)
        if rng.random() < 0.5:
            desc["how"] = "trailing bytes"
            return raw + rng.choice((b"\0", b"\x02\x00", rng.randbytes(5)))
        k = rng.randint(1, min(5, len(raw)))
        desc["how"] = f"dropped {k} bytes"
        return raw[:-k]
    return _edit_batch_records(b, rng, edit, "trailing")


@mutator(("kbs",), 3)
def ts_overflow(b: Path, rng: random.Random) -> dict:
    """A later record's timestamp delta makes the running timestamp overflow int64."""
    def edit(recs: list, rng: random.Random, desc: dict) -> None:
        if len(recs) < 2:
            raise Skip("one record")
        ri = rng.randrange(1, len(recs))
        prev = recs[0][1][1]
        for r in recs[1:ri]:
            prev += r[1][1]
        new = min((1 << 63) - 1, (1 << 63) - prev + rng.randint(0, 1000))  # prev + new > int64 max
        recs[ri][1][1] = new
        if ri + 1 < len(recs) and rng.random() < 0.5:
            recs[ri + 1][1][1] = -new  # come back: only the one record wraps
        desc.update(record=ri, prev_timestamp=prev, delta=str(new))
    return _edit_batch_records(b, rng, edit, "ts-overflow")


@mutator(("kbs",), 1)
def batch_codec_swap(b: Path, rng: random.Random) -> dict:
    """Recompress one batch with another codec, header codec unchanged (CRCs recomputed)."""
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if not s["batches"]:
        raise Skip("empty")
    bt = rng.choice(s["batches"])
    raw = kbs_decompress(s["codec"], bt["comp"])
    other = rng.choice([c for c in (0, 1, 2) if c != s["codec"]])
    bt["comp"] = kbs_compress(other, raw)
    if rng.random() < 0.5 and other != 0:
        bt["comp"] += kbs_compress(other, b"")  # an extra empty frame after the batch's frame
    p.write_bytes(build_kbs(s))
    desc = {"file": rel(b, p), "segment_codec": s["codec"], "batch_codec": other}
    _fix_after(b, rng, desc)
    return desc


@mutator(("kbs",), 2)
def segment_offset_shift(b: Path, rng: random.Random) -> dict:
    """Shift a whole segment's offsets consistently (header, batches, footer) so it overlaps or gaps."""
    p = pick_seg(b, rng)
    s = parse_kbs(p.read_bytes())
    if not s["batches"]:
        raise Skip("empty")
    d = rng.choice((-1, -5, -1000, 1, 3, 1 << 40))
    for bt in s["batches"]:
        bt["base"] += d
    s["first"] += d
    s["last"] += d
    if s["first"] < 0:
        raise Skip("negative")
    p.write_bytes(build_kbs(s))
    desc = {"file": rel(b, p), "shift": d}
    _fix_after(b, rng, desc)
    return desc


# -- file-level -------------------------------------------------------------------------------

def _partition_dirs(b: Path) -> list[Path]:
    if layout(b) == "kbs":
        return sorted(d for d in (b / "topics").glob("*/*") if d.is_dir())
    return sorted(d for d in (b / "topics").glob("*/partition=*") if d.is_dir())


@mutator(("kbs", "oso"), 2)
def swap_files_between_partitions(b: Path, rng: random.Random) -> dict:
    parts = _partition_dirs(b)
    if len(parts) < 2:
        raise Skip("one partition")
    a, c = rng.sample(parts, 2)
    fa = sorted(x for x in a.iterdir() if x.name.startswith("segment-"))
    fc = sorted(x for x in c.iterdir() if x.name.startswith("segment-"))
    x, y = rng.choice(fa), rng.choice(fc)
    dx, dy = x.read_bytes(), y.read_bytes()
    how = rng.choice(("swap", "replace"))
    x.write_bytes(dy)
    if how == "swap":
        y.write_bytes(dx)
    return {"how": how, "a": rel(b, x), "b": rel(b, y)}


@mutator(("kbs",), 1)
def swap_files_within_partition(b: Path, rng: random.Random) -> dict:
    parts = [d for d in _partition_dirs(b) if len(list(d.glob("segment-*.kbs"))) >= 2]
    if not parts:
        raise Skip("single segments")
    d = rng.choice(parts)
    x, y = rng.sample(sorted(d.glob("segment-*.kbs")), 2)
    dx, dy = x.read_bytes(), y.read_bytes()
    x.write_bytes(dy)
    y.write_bytes(dx)
    return {"a": rel(b, x), "b": rel(b, y)}


@mutator(("kbs", "oso"), 2)
def segment_path_is_directory(b: Path, rng: random.Random) -> dict:
    p = pick_seg(b, rng)
    p.unlink()
    p.mkdir()
    if rng.random() < 0.5:
        (p / "x").write_bytes(b"junk")
    return {"file": rel(b, p)}


@mutator(("kbs", "oso"), 2)
def segment_file_removed_or_added(b: Path, rng: random.Random) -> dict:
    lay = layout(b)
    p = pick_seg(b, rng)
    how = rng.choice(("remove", "add-next", "add-copy-gap", "rename-gap"))
    if how == "remove":
        p.unlink()
        return {"how": how, "file": rel(b, p)}
    segs = sorted(x for x in p.parent.iterdir() if x.name.startswith("segment-"))
    last = segs[-1]
    if lay == "kbs":
        n = int(last.name[8:16])
        step = 1 if how == "add-next" else 2
        new = p.parent / f"segment-{n + step:08d}.kbs"
    else:
        new = p.parent / last.name.replace("segment-", "segment-9")
    if how == "rename-gap":
        last.rename(new)
        return {"how": how, "file": rel(b, last), "to": rel(b, new)}
    shutil.copyfile(rng.choice(segs), new)
    return {"how": how, "file": rel(b, new)}


@mutator(("kbs", "oso"), 1)
def manifest_removed(b: Path, rng: random.Random) -> dict:
    (b / "manifest.json").unlink()
    return {"removed": "manifest.json"}


@mutator(("kbs", "oso"), 1)
def extra_partition_on_disk(b: Path, rng: random.Random) -> dict:
    parts = _partition_dirs(b)
    src = rng.choice(parts)
    if layout(b) == "kbs":
        dst = src.parent / str(int(src.name) + 7) if rng.random() < 0.5 else b / "topics" / "ghost" / "0"
    else:
        dst = (src.parent / f"partition={int(src.name.split('=')[1]) + 7}" if rng.random() < 0.5
               else b / "topics" / "ghost" / "partition=0")
    shutil.copytree(src, dst)
    if layout(b) == "oso":  # segment keys would not match anyway; the files are what matter
        pass
    return {"copied": rel(b, src), "to": rel(b, dst)}


# -- manifest (parsed) ------------------------------------------------------------------------

def _numeric_leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _numeric_leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _numeric_leaves(v, path + (i,))
    elif isinstance(obj, int) and not isinstance(obj, bool) or obj is None:
        out.append(path)
    return out


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _set(obj: Any, path: tuple, v: Any) -> None:
    _get(obj, path[:-1])[path[-1]] = v


@mutator(("kbs", "oso"), 6)
def manifest_numeric(b: Path, rng: random.Random) -> dict:
    """Any numeric manifest field: ±1, 0, -1, huge, wrong type."""
    m = load_manifest(b)
    leaves = _numeric_leaves(m)
    path = rng.choice(leaves)
    old = _get(m, path)
    base = old if isinstance(old, int) else 0
    new = rng.choice((base + 1, base - 1, 0, -1, 1 << 63, 1 << 64, 10**30, (1 << 32) + 2, str(base), None,
                      float(base) + 0.5, float(base), True, [base], {"v": base}))
    _set(m, path, new)
    save_manifest(b, m)
    return {"field": "/".join(map(str, path)), "old": old, "new": repr(new)}


@mutator(("kbs",), 4)
def manifest_index_bounds(b: Path, rng: random.Random) -> dict:
    """segment_index min/max_timestamp or first/last_offset moved (prunes filtered reads)."""
    m = load_manifest(b)
    entries = [(t["name"], p["partition"], i, e) for t in m["topics"] for p in t["partitions"]
               for i, e in enumerate(p.get("segment_index") or [])]
    if not entries:
        raise Skip("no segment_index")
    tn, pn, i, e = rng.choice(entries)
    field = rng.choice(("min_timestamp", "max_timestamp", "first_offset", "last_offset"))
    old = e[field]
    span = rng.choice((1, 50, 500, 100000))
    e[field] = old + span if field.startswith(("min", "first")) else old - span
    if rng.random() < 0.3:
        e[field] = old - span if field.startswith(("min", "first")) else old + span
    save_manifest(b, m)
    return {"entry": f"{tn}/{pn} segment_index[{i}]", "field": field, "old": old, "new": e[field]}


@mutator(("kbs",), 3)
def manifest_structure(b: Path, rng: random.Random) -> dict:
    """Duplicate/remove/empty/swap entries of topics, partitions and segment_index."""
    m = load_manifest(b)
    how = rng.choice(("dup-partition", "dup-topic", "empty-partitions", "drop-topic", "drop-partition",
                      "dup-index", "drop-index", "swap-index", "segments-minus-1", "segments-plus-1",
                      "segments-huge", "empty-topics", "swap-partition-numbers"))
    t = rng.choice(m["topics"])
    p = rng.choice(t["partitions"]) if t["partitions"] else None
    if p is None:
        raise Skip("no partition")
    idx = p.get("segment_index")
    if how == "dup-partition":
        t["partitions"].append(json.loads(json.dumps(p)))
    elif how == "dup-topic":
        m["topics"].append(json.loads(json.dumps(t)))
    elif how == "empty-partitions":
        t["partitions"] = []
    elif how == "drop-topic":
        m["topics"].remove(t)
    elif how == "drop-partition":
        t["partitions"].remove(p)
    elif how == "empty-topics":
        m["topics"] = []
    elif how in ("dup-index", "drop-index", "swap-index"):
        if not idx:
            how = "segments-minus-1"
        elif how == "dup-index":
            idx.append(dict(idx[-1]))
        elif how == "drop-index":
            idx.pop(rng.randrange(len(idx)))
        elif len(idx) >= 2:
            i, j = rng.sample(range(len(idx)), 2)
            idx[i], idx[j] = idx[j], idx[i]
        else:
            idx[0]["file"] = "segment-00000001.kbs"
    if how == "segments-minus-1":
        p["segments"] -= 1
    elif how == "segments-plus-1":
        p["segments"] += 1
    elif how == "segments-huge":
        p["segments"] = rng.choice((4294967298, 10**30, 1 << 63, 1 << 64, 2**31))
    elif how == "swap-partition-numbers":
        ps = t["partitions"]
        if len(ps) < 2:
            raise Skip("one partition")
        ps[0]["partition"], ps[1]["partition"] = ps[1]["partition"], ps[0]["partition"]
    save_manifest(b, m)
    return {"how": how, "topic": t["name"], "partition": p.get("partition")}


@mutator(("kbs", "oso"), 3)
def manifest_raw_text(b: Path, rng: random.Random) -> dict:
    """Raw text edits: duplicated keys, deep nesting, huge integers, junk, truncation, non-UTF-8."""
    mp = b / "manifest.json"
    text = mp.read_text()
    how = rng.choice(("dup-topics-key", "dup-topics-key-empty-first", "deep-known", "deep-unknown",
                      "huge-int-known", "huge-int-unknown", "truncate", "trailing-junk", "non-utf8",
                      "dup-inner-key", "nan"))
    if how.startswith("dup-topics-key"):
        i = text.index('"topics"')
        if how.endswith("empty-first"):
            text = text[:i] + '"topics": [], ' + text[i:]
        else:  # second "topics" key at the end holding nothing
            j = text.rstrip().rindex("}")
            text = text[:j] + ', "topics": []\n}'
    elif how == "dup-inner-key":
        keys = list(re.finditer(r'"(records|segments|first_offset|partition|record_count|partition_id)": (\d+)', text))
        mt = rng.choice(keys)
        text = text[:mt.start()] + f'"{mt.group(1)}": {int(mt.group(2)) + 1}, ' + text[mt.start():]
    elif how.startswith("deep"):
        depth = rng.choice((200, 1000, 5000, 100000))
        nest = "[" * depth + "]" * depth
        if how == "deep-known":
            keys = list(re.finditer(r'"(records|segments|first_offset|compressed_bytes|record_count)": (\d+)', text))
            mt = rng.choice(keys)
            text = text[:mt.start(2)] + nest + text[mt.end(2):]
        else:
            j = text.rstrip().rindex("}")
            text = text[:j] + f', "x_extra": {nest}\n}}'
        how += f"-{depth}"
    elif how.startswith("huge-int"):
        digits = rng.choice((50, 4301, 5000, 100000))
        big = "9" * digits
        if how == "huge-int-known":
            keys = list(re.finditer(r'"(records|segments|first_offset|last_offset|crc64|record_count|start_offset)": (\d+)', text))
            mt = rng.choice(keys)
            text = text[:mt.start(2)] + big + text[mt.end(2):]
        else:
            j = text.rstrip().rindex("}")
            text = text[:j] + f', "x_extra": {big}\n}}'
        how += f"-{digits}"
    elif how == "truncate":
        text = text[:rng.randrange(len(text))]
    elif how == "trailing-junk":
        text = text + rng.choice(("x", "{}", "\0", "]"))
    elif how == "non-utf8":
        mp.write_bytes(text.encode()[:20] + b"\xff\xfe" + text.encode()[20:])
        return {"how": how}
    elif how == "nan":
        keys = list(re.finditer(r'"(records|segments|record_count)": (\d+)', text))
        mt = rng.choice(keys)
        text = text[:mt.start(2)] + "NaN" + text[mt.end(2):]
    mp.write_text(text)
    return {"how": how}


@mutator(("kbs",), 1)
def manifest_version(b: Path, rng: random.Random) -> dict:
    m = load_manifest(b)
    old = m.get("version")
    m["version"] = rng.choice(("1.0", "1.9", "2.0", "1", 1.1, "", None, "1.1.1", "0.9", "01.1"))
    if m["version"] == "1.0" and rng.random() < 0.5:
        pass  # keep the segment_index under a 1.0 version
    save_manifest(b, m)
    return {"old": old, "new": repr(m["version"])}


@mutator(("kbs", "oso"), 1)
def manifest_topic_name(b: Path, rng: random.Random) -> dict:
    m = load_manifest(b)
    t = rng.choice(m["topics"])
    old = t["name"]
    t["name"] = rng.choice(("../../etc", "", ".", "..", "a/b", "x" * 300, "orders\0", 5, None, old.upper()))
    save_manifest(b, m)
    return {"old": old, "new": repr(t["name"])}


# -- oso-specific -----------------------------------------------------------------------------

@mutator(("oso",), 6)
def oso_manifest_subset(b: Path, rng: random.Random) -> dict:
    """The manifest lists only some of the segment files on disk (a killed backup)."""
    m = load_manifest(b)
    how = rng.choice(("drop-last-segments", "drop-last-segments", "drop-middle-segment", "drop-partition",
                      "drop-topic", "empty-segments"))
    t = rng.choice(m["topics"])
    p = rng.choice(t["partitions"])
    segs = p["segments"]
    if how == "drop-last-segments":
        k = rng.randint(1, len(segs))
        del segs[len(segs) - k:]
        how += f"-{k}"
    elif how == "drop-middle-segment":
        if len(segs) < 3:
            raise Skip("short")
        del segs[rng.randrange(1, len(segs) - 1)]
    elif how == "drop-partition":
        t["partitions"].remove(p)
    elif how == "drop-topic":
        m["topics"].remove(t)
    else:
        p["segments"] = []
    save_manifest(b, m)
    return {"how": how, "topic": t["name"], "partition": p["partition_id"]}


@mutator(("oso",), 3)
def oso_structure(b: Path, rng: random.Random) -> dict:
    m = load_manifest(b)
    how = rng.choice(("dup-segment", "dup-partition", "swap-keys", "key-other-partition", "reorder",
                      "key-traversal", "key-missing-file"))
    t = rng.choice(m["topics"])
    p = rng.choice(t["partitions"])
    segs = p["segments"]
    allsegs = [s for tt in m["topics"] for pp in tt["partitions"] for s in pp["segments"]]
    if how == "dup-segment":
        segs.append(dict(segs[-1]))
    elif how == "dup-partition":
        t["partitions"].append(json.loads(json.dumps(p)))
    elif how == "swap-keys":
        x, y = rng.sample(allsegs, 2) if len(allsegs) >= 2 else (segs[0], segs[0])
        x["key"], y["key"] = y["key"], x["key"]
    elif how == "key-other-partition":
        other = rng.choice(allsegs)
        segs[rng.randrange(len(segs))]["key"] = other["key"]
    elif how == "reorder":
        if len(segs) < 2:
            raise Skip("short")
        segs.reverse()
    elif how == "key-traversal":
        s = rng.choice(segs)
        s["key"] = s["key"].replace("/topics/", "/topics/../../")
    else:
        s = rng.choice(segs)
        s["key"] = s["key"][:-5] + "9" + s["key"][-5:]
    save_manifest(b, m)
    return {"how": how, "topic": t["name"], "partition": p["partition_id"]}


@mutator(("oso",), 3)
def oso_seg_fixcrc(b: Path, rng: random.Random) -> dict:
    """Edit the header or flip body bytes, then recompute the CRC-32 footer."""
    p = pick_seg(b, rng)
    data = bytearray(p.read_bytes())
    how = rng.choice(("count", "start", "end", "codec", "version", "body", "body", "lz4-size"))
    if how in ("count", "start", "end"):
        off = {"count": 8, "start": 16, "end": 24}[how]
        old = struct.unpack_from("<Q", data, off)[0]
        struct.pack_into("<Q", data, off, rng.choice((old + 1, old - 1, 0, rng.choice(INTERESTING))) & (2**64 - 1))
    elif how == "codec":
        data[5] = rng.choice([c for c in (0, 1, 2, 3, 255) if c != data[5]])
    elif how == "version":
        data[4] = rng.choice((0, 2, 255))
    elif how == "lz4-size" and data[5] == 2:
        old = struct.unpack_from("<I", data, 32)[0]
        struct.pack_into("<I", data, 32, rng.choice((old + 1, old - 1, 0, 255 * 1024 * 1024, 2**32 - 1)))
    else:
        for _ in range(rng.choice((1, 2, 4))):
            i = rng.randrange(32, len(data) - 8)
            data[i] ^= rng.randint(1, 255)
        how = "body"
    p.write_bytes(oso_fix_crc(data))
    desc = {"file": rel(b, p), "how": how, "crc": "recomputed"}
    _fix_after(b, rng, desc, "oso")
    return desc


@mutator(("oso",), 4)
def oso_record_edit(b: Path, rng: random.Random) -> dict:
    """Edit a record field inside the decompressed body, recompress, recompute the CRC."""
    p = pick_seg(b, rng)
    data = p.read_bytes()
    codec, raw = oso_body(data)
    raw = bytearray(raw)
    recs = oso_records(bytes(raw))
    r = rng.choice(recs)
    pos = r["pos"]
    how = rng.choice(("length", "timestamp", "offset", "key-length", "flip", "trailing", "offset-dup",
                      "ts-extreme"))
    if how == "length":
        struct.pack_into("<I", raw, pos, rng.choice((r["len"] + 1, r["len"] - 1, 0, 2**32 - 1, 18)) & 0xFFFFFFFF)
    elif how in ("timestamp", "ts-extreme"):
        v = rng.choice((-(1 << 63), (1 << 63) - 1, -1, 0)) if how == "ts-extreme" else \
            struct.unpack_from("<q", raw, pos + 4)[0] + rng.choice((-10**6, 1, 10**9))
        struct.pack_into("<q", raw, pos + 4, v)
    elif how in ("offset", "offset-dup"):
        old = struct.unpack_from("<q", raw, pos + 12)[0]
        v = old - 1 if how == "offset-dup" else rng.choice((old + 1, -1, -(1 << 63), (1 << 63) - 1, old + 10**6))
        struct.pack_into("<q", raw, pos + 12, v)
    elif how == "key-length":
        struct.pack_into("<i", raw, pos + 20, rng.choice((-2, -1, 0, 1 << 30, 100000)))
    elif how == "flip":
        i = rng.randrange(len(raw))
        raw[i] ^= rng.randint(1, 255)
    else:
        raw += rng.choice((b"\0", b"\0\0\0\0", rng.randbytes(7)))
    p.write_bytes(oso_pack(data[:32], codec, bytes(raw)))
    desc = {"file": rel(b, p), "record_at": pos, "how": how, "recompressed": "CRC recomputed"}
    _fix_after(b, rng, desc, "oso")
    return desc


def applicable(lay: str) -> list[str]:
    return [n for n, (lays, _w, _f) in MUTATORS.items() if lay in lays]


def choose(lay: str, rng: random.Random) -> str:
    names = applicable(lay)
    # KBS_FUZZ_MUTATORS=a,b (substrings): only those mutators (e.g. "index" for the index ones).
    only = [w for w in os.environ.get("KBS_FUZZ_MUTATORS", "").split(",") if w]
    if only:
        names = [n for n in names if any(w in n for w in only)] or names
    weights = [MUTATORS[n][1] for n in names]
    return rng.choices(names, weights)[0]


def apply(name: str, b: Path, rng: random.Random) -> dict:
    return MUTATORS[name][2](b, rng)


# -- batch indexes (kbs-format.md §7) -------------------------------------------------------------
def _indexes(b: Path) -> list[Path]:
    found = sorted(p for p in (b / "topics").glob("*/*/segment-*.index") if p.is_file())
    if not found:
        raise Skip("no batch index")
    return found


def _set_index_crc(b: Path, index: Path, crc: int) -> None:
    """Point the manifest's index_crc32 of ``index``'s segment at ``crc``."""
    m = load_manifest(b)
    topic, part, seg = index.parent.parent.name, index.parent.name, index.name[:-len(".index")] + ".kbs"
    for t in m.get("topics", []):
        for p in t.get("partitions", []) if t.get("name") == topic else []:
            for e in p.get("segment_index") or [] if str(p.get("partition")) == part else []:
                if isinstance(e, dict) and e.get("file") == seg:
                    e["index_crc32"] = crc
    save_manifest(b, m)


@mutator(("kbs",), 2)
def index_byteflip(b: Path, rng: random.Random) -> dict:
    """Flip bytes of an index file (its CRCs no longer match: readers must not use it)."""
    p = rng.choice(_indexes(b))
    data = bytearray(p.read_bytes())
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(data))
    return {"file": rel(b, p), "byte": i}


@mutator(("kbs",), 1)
def index_truncate_or_remove(b: Path, rng: random.Random) -> dict:
    p = rng.choice(_indexes(b))
    how = rng.choice(("truncate", "extend", "remove", "empty"))
    if how == "remove":
        p.unlink()
    elif how == "empty":
        p.write_bytes(b"")
    elif how == "extend":
        p.write_bytes(p.read_bytes() + bytes(rng.randrange(1, 80)))
    else:
        data = p.read_bytes()
        p.write_bytes(data[: rng.randrange(len(data))])
    return {"file": rel(b, p), "how": how}


@mutator(("kbs",), 4)
def index_forge_entry(b: Path, rng: random.Random) -> dict:
    """Change one field of one entry, recompute the entries' CRC and (mostly) the manifest's
    index_crc32: an index that lies with every checksum intact."""
    p = rng.choice(_indexes(b))
    data = bytearray(p.read_bytes())
    count = struct.unpack_from("<I", data, 8)[0]
    if count == 0:
        raise Skip("empty index")
    i = rng.randrange(count)
    field_no = rng.randrange(5)
    at = 16 + 40 * i + 8 * field_no
    fmt = "<Q" if field_no < 3 else "<q"
    old = struct.unpack_from(fmt, data, at)[0]
    delta = rng.choice((-1, 1, -5, 5, -100, 100, 1 << 20, -(1 << 20)))
    new = old + delta
    if fmt == "<Q":
        new %= 1 << 64
    else:
        new = max(-(1 << 63), min((1 << 63) - 1, new))
    struct.pack_into(fmt, data, at, new)
    struct.pack_into("<I", data, 12, crc32(bytes(data[16:])))
    p.write_bytes(bytes(data))
    desc = {"file": rel(b, p), "entry": i, "field": ("base", "last", "position", "min_ts", "max_ts")[field_no],
            "old": old, "new": new}
    if rng.random() < 0.85:
        _set_index_crc(b, p, crc32(bytes(data)))
        desc["manifest_crc"] = "recomputed"
    return desc


@mutator(("kbs",), 1)
def index_swap(b: Path, rng: random.Random) -> dict:
    """Swap two index files (optionally with the manifest's index_crc32 following them)."""
    found = _indexes(b)
    if len(found) < 2:
        raise Skip("one index")
    x, y = rng.sample(found, 2)
    dx, dy = x.read_bytes(), y.read_bytes()
    x.write_bytes(dy)
    y.write_bytes(dx)
    desc = {"files": [rel(b, x), rel(b, y)]}
    if rng.random() < 0.5:
        _set_index_crc(b, x, crc32(dy))
        _set_index_crc(b, y, crc32(dx))
        desc["manifest_crc"] = "recomputed"
    return desc
