"""Orchestration: cases -> mutated backups -> reference -> child read paths -> outcomes."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tests.fuzz import mutate
from tests.fuzz.child import row_key
from tests.fuzz.reference import Reference, decode_backup, filter_records

PATHS = ("read_table", "read_offset", "read_time", "reader_view", "count_rows", "validate", "jsonl",
         "convert", "cli_cat", "cli_describe")
FILTERED = ("read_offset", "read_time")
ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ("ok", "wrong", "crash", "hang", "oom")


# ----------------------------------------------------------------------------------------------
# child server

class Child:
    def __init__(self, timeout: float, mem: int) -> None:
        self.timeout = timeout
        self.mem = mem
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, KBS_FUZZ_AS=str(self.mem), PYTHONPATH=str(ROOT), MALLOC_ARENA_MAX="2")
        self.cases = 0
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.child"], cwd=str(ROOT), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     bufsize=0)
        self.buf = bytearray()

    def kill(self) -> None:
        if self.proc is not None:
            try:  # noqa: SIM105
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def _line(self, deadline: float) -> dict | None:
        """Next JSON line from the child (own buffering: select() does not see a file's buffer)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[:nl + 1]
                return json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return {"eof": True}
                self.buf += chunk

    def run(self, url: str, paths: list[str], params: dict, tmp: str) -> dict[str, dict]:
        results: dict[str, dict] = {}
        todo = list(paths)
        hangs = 0
        first_start = True
        while todo:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
                first_start = True
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"url": url, "paths": todo, "params": params, "tmp": tmp}) + "\n").encode())
            self.proc.stdin.flush()
            current = None
            # the first path of a fresh child also pays the import
            deadline = time.monotonic() + self.timeout + (30 if first_start else 0)
            first_start = False
            while True:
                msg = self._line(deadline)
                if msg is None:
                    path = current or todo[0]
                    results[path] = {"kind": "hang", "path": path, "msg": f"no result after {self.timeout} s"}
                    self.kill()
                    todo = todo[todo.index(path) + 1:]
                    hangs += 1
                    if hangs >= 2:  # each further path would likely cost the timeout too
                        for p in todo:
                            results[p] = {"kind": "skipped", "path": p}
                        todo = []
                    break
                if msg.get("eof"):
                    path = current or todo[0]
                    code = self.proc.wait()
                    kind = "died"
                    results[path] = {"kind": kind, "path": path, "msg": f"child exited with {code}"}
                    self.proc = None
                    todo = todo[todo.index(path) + 1:]
                    break
                if "start" in msg:
                    current = msg["start"]
                    deadline = time.monotonic() + self.timeout
                elif msg.get("done"):
                    todo = []
                    break
                else:
                    results[msg["path"]] = msg
                    self.vmsize = msg.get("vmsize_mb", 0)
                    if msg["kind"] == "oom" or msg.get("etype") == "RecursionError":
                        self.proc.wait()
                        self.proc = None
                        todo = todo[todo.index(msg["path"]) + 1:]
                        break
        # hygiene: a long-lived child that grew (retained arenas after a big case) starts afresh
        self.cases = getattr(self, "cases", 0) + 1
        if self.proc is not None and (getattr(self, "vmsize", 0) * (1 << 20) > 0.7 * self.mem or self.cases >= 150):
            self.kill()
        return results


# ----------------------------------------------------------------------------------------------
# classification

def ref_rows(records: list) -> list:
    return sorted(row_key(*r) for r in records)


def expected_for(path: str, records: list, params: dict) -> list:
    if path == "read_offset":
        return filter_records(records, start_offset=params["start_offset"], end_offset=params["end_offset"])
    if path == "read_time":
        return filter_records(records, start_time=params["start_time"], end_time=params["end_time"])
    return records


def diff_rows(got: list, want: list) -> str:
    g = Counter(map(tuple, got))
    w = Counter(map(tuple, want))
    missing = list((w - g).elements())
    extra = list((g - w).elements())
    parts = []
    if missing:
        parts.append(f"{len(missing)} rows missing (e.g. {[m[:4] for m in sorted(missing)[:3]]})")
    if extra:
        parts.append(f"{len(extra)} rows not in the segments (e.g. {[m[:4] for m in sorted(extra)[:3]]})")
    if not parts:
        parts.append("same rows, different order")
    return "; ".join(parts)


