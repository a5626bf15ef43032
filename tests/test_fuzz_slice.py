"""A bounded, seeded slice of the adversarial fuzzer (issue 19): zero wrong/crash/hang/oom.

Every read path (read_table, filtered reads, open_reader with binary_view, count_rows,
validate_backup deep, the kbs:// records.jsonl view, convert + read back, ``kbs cat``/``describe``)
must, on each mutated backup, return exactly the records an independent reference decoder
(tests/fuzz/reference.py) finds in the segment files, or raise a KbsError when the reference
says the backup is invalid. Run more with ``python -m tests.fuzz --cases 2000 --jobs 2 --out DIR``;
replay a saved failure with ``python -m tests.fuzz --replay DIR/cases/<case>``.
"""

from __future__ import annotations

import json

import pytest

from tests.fuzz.runner import main

#: ~2-3 minutes on 2 cores (most mutated backups are refused within milliseconds; a hang costs
#: the 20 s timeout).
CASES = 1000
SEED = 19


@pytest.mark.fuzz
@pytest.mark.timeout(900)
def test_fuzz_slice(tmp_path):
    out = tmp_path / "out"
    code = main(["--cases", str(CASES), "--seed", str(SEED), "--jobs", "2", "--quiet", "--out", str(out),
                 "--bases", str(tmp_path / "bases")])
    summary = json.loads((out / "summary.json").read_text())
    bad = {o: n for o, n in summary["path_runs_by_outcome"].items() if o != "ok"}
    lines = [f"[{c['outcome']}/{c['sub']}] {c['path']} x{c['count']} mutator={c['mutator']} "
             f"{c['etype'] or ''}: {c['pattern']} (replay: {out}/cases/*-{SEED}-{c['example_case']:05d}-*)"
             for c in summary["classes"][:60]]
    assert code == 0 and not bad, f"{bad} over {summary['cases']} cases:\n" + "\n".join(lines)
