"""``read_runs`` (store/batch_index.py): runs of whole batches of a segment read through its
batch index, as Spark tasks and timestamp lookups read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsspec_kbs.arrow import columns_to_batch
from fsspec_kbs.errors import KbsError
from fsspec_kbs.format import RecordColumns, ViewColumns
from fsspec_kbs.store import KbsBackup
from fsspec_kbs.store.batch_index import read_runs
from fsspec_kbs.store.segment_ref import SegmentRef
from tests.store.test_index_writers import write


def rows(chunks: list[RecordColumns | ViewColumns], ref: SegmentRef) -> list[dict]:
    return [r for cols in chunks
            for r in columns_to_batch(cols, ref.topic, ref.partition, ["offset", "value"], ref.path).to_pylist()]


def test_read_runs_equals_whole_read_and_rediagnoses(tmp_path: Path) -> None:
    url = str(tmp_path / "backup-1")
    write(url, n=3_000)
    backup = KbsBackup.open(url)
    ref = backup.segments()[0]
    index = backup.batch_index(ref)
    assert index is not None and len(index) > 6
    whole = rows(list(backup.iter_columns(ref)), ref)
    runs = [(1, 3), (5, 6)]
    wanted = {o for a, b in runs for o in range(int(index.base[a]), int(index.last[b - 1]) + 1)}
    # A small chunk size: several chunks, the same records.
    chunks = list(read_runs(backup, ref, index, runs, max_chunk_bytes=1))
    assert len(chunks) == 3
    assert rows(chunks, ref) == [r for r in whole if r["offset"] in wanted]

    # A damaged byte in batch 5: the run's read fails naming the segment (re-diagnosed whole).
    pos = (int(index.position[5]) + int(index.end[5])) // 2
    data = bytearray(Path(ref.path).read_bytes())
    data[pos] ^= 0xFF
    Path(ref.path).write_bytes(bytes(data))
    with pytest.raises(KbsError) as err:
        for _ in read_runs(KbsBackup.open(url), ref, index, [(5, 6)]):
            pass
    assert ref.path in str(err.value)