def classify(path: str, res: dict, ref: Reference, params: dict) -> tuple[str, str, str]:
    """(outcome, subkind, detail)."""
    kind = res["kind"]
    if kind == "skipped":
        return "ok", "not run (case hung twice)", ""
    if kind == "hang":
        return "hang", "timeout", res.get("msg", "")
    if kind == "oom":
        return "oom", res.get("etype", "killed"), res.get("msg", "")
    if kind == "died":
        return "crash", "child died", res.get("msg", "")
    if kind == "error":
        if not res.get("kbs"):
            sub = "readback " if res.get("stage") == "readback" else ""
            if res.get("etype") in ("MemoryError", "ArrowMemoryError"):
                return "oom", res["etype"], res.get("msg", "")
            return "crash", sub + res.get("etype", "?"), res.get("msg", "")
        if res.get("stage") == "readback":
            return "wrong", "converted backup unreadable", res.get("msg", "")
        if ref.verdict == "valid" and ref.index_lies and _names_index(res):
            return "ok", "refused a lying index", ""
        if ref.verdict == "valid":
            return "wrong", "refused a valid backup", f"{res.get('etype')}: {res.get('msg', '')}"
        return "ok", "refused", ""
    if kind == "status":
        return "ok", "status", ""
    if kind == "validate":
        if ref.verdict == "invalid" and res["ok"]:
            return "wrong", "validate deep says OK", "; ".join(ref.reasons[:2])
        bad_index = ref.index_damaged + ref.index_lies
        if ref.verdict == "valid" and res["ok"] and bad_index:
            return "wrong", "validate misses a bad index", bad_index[0]
        if ref.verdict == "valid" and not res["ok"] and not bad_index:
            return "wrong", "validate flags a valid backup", "; ".join(res["defects"][:2])
        return "ok", "validate", ""
    # rows or count
    if kind == "count":
        got_n = res["n"]
        if ref.verdict != "invalid":
            return ("ok", "rows", "") if got_n == len(ref.records) else (
                "wrong", "count differs", f"count_rows {got_n}, segments hold {len(ref.records)}")
        truth = len(ref.partial) if not ref.corrupt else None
        if truth is not None and got_n == truth:
            return "wrong", "unflagged contradiction", f"count {got_n} correct but: {ref.reasons[0]}"
        return "wrong", "count of an invalid backup", f"count_rows {got_n}; {ref.reasons[0]}"
    got = sorted(res["rows"])
    if ref.verdict != "invalid":
        want = ref_rows(expected_for(path, ref.records, params))
        if got == want:
            return "ok", "rows", ""
        if ref.index_lies and path in FILTERED:
            return "wrong", "lying index hid batches", f"{diff_rows(got, want)}; {ref.index_lies[0]}"
        return "wrong", "rows differ", diff_rows(got, want)
    partial = ref_rows(expected_for(path, ref.partial, params))
    if path in FILTERED and got == partial and not expected_for(path, ref.salvaged, params):
        return "ok", "pruned", ""
    if path == "read_offset" and got == partial and all(
            _claims_outside(c, params["start_offset"], params["end_offset"]) for c in ref.corrupt):
        # Offset pruning trusts a segment's first and last offset where the manifest, header and
        # footer all agree (docs/format-decisions.md, "What is cross-checked where"): a segment
        # whose batches contradict all three is caught by whole reads and validate, not here.
        return "ok", "pruned by agreeing claims", ""
    if path in FILTERED and ref.intact_batches and _keys(partial) <= _keys(got) and _keys(got) <= _keys(
            ref_rows(expected_for(path, ref.partial + ref.intact_batches, params))):
        # Read through batch indexes: only the selected batches are checked (kbs-format.md §7),
        # and every row returned is in an intact batch of its segment.
        return "ok", "partial read of intact batches", ""
    if got == partial and not ref.corrupt:
        if path in PARTITION_VIEWS and all(_backup_level(r) for r in ref.reasons):
            # A one-partition view reads no more than that partition: it cannot see what the
            # backup-wide statistics and time range claim (whole reads and validate must).
            return "ok", "partition view", ""
        return "wrong", "unflagged contradiction", f"rows = segment truth but: {ref.reasons[0]}"
    return "wrong", "rows from an invalid backup", f"{diff_rows(got, partial)}; reference: {ref.reasons[0]}"


