"""Child process of test_crash_commits: one commit that SIGKILLs itself at a named step.

Usage: python -m tests.store.crash_child URL STORAGE_OPTIONS_JSON SCENARIO STEP
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid

from fsspec_kbs.store import BackupWriter
from fsspec_kbs.store.staging import SegmentAdopter
from tests.store.helpers import cols


def main(url: str, so: dict, scenario: str, step: str) -> None:
    def fault(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    if scenario == "overwrite":
        w = BackupWriter(url, so, mode="overwrite", segment_max_records=4, fault=fault)
        w.write_columns("t", 0, cols(list(range(6)), "new"))
        w.write_columns("u", 1, cols(list(range(9)), "new"))
        w.commit()
    elif scenario == "append":
        w = BackupWriter(url, so, mode="append", segment_max_records=4, fault=fault)
        w.write_columns("t", 0, cols(list(range(100, 110)), "new"))
        w.commit()
    elif scenario == "adopt":  # the Spark driver's commit: tasks staged under _staging/<job>/<task>/
        job = uuid.uuid4().hex
        staged = []
        for task, offsets in enumerate([range(100, 105), range(105, 111)]):
            t = BackupWriter(f"{url}/_staging/{job}/task{task}", so, stage_only=True, segment_max_records=3)
            t.write_columns("t", 0, cols(list(offsets), "new"))
            t.flush()
            staged += t.written_segments
        a = SegmentAdopter(url, so, mode="append", txn_id=job, fault=fault)
        for seg in staged:
            a.adopt_segment(seg.topic, seg.partition, seg.path, seg.stats)
        a.commit()
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4])
