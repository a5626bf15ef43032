"""``convert_backup`` / ``kbs convert``: KBS <-> oso-native, lossless, following the facts file."""

from __future__ import annotations

import json
import re
import uuid
import zlib
from pathlib import Path

import fsspec
import lz4.block
import pytest
import zstandard
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsspec_kbs
from fsspec_kbs.cli.main import cli
from fsspec_kbs.errors import CommitConflictError, SegmentFormatError
from fsspec_kbs.format.columns import RecordColumns
from fsspec_kbs.maintenance.convert import ConvertProgress, convert_backup
from fsspec_kbs.store import BackupWriter, open_backup
from tests.conftest import load_expected, table_rows
from tests.oso.helpers import CODECS, copy_vector, segment_files, vector

_SEG = re.compile(r"segment-(\d{20})\.bin(\.zst|\.lz4)?")


def _check_facts(backup: Path, codec: str) -> int:
    """Independently re-read a written oso-native backup following the facts file; returns records."""
    m = json.loads((backup / "manifest.json").read_text())
    assert "version" not in m and isinstance(m["created_at"], int) and m["compression"] == codec
    assert set(m) >= {"backup_id", "created_at", "source_cluster_id", "source_brokers", "compression", "topics"}
    total = 0
    for t in m["topics"]:
        for p in t["partitions"]:
            prev_end = None
            for s in p["segments"]:
                assert s["key"] == (f"{backup.name}/topics/{t['name']}/partition={p['partition_id']}/"
                                    f"{s['key'].rsplit('/', 1)[-1]}")
                mt = _SEG.fullmatch(s["key"].rsplit("/", 1)[-1])
                assert mt and int(mt.group(1)) == s["start_offset"]
                assert (mt.group(2) or "") == {"none": "", "zstd": ".zst", "lz4": ".lz4"}[codec]
                data = (backup.parent / s["key"]).read_bytes()
                assert len(data) == s["compressed_size"]
                assert data[:4] == b"KBAK" and data[4] == 1 and data[-4:] == b"BKAE"
                assert data[5] == {"none": 0, "zstd": 1, "lz4": 2}[codec] and data[6:8] == b"\0\0"
                assert int.from_bytes(data[-8:-4], "little") == zlib.crc32(data[:-8])
                count = int.from_bytes(data[8:16], "little")
                start = int.from_bytes(data[16:24], "little", signed=True)
                end = int.from_bytes(data[24:32], "little", signed=True)
                assert (count, start, end) == (s["record_count"], s["start_offset"], s["end_offset"])
                body = data[32:-8]
                if codec == "zstd":
                    raw = zstandard.ZstdDecompressor().decompress(body)
                elif codec == "lz4":
                    size = int.from_bytes(body[:4], "little")
                    raw = lz4.block.decompress(body[4:], uncompressed_size=size)
                    assert len(raw) == size
                else:
                    raw = body
                assert len(raw) == s["uncompressed_size"]
                # walk the records: u32 length, i64 ts, i64 offset...
                pos, n, first_ts, last_ts = 0, 0, None, None
                while pos < len(raw):
                    ln = int.from_bytes(raw[pos : pos + 4], "little")
                    ts = int.from_bytes(raw[pos + 4 : pos + 12], "little", signed=True)
                    first_ts = ts if first_ts is None else first_ts
                    last_ts = ts
                    pos += 4 + ln
                    n += 1
                assert pos == len(raw) and n == count
                assert (first_ts, last_ts) == (s["start_timestamp"], s["end_timestamp"])
                assert prev_end is None or s["start_offset"] > prev_end
                prev_end = s["end_offset"]
                total += count
    return total