def _claims_outside(seg_path: str, start: int | None, end: int | None) -> bool:
    """Whether a KBS segment's header first offset and footer last offset (the claims offset
    pruning checks against the manifest) put it wholly outside [start, end)."""
    try:
        with open(seg_path, "rb") as f:
            head = f.read(32)
            f.seek(-16, os.SEEK_END)
            foot = f.read(16)
    except OSError:
        return False
    if len(head) < 32 or len(foot) < 16 or head[:4] != b"KBS1" or foot[12:] != b"KBSF":
        return False
    first = struct.unpack_from("<Q", head, 8)[0]
    last = struct.unpack_from("<Q", foot, 0)[0]
    return (end is not None and first >= end) or (start is not None and last < start)


def _keys(rows: list) -> set[str]:
    return {json.dumps(r) for r in rows}


def _names_index(res: dict) -> bool:
    """The error is about a batch index (a lying one may be refused, naming it)."""
    return "BatchIndex" in str(res.get("etype")) or "batch index" in str(res.get("msg", ""))


#: Paths that read one partition (or a few records) at a time.
PARTITION_VIEWS = ("jsonl", "cli_cat")


def _backup_level(reason: str) -> bool:
    return "statistics." in reason or "time_range." in reason


# ----------------------------------------------------------------------------------------------
# cases

_CHILD: Child | None = None
_TRUTH: dict[str, list] = {}


def _child(timeout: float, mem: int) -> Child:
    global _CHILD
    if _CHILD is None:
        _CHILD = Child(timeout, mem)
    return _CHILD


def choose_params(records: list, rng: random.Random) -> dict:
    offs = sorted({r[2] for r in records})
    tss = sorted({r[3] for r in records})
    a, b = sorted(rng.sample(offs, 2)) if len(offs) >= 2 else (0, 10)
    t0, t1 = sorted(rng.sample(tss, 2)) if len(tss) >= 2 else (0, 10)
    return {"start_offset": a, "end_offset": b + rng.choice((0, 1)), "start_time": t0,
            "end_time": t1 + rng.choice((0, 1)), "convert_records": rng.choice((None, 30, 77))}


def build_case(i: int, seed: int, bases: list[str], work: Path) -> dict:
    rng = random.Random(f"{seed}-{i}")
    base = Path(rng.choice(bases))
    case_dir = work / f"case-{i}"
    if case_dir.exists():
        shutil.rmtree(case_dir)
    dst = case_dir / "backup" / base.name
    shutil.copytree(base, dst)
    lay = mutate.layout(dst)
    key = str(base)
    if key not in _TRUTH:
        _TRUTH[key] = decode_backup(str(base)).records
    params = choose_params(_TRUTH[key], rng)
    muts = []
    n = 1 if rng.random() < 0.8 else 2
    if rng.random() < 0.03:
        n = 0  # an unmutated control case
    tries = 0
    while len(muts) < n and tries < 20:
        tries += 1
        name = mutate.choose(lay, rng)
        try:
            desc = mutate.apply(name, dst, rng)
        except mutate.Skip:
            continue
        except (ValueError, IndexError, KeyError, TypeError, AttributeError, struct.error, OSError,
                RecursionError):
            # the mutator did not fit this backup (an earlier mutation emptied a list, or nested
            # the manifest too deep for json to parse again)
            continue
        muts.append({"mutator": name, **desc})
    return {"case": i, "seed": seed, "base": str(base.relative_to(base.parents[1])), "layout": lay,
            "mutations": muts, "params": params, "dir": str(dst), "case_dir": str(case_dir)}


