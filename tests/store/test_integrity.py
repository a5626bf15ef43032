"""Never silently wrong: one regression test per class of defect the integrity issue listed.

Each builds a small backup, damages it the way an adversarial user did, and checks that every
read raises a library error naming the file (or returns exactly what the segments hold), and
that ``validate --deep`` finds the defect.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

import fsspec_kbs
from fsspec_kbs.errors import (
    BackupNotFoundError,
    IncompleteBackupError,
    KbsError,
    ManifestError,
    RecordFormatError,
    SegmentFormatError,
)
from fsspec_kbs.format.checksums import crc64_xz as crc64
from fsspec_kbs.maintenance.validate import validate_backup

N = 120


def _table(n: int = N, partitions: int = 2) -> pa.Table:
    return pa.table({
        "partition": pa.array([i % partitions for i in range(n)], pa.int32()),
        "offset": pa.array([i // partitions for i in range(n)], pa.int64()),
        "timestamp": pa.array([1_700_000_000_000 + 1000 * i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        "key": [f"k{i}".encode() for i in range(n)],
        "value": [b"{\"v\": %d}" % i * 5 for i in range(n)],
    })


@pytest.fixture
def backup(tmp_path: Path) -> Path:
    url = tmp_path / "b1"
    fsspec_kbs.write_table(str(url), _table(), topic="orders", segment_max_records=20, batch_max_bytes=300)
    return url


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def save(path: Path, doc: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(doc))


def edit(path: Path, fn: Callable[[dict], None]) -> None:
    doc = manifest(path)
    fn(doc)
    save(path, doc)


def seg(path: Path, partition: int, seq: int) -> Path:
    return path / "topics" / "orders" / str(partition) / f"segment-{seq:08d}.kbs"


READS: dict[str, Callable[[str], object]] = {
    "read_table": lambda u: fsspec_kbs.read_table(u),
    "offset filter": lambda u: fsspec_kbs.read_table(u, start_offset=25, end_offset=35),
    "time filter": lambda u: fsspec_kbs.read_table(u, start_time=1_700_000_050_000, end_time=1_700_000_060_000),
    "stream views": lambda u: [b for b in fsspec_kbs.open_reader(u, binary_view=True)],
    "count_rows": lambda u: fsspec_kbs.KbsDataset.open(u).count_rows(),
}


def assert_refused(url: Path, match: str | None = None, reads: tuple[str, ...] = tuple(READS)) -> None:
    """Every read path raises a library error; ``validate --deep`` reports the defect."""
    for name in reads:
        with pytest.raises(KbsError, match=match):
            READS[name](str(url))
    report = validate_backup(str(url), deep=True)
    assert not report.ok, f"validate --deep passed {url}"


# -- the manifest says something the segments contradict ----------------------------------------
def test_partition_listed_twice(backup: Path) -> None:
    edit(backup, lambda d: d["topics"][0]["partitions"].append(d["topics"][0]["partitions"][0]))
    assert_refused(backup, "listed twice")


def test_duplicated_topics_key(backup: Path) -> None:
    text = (backup / "manifest.json").read_text()
    (backup / "manifest.json").write_text(text.replace('"topics":', '"topics": [], "topics":', 1))
    assert_refused(backup, "appears twice")


def test_emptied_partitions_list(backup: Path) -> None:
    def empty(d: dict) -> None:
        d["topics"][0]["partitions"] = []
        d["statistics"].update(partitions=0, segments=0, records=0, compressed_bytes=0)
        d["time_range"] = {"earliest_timestamp": None, "latest_timestamp": None}
    edit(backup, empty)
    assert_refused(backup, "does not list it")


def test_segments_count_one_lower_than_files(backup: Path) -> None:
    def drop_last(d: dict) -> None:
        p = d["topics"][0]["partitions"][0]
        last = p["segment_index"].pop()
        p["segments"] -= 1
        p["records"] -= last["records"]
        p["last_offset"] = p["segment_index"][-1]["last_offset"]
        d["statistics"]["segments"] -= 1
        d["statistics"]["records"] -= last["records"]
        d["statistics"]["compressed_bytes"] -= last["size_bytes"]
    edit(backup, drop_last)
    assert_refused(backup, "does not list it")


def _to_v10(d: dict) -> None:
    d["version"] = "1.0"
    for t in d["topics"]:
        for p in t["partitions"]:
            del p["segment_index"]


def test_v10_segments_swapped_between_partitions(backup: Path) -> None:
    edit(backup, _to_v10)
    a, b = seg(backup, 0, 0), seg(backup, 1, 0)
    tmp = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(tmp)
    # Both partitions hold offsets 0…9: only the records' own values tell them apart; the swap
    # of *different* ranges is what a reader can and must catch.
    edit(backup, lambda d: None)
    shutil.copy(seg(backup, 0, 1), seg(backup, 1, 0))  # another partition's file, other offsets
    assert_refused(backup)


def test_v10_segment_replaced_by_another_partitions_file(backup: Path) -> None:
    edit(backup, _to_v10)
    shutil.copy(seg(backup, 1, 2), seg(backup, 0, 0))
    assert_refused(backup)


@pytest.mark.parametrize("field,delta", [("min_timestamp", 30_000), ("max_timestamp", -30_000),
                                         ("first_offset", 3)])
def test_corrupted_segment_index_bound(backup: Path, field: str, delta: int) -> None:
    def lie(d: dict) -> None:
        s = d["topics"][0]["partitions"][0]["segment_index"][2]
        s[field] += delta
    edit(backup, lie)
    for name in READS:
        try:
            out = READS[name](str(backup))
        except KbsError:
            continue
        # A read that did not raise returns exactly what the segments hold.
        if name == "time filter":
            want = [i for i in range(N) if 50 <= i < 60]
            assert isinstance(out, pa.Table) and out.num_rows == len(want), name
        elif name == "offset filter":
            assert isinstance(out, pa.Table) and out.num_rows == 20, name
    assert not validate_backup(str(backup), deep=True).ok


# -- arithmetic that wraps -------------------------------------------------------------------------
def test_timestamp_delta_overflowing_int64(tmp_path: Path) -> None:
    url = tmp_path / "b"
    t = pa.table({"offset": pa.array([0, 1], pa.int64()),
                  "timestamp": pa.array([2**62, -(2**62)], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                  "value": [b"a", b"b"]})
    fsspec_kbs.write_table(str(url), t, topic="t", compression="none")
    f = url / "topics/t/0/segment-00000000.kbs"
    data = bytearray(f.read_bytes())
    # The second record's timestamp delta is -2^63 (10-byte varint): make it +2^63-1 - keep
    # the length, recompute the batch CRC-32 and segment CRC-64 so only the records tell.
    zz_neg = (((-(2**63)) << 1) ^ ((-(2**63)) >> 63)) & (2**64 - 1)
    zz_pos = ((2**63 - 1) << 1) & (2**64 - 1)

    def varint(z: int) -> bytes:
        out = bytearray()
        while z >= 0x80:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
        return bytes(out)
    i = bytes(data).index(varint(zz_neg))
    data[i:i + 10] = varint(zz_pos)
    size = struct.unpack_from("<I", data, 32 + 12)[0]
    struct.pack_into("<I", data, 32 + 20, zlib.crc32(bytes(data[56:56 + size])))
    struct.pack_into("<Q", data, 24, crc64(bytes(data[32:len(data) - 16])))
    f.write_bytes(bytes(data))
    edit(url, lambda d: d["topics"][0]["partitions"][0]["segment_index"][0].update(
        crc64=struct.unpack_from("<Q", data, 24)[0]))
    with pytest.raises(RecordFormatError, match="int64"):
        fsspec_kbs.read_table(str(url))
    assert not validate_backup(str(url), deep=True).ok


# -- non-library crashes ---------------------------------------------------------------------------
def test_deeply_nested_manifest(backup: Path) -> None:
    (backup / "manifest.json").write_text('{"version": "1.1", "x": ' + "[" * 1000 + "]" * 1000 + "}")
    assert_refused(backup, "nested")


def test_5000_digit_integer(backup: Path) -> None:
    edit(backup, lambda d: None)
    text = (backup / "manifest.json").read_text()
    (backup / "manifest.json").write_text(text.replace('"records": ', '"records": ' + "9" * 5000 + "0 * ", 1)
                                          .replace("0 * ", "", 1))
    assert_refused(backup, "digits")


def test_segment_path_is_a_directory(backup: Path) -> None:
    s = seg(backup, 0, 1)
    s.unlink()
    s.mkdir()
    (s / "x").write_bytes(b"x")
    assert_refused(backup, "segment-00000001.kbs")


# -- unbounded work --------------------------------------------------------------------------------
@pytest.mark.parametrize("claim", [4294967298, 10**30])
def test_v10_absurd_segment_count(backup: Path, claim: int) -> None:
    def absurd(d: dict) -> None:
        _to_v10(d)
        d["topics"][0]["partitions"][0]["segments"] = claim
    edit(backup, absurd)
    assert_refused(backup, "segments|digits|integer|records")


def test_batches_declaring_255_mib(backup: Path) -> None:
    f = seg(backup, 0, 0)
    data = bytearray(f.read_bytes())
    struct.pack_into("<I", data, 32 + 16, 255 * 1024 * 1024)  # first batch's uncompressed size
    f.write_bytes(bytes(data))
    with pytest.raises(SegmentFormatError, match="limit"):
        fsspec_kbs.read_table(str(backup))
    assert not validate_backup(str(backup), deep=True).ok


# -- incomplete backups reported complete ----------------------------------------------------------
def test_oso_manifest_listing_part_of_the_files(tmp_path: Path) -> None:
    from fsspec_kbs.maintenance.convert import convert_backup

    src = tmp_path / "kbs"
    fsspec_kbs.write_table(str(src), _table(), topic="orders", segment_max_records=10)
    oso = tmp_path / "oso-1"
    convert_backup(str(src), str(oso), to="oso", segment_max_records=10)
    doc = manifest(oso)
    for t in doc["topics"]:
        for p in t["partitions"]:
            p["segments"] = p["segments"][:1]  # the tool rewrites its manifest as it goes
    save(oso, doc)
    with pytest.raises(IncompleteBackupError, match="not in its manifest"):
        fsspec_kbs.read_table(str(oso))
    assert fsspec_kbs.read_table(str(oso), allow_incomplete=True).num_rows == 2 * 10
    assert [b.complete for b in fsspec_kbs.list_backups(str(tmp_path)) if b.backup_id == "oso-1"] == [False]
    assert not validate_backup(str(oso), deep=True).ok


def test_manifest_field_types_name_the_field(backup: Path) -> None:
    edit(backup, lambda d: d["topics"][0]["partitions"][0].update(records="12"))
    with pytest.raises(ManifestError, match=r"partitions\[0\]\.records"):
        fsspec_kbs.read_table(str(backup))


def test_timestamps_whose_delta_leaves_int64_start_a_new_batch(tmp_path: Path) -> None:
    """Each batch stores its first timestamp whole: extreme but legal timestamps round-trip."""
    ts = [1_700_000_000_000, -(2**63), 2**63 - 1, 5]
    t = pa.table({"offset": pa.array(range(4), pa.int64()),
                  "timestamp": pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                  "value": [b"a", b"b", b"c", b"d"]})
    fsspec_kbs.write_table(str(tmp_path / "b"), t, topic="t")
    back = fsspec_kbs.read_table(str(tmp_path / "b"))
    assert back.column("timestamp").cast(pa.int64()).to_pylist() == ts
    assert validate_backup(str(tmp_path / "b"), deep=True).ok


def test_uncompressed_bytes_statistic_is_checked_by_full_reads(backup: Path) -> None:
    edit(backup, lambda d: d["statistics"].update(uncompressed_bytes=d["statistics"]["uncompressed_bytes"] - 1))
    with pytest.raises(ManifestError, match="uncompressed_bytes"):
        fsspec_kbs.read_table(str(backup))
    assert not validate_backup(str(backup), deep=True).ok


# -- classes the 20,000-case fuzz run found last (docs/testing.md) ----------------------------------
def _bad_header_key_backup(url: str) -> None:
    """One record whose header key is not UTF-8 (checksums valid): Kafka keys are strings."""
    import numpy as np

    from fsspec_kbs.format import RecordColumns
    from fsspec_kbs.store import BackupWriter

    u8, i32 = np.uint8, np.int32
    cols = RecordColumns(
        offsets=np.array([0], np.int64), timestamps=np.array([1_700_000_000_000], np.int64),
        key_offsets=np.array([0, 1], i32), key_data=np.frombuffer(b"k", u8), key_valid=np.array([True]),
        value_offsets=np.array([0, 1], i32), value_data=np.frombuffer(b"v", u8), value_valid=np.array([True]),
        header_offsets=np.array([0, 1], i32), header_key_offsets=np.array([0, 2], i32),
        header_key_data=np.frombuffer(b"\xff\xfe", u8), header_value_offsets=np.array([0, 1], i32),
        header_value_data=np.frombuffer(b"x", u8), header_value_valid=np.array([True]))
    w = BackupWriter(url)
    w.write_columns("t", 0, cols)
    w.commit()


def test_non_utf8_header_key_in_every_view(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fsspec_kbs.cli.main import cli

    url = str(tmp_path / "b")
    _bad_header_key_backup(url)
    with pytest.raises(SegmentFormatError, match="UTF-8"):
        fsspec_kbs.read_table(url)
    fs = fsspec_kbs.fs.KbsFileSystem(fo=url)
    with pytest.raises(SegmentFormatError, match="UTF-8"), fs.open("t/0/records.jsonl") as f:
        f.read()
    assert CliRunner().invoke(cli, ["cat", url]).exit_code == 2
    assert not validate_backup(url, deep=True).ok


def test_kbs_cat_prints_any_int64_timestamp(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fsspec_kbs.cli.main import cli

    ts = [-(2**63), 0, 2**63 - 1]
    t = pa.table({"offset": pa.array(range(3), pa.int64()),
                  "timestamp": pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")), "value": [b"a"] * 3})
    fsspec_kbs.write_table(str(tmp_path / "b"), t, topic="t")
    res = CliRunner().invoke(cli, ["cat", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["timestamp"] for line in res.output.splitlines()] == ts


def test_convert_checks_the_manifest_time_range(backup: Path, tmp_path: Path) -> None:
    from fsspec_kbs.maintenance.convert import convert_backup

    edit(backup, lambda d: d["time_range"].update(latest_timestamp=d["time_range"]["latest_timestamp"] + 1))
    with pytest.raises(ManifestError, match="time_range"):
        convert_backup(str(backup), str(tmp_path / "copy"))
    assert not (tmp_path / "copy" / "manifest.json").exists()


def test_oso_directory_named_like_a_segment(tmp_path: Path) -> None:
    from fsspec_kbs.maintenance.convert import convert_backup

    src = tmp_path / "kbs"
    fsspec_kbs.write_table(str(src), _table(), topic="orders", segment_max_records=10)
    oso = tmp_path / "oso-1"
    convert_backup(str(src), str(oso), to="oso", segment_max_records=10)
    part = next((oso / "topics" / "orders").iterdir())
    (part / "segment-00000000000000099999.bin.zst").mkdir()
    with pytest.raises(BackupNotFoundError, match="is a directory"):
        fsspec_kbs.read_table(str(oso))