@pytest.mark.conformance
@pytest.mark.parametrize("codec", CODECS)
def test_vectors_oso_to_kbs_to_oso(conformance: Path, tmp_path: Path, codec: str) -> None:
    src = vector(conformance, codec)
    expected = load_expected(src.parent / "expected.jsonl")
    seen: list[int] = []
    res = convert_backup(str(src), str(tmp_path / "kbs-1"), to="kbs",
                         progress=lambda s: seen.append(s.segments_done))
    assert res.records == len(expected) and seen == list(range(1, len(segment_files(src)) + 1))
    kbs = open_backup(str(tmp_path / "kbs-1"))
    assert kbs.layout == "kbs" and kbs.manifest.compression["algorithm"] == codec
    assert kbs.manifest.source_cluster == {"cluster_id": "conformance", "bootstrap_servers": "localhost:9092"}
    assert table_rows(fsspec_kbs.read_table(str(tmp_path / "kbs-1"))) == expected

    res = convert_backup(str(tmp_path / "kbs-1"), str(tmp_path / "oso-2"), to="oso")
    assert _check_facts(tmp_path / "oso-2", codec) == len(expected)
    assert table_rows(fsspec_kbs.read_table(str(tmp_path / "oso-2"))) == expected
    m = json.loads((tmp_path / "oso-2" / "manifest.json").read_text())
    orig = json.loads((src / "manifest.json").read_text())
    assert m["created_at"] == orig["created_at"] and m["source_brokers"] == orig["source_brokers"]


@pytest.mark.conformance
@pytest.mark.parametrize("codec", CODECS)
def test_oso_to_oso_reproduces_the_vector(conformance: Path, tmp_path: Path, codec: str) -> None:
    """With the tool's segment boundaries the writer reproduces the vector's manifest and, for
    none and zstd, every segment byte for byte (lz4 block encoders may legitimately differ)."""
    src = vector(conformance, codec)
    out = tmp_path / "oso-backup-1"
    convert_backup(str(src), str(out), to="oso", segment_max_records=300)
    mine, theirs = json.loads((out / "manifest.json").read_text()), json.loads((src / "manifest.json").read_text())
    if codec == "lz4":
        for m in (mine, theirs):
            for t in m["topics"]:
                for p in t["partitions"]:
                    for s in p["segments"]:
                        s.pop("compressed_size")
    assert mine == theirs
    if codec != "lz4":
        for f in segment_files(src):
            assert (out / f.relative_to(src)).read_bytes() == f.read_bytes()


@st.composite
def _partition_records(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    start = draw(st.integers(0, 2**40))
    offs = []
    o = start
    for g in gaps:
        offs.append(o)
        o += g
    blob = st.one_of(st.none(), st.binary(max_size=40))
    headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=12))), max_size=3)
    return [{"offset": off, "timestamp": draw(st.integers(-2**40, 2**42)), "key": draw(blob),
             "value": draw(blob), "headers": draw(headers)} for off in offs]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.dictionaries(st.tuples(st.sampled_from(["a", "b.c", "d_e-1"]), st.integers(0, 3)),
                             _partition_records(), min_size=1, max_size=3),
       codec=st.sampled_from(CODECS), seg_records=st.one_of(st.none(), st.integers(1, 15)))
def test_roundtrip_kbs_oso_kbs(parts: dict, codec: str, seg_records: int | None) -> None:
    root = f"memory://oso-rt-{uuid.uuid4().hex}"
    with BackupWriter(f"{root}/src", compression=codec, segment_max_records=7) as w:
        for (topic, p), recs in sorted(parts.items()):
            w.write_columns(topic, p, RecordColumns.from_records(recs))
    convert_backup(f"{root}/src", f"{root}/mid", to="oso", segment_max_records=seg_records)
    assert open_backup(f"{root}/mid").layout == "oso"
    convert_backup(f"{root}/mid", f"{root}/back", to="kbs")
    original = table_rows(fsspec_kbs.read_table(f"{root}/src"))
    assert table_rows(fsspec_kbs.read_table(f"{root}/mid")) == original
    assert table_rows(fsspec_kbs.read_table(f"{root}/back")) == original
    want = sorted(({"topic": t, "partition": p, **r, "headers": [tuple(h) for h in r["headers"]]}
                   for (t, p), recs in parts.items() for r in recs),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))
    assert original == want
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_null_header_values_kept_as_minus_one(tmp_path: Path) -> None:
    cols = RecordColumns.from_records([{"offset": 0, "timestamp": 1, "key": None, "value": b"v",
                                        "headers": [("n", None), ("e", b"")]}])
    with BackupWriter(str(tmp_path / "src"), compression="none") as w:
        w.write_columns("t", 0, cols)
    convert_backup(str(tmp_path / "src"), str(tmp_path / "o"), to="oso")
    seg = next((tmp_path / "o").rglob("segment-*.bin"))
    raw = seg.read_bytes()[32:-8]
    # ... u16 header count, u16 1 "n" i32 -1, u16 1 "e" i32 0
    assert raw.endswith(b"\x02\x00\x01\x00n\xff\xff\xff\xff\x01\x00e\x00\x00\x00\x00")
    rows = table_rows(fsspec_kbs.read_table(str(tmp_path / "o")))
    assert rows[0]["headers"] == [("n", None), ("e", b"")]