def run_case(case: dict, paths: list[str], timeout: float, mem: int) -> dict:
    t = time.monotonic()
    ref = decode_backup(case["dir"])
    case["reference"] = ref.to_json()
    tmp = Path(case["case_dir"]) / "tmp"
    tmp.mkdir(exist_ok=True)
    results = _child(timeout, mem).run(case["dir"], paths, case["params"], str(tmp))
    outcomes = {}
    for p in paths:
        res = results.get(p) or {"kind": "died", "msg": "no result"}
        o, sub, detail = classify(p, res, ref, case["params"])
        outcomes[p] = {"outcome": o, "sub": sub, "detail": detail[:600], "etype": res.get("etype"),
                       "msg": (res.get("msg") or "")[:600], "tb": res.get("tb", ""),
                       "names_file": res.get("names_file"), "maxrss_mb": res.get("maxrss_mb")}
    case["outcomes"] = outcomes
    case["seconds"] = round(time.monotonic() - t, 2)
    return case


def worker(i: int, seed: int, bases: list[str], work: str, out: str | None, paths: list[str], timeout: float,
           mem: int) -> dict:
    try:
        case = build_case(i, seed, bases, Path(work))
    except Exception as e:  # never let one case stop the run
        import traceback
        return {"case": i, "seed": seed, "base": "?", "mutations": [], "outcomes": {}, "reference": {},
                "harness_error": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]}
    try:
        case = run_case(case, paths, timeout, mem)
    except Exception as e:  # a bug of the harness itself
        import traceback
        case["harness_error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
        case["outcomes"] = {}
    bad = case.get("harness_error") or any(v["outcome"] != "ok" for v in case["outcomes"].values())
    if bad and out:
        save_case(case, Path(out))
    shutil.rmtree(case["case_dir"], ignore_errors=True)
    slim = {k: v for k, v in case.items() if k not in ("dir", "case_dir")}
    for v in slim.get("outcomes", {}).values():
        v.pop("tb", None)
    return slim


def save_case(case: dict, out: Path) -> None:
    worst = next((o for o in ("hang", "oom", "crash", "wrong") if any(
        v["outcome"] == o for v in case["outcomes"].values())), "harness")
    muts = "+".join(m["mutator"] for m in case["mutations"]) or "none"
    dst = out / "cases" / f"{worst}-{case['seed']}-{case['case']:05d}-{muts}"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(Path(case["dir"]).parent, dst / "backup", symlinks=True)
    desc = {k: v for k, v in case.items() if k not in ("dir", "case_dir")}
    desc["backup_name"] = Path(case["dir"]).name
    (dst / "case.json").write_text(json.dumps(desc, indent=1, default=str))


# ----------------------------------------------------------------------------------------------
# reporting

def _pattern(s: str) -> str:
    s = re.sub(r"/[^\s:'\"]*", "<path>", s or "")
    s = re.sub(r"-?\d+", "N", s)
    return s[:110]


def summarize(cases: list[dict], paths: list[str]) -> dict:
    by_outcome = Counter()
    by_sub = Counter()
    case_worst = Counter()
    by_mut: dict[str, Counter] = defaultdict(Counter)
    classes: dict[tuple, dict] = {}
    for c in cases:
        muts = "+".join(m["mutator"] for m in c["mutations"]) or "none"
        worst = "ok"
        if c.get("harness_error"):
            case_worst["harness-error"] += 1
            continue
        for p, v in c["outcomes"].items():
            o = v["outcome"]
            by_outcome[o] += 1
            by_sub[(o, v["sub"])] += 1
            by_mut[muts][o] += 1
            if OUTCOMES.index(o) > OUTCOMES.index(worst):
                worst = o
            if o == "ok":
                continue
            key = (p, o, v["sub"], v.get("etype") or "", _pattern(v["msg"] if o != "wrong" else v["detail"]), muts)
            if key not in classes:
                classes[key] = {"path": p, "outcome": o, "sub": v["sub"], "etype": v.get("etype"),
                                "pattern": key[4], "mutator": muts, "count": 0, "example_case": c["case"],
                                "example_mutations": c["mutations"], "example_detail": v["detail"],
                                "example_msg": v["msg"], "reference": c["reference"]}
            classes[key]["count"] += 1
        case_worst[worst] += 1
    return {"cases": len(cases), "path_runs_by_outcome": dict(by_outcome),
            "by_subkind": {f"{o}/{s}": n for (o, s), n in sorted(by_sub.items())},
            "cases_by_worst_outcome": dict(case_worst),
            "by_mutator": {m: dict(c) for m, c in sorted(by_mut.items())},
            "classes": sorted(classes.values(), key=lambda x: (-OUTCOMES.index(x["outcome"]), -x["count"]))}


def print_summary(s: dict) -> None:
    print(f"\n== {s['cases']} cases ==")
    print("path runs by outcome:", json.dumps(s["path_runs_by_outcome"]))
    print("cases by worst outcome:", json.dumps(s["cases_by_worst_outcome"]))
    print("by subkind:")
    for k, n in s["by_subkind"].items():
        print(f"  {k}: {n}")
    print("by mutator (path runs):")
    for m, c in s["by_mutator"].items():
        print(f"  {m:45s} " + " ".join(f"{o}={c.get(o, 0)}" for o in OUTCOMES))
    print(f"failure classes: {len(s['classes'])}")
    for c in s["classes"][:400]:
        print(f"  [{c['outcome']}/{c['sub']}] {c['path']} x{c['count']} mut={c['mutator']} "
              f"{c['etype'] or ''} :: {c['pattern']}  (case {c['example_case']})")


# ----------------------------------------------------------------------------------------------
# main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="save non-ok cases and summary.json here")
    ap.add_argument("--replay", default=None, help="re-run a saved case directory")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--mem-gb", type=float, default=4.0,
                    help="RLIMIT_AS of the child (the idle child maps ~2 GiB already)")
    ap.add_argument("--bases", default=None, help="cache directory of base backups")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    mem = int(args.mem_gb * (1 << 30))
    if args.replay:
        return replay(Path(args.replay), paths, args.timeout, mem)
    from tests.fuzz.generate import BASES_VERSION, make_bases

    bases_dir = Path(args.bases or os.path.join(tempfile.gettempdir(), f"kbs-fuzz-bases-v{BASES_VERSION}-{os.getuid()}"))
    bases = [str(b) for b in make_bases(bases_dir)]
    work = Path(tempfile.mkdtemp(prefix="kbs-fuzz-"))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    cases = []
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        futs = [ex.submit(worker, i, args.seed, bases, str(work), args.out, paths, args.timeout, mem)
                for i in range(args.start, args.start + args.cases)]
        for n, f in enumerate(as_completed(futs), 1):
            c = f.result()
            cases.append(c)
            if not args.quiet and (n % 50 == 0 or n == len(futs)):
                s = Counter(v["outcome"] for cc in cases for v in cc.get("outcomes", {}).values())
                print(f"[{n}/{len(futs)} {time.monotonic() - t0:.0f}s] {dict(s)}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    cases.sort(key=lambda c: c["case"])
    s = summarize(cases, paths)
    s["seconds"] = round(time.monotonic() - t0, 1)
    if args.out:
        (Path(args.out) / "summary.json").write_text(json.dumps(s, indent=1, default=str))
        (Path(args.out) / "cases.jsonl").write_text("\n".join(json.dumps(c, default=str) for c in cases))
    if not args.quiet:
        print_summary(s)
    bad = sum(n for o, n in s["path_runs_by_outcome"].items() if o != "ok")
    return 1 if bad or s["cases_by_worst_outcome"].get("harness-error") else 0


def replay(d: Path, paths: list[str], timeout: float, mem: int) -> int:
    desc = json.loads((d / "case.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="kbs-fuzz-replay-"))
    shutil.copytree(d / "backup", work / "backup")
    case = {**desc, "dir": str(work / "backup" / desc["backup_name"]), "case_dir": str(work)}
    print("mutations:", json.dumps(desc["mutations"], indent=1, default=str))
    case = run_case(case, paths, timeout, mem)
    print("reference:", json.dumps(case["reference"], indent=1))
    bad = 0
    for p, v in case["outcomes"].items():
        print(f"--- {p}: {v['outcome']} ({v['sub']}) {v['etype'] or ''} {v['detail'] or v['msg']}")
        if v["outcome"] != "ok":
            bad += 1
            if v.get("tb"):
                print(v["tb"])
    if _CHILD is not None:
        _CHILD.kill()
    shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0