@pytest.mark.conformance
def test_refuses_existing_destination_and_overwrites(conformance: Path, tmp_path: Path) -> None:
    src = str(vector(conformance, "lz4"))
    for to in ("oso", "kbs"):
        convert_backup(src, str(tmp_path / to), to=to)
        with pytest.raises(CommitConflictError):
            convert_backup(src, str(tmp_path / to), to=to)
    res = convert_backup(src, str(tmp_path / "oso"), to="oso", overwrite=True, compression="zstd")
    assert res.records == 815 and _check_facts(tmp_path / "oso", "zstd") == 815
    assert convert_backup(src, str(tmp_path / "kbs"), to="kbs", overwrite=True).records == 815


@pytest.mark.conformance
def test_defective_source_publishes_nothing(conformance: Path, tmp_path: Path) -> None:
    src = copy_vector(conformance, "zstd", tmp_path / "src")
    seg = segment_files(src)[-1]
    data = bytearray(seg.read_bytes())
    data[40] ^= 1
    seg.write_bytes(bytes(data))
    for to in ("kbs", "oso"):
        with pytest.raises(SegmentFormatError):
            convert_backup(str(src), str(tmp_path / f"out-{to}"), to=to)
        assert not (tmp_path / f"out-{to}" / "manifest.json").exists()
        assert not list((tmp_path / f"out-{to}").rglob("segment-*"))


@pytest.mark.conformance
def test_cli_convert(conformance: Path, tmp_path: Path) -> None:
    src = vector(conformance, "zstd")
    runner = CliRunner()
    res = runner.invoke(cli, ["convert", str(src), str(tmp_path / "k1"), "--to", "kbs", "--compression", "lz4"])
    assert res.exit_code == 0, res.output
    assert "815 records" in res.stdout
    res = runner.invoke(cli, ["convert", str(tmp_path / "k1"), str(tmp_path / "o1"), "--to", "oso",
                              "--segment-max-records", "100"])
    assert res.exit_code == 0, res.output
    assert _check_facts(tmp_path / "o1", "lz4") == 815
    res = runner.invoke(cli, ["convert", str(tmp_path / "k1"), str(tmp_path / "o1"), "--to", "oso"])
    assert res.exit_code == 2 and "already exists" in res.output
    res = runner.invoke(cli, ["cat", str(tmp_path / "o1")])
    assert [json.loads(x) for x in res.stdout.splitlines()] == \
        [json.loads(x) for x in (src.parent / "expected.jsonl").read_text().splitlines()]


def test_progress_type() -> None:
    p = ConvertProgress(segments_total=3)
    assert p.segments_done == 0 and p.records == 0


@pytest.mark.s3
@pytest.mark.conformance
def test_convert_to_and_from_s3(conformance: Path, tmp_path: Path, s3_root: str, s3_storage_options: dict) -> None:
    src = vector(conformance, "zstd")
    expected = load_expected(src.parent / "expected.jsonl")
    convert_backup(str(src), f"{s3_root}/oso-1", to="oso", dst_storage_options=s3_storage_options,
                   segment_max_records=250)
    assert open_backup(f"{s3_root}/oso-1", s3_storage_options).layout == "oso"
    assert table_rows(fsspec_kbs.read_table(f"{s3_root}/oso-1", storage_options=s3_storage_options)) == expected
    fs = fsspec.filesystem("s3", **s3_storage_options)
    m = json.loads(fs.cat(f"{s3_root}/oso-1/manifest.json"))
    # keys are relative to the root (the S3 prefix is not part of them)
    assert all(s["key"].startswith("oso-1/topics/") for t in m["topics"] for p in t["partitions"] for s in p["segments"])
    convert_backup(f"{s3_root}/oso-1", str(tmp_path / "kbs-1"), to="kbs", storage_options=s3_storage_options)
    assert table_rows(fsspec_kbs.read_table(str(tmp_path / "kbs-1"))) == expected
