"""The oracle's child process: runs the library's read paths on one backup at a time.

Protocol: one JSON request per stdin line ``{"url", "paths", "params", "tmp"}``; for each path it
writes ``{"start": path}`` then ``{"path": path, ...result}`` to the result fd, then ``{"done": true}``.
Resource limits (address space) are set before importing the library. After a MemoryError it
exits (the parent restarts it for the remaining paths).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import traceback
from typing import Any


def row_key(topic: str, partition: int, offset: int, ts: int, key: Any, value: Any, headers: Any) -> list:
    h = hashlib.sha1(repr((None if key is None else bytes(key), None if value is None else bytes(value),
                           tuple((hk, None if hv is None else bytes(hv)) for hk, hv in headers))).encode())
    return [topic, int(partition), int(offset), int(ts), h.hexdigest()[:12]]


def table_rows(tables: list) -> list:
    import pyarrow as pa

    out = []
    for t in tables:
        if t.num_rows == 0:
            continue
        ts = t.column("timestamp").cast(pa.int64()).to_pylist()
        cols = {n: t.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value", "headers")}
        for i in range(t.num_rows):
            hs = [(h["key"], h["value"]) for h in cols["headers"][i] or []]
            out.append(row_key(cols["topic"][i], cols["partition"][i], cols["offset"][i], ts[i], cols["key"][i],
                               cols["value"][i], hs))
    return out


def jsonl_rows(text: str) -> list:
    import base64

    def b(v: Any) -> Any:
        return None if v is None else base64.b64decode(v)

    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        out.append(row_key(d["topic"], d["partition"], d["offset"], d["timestamp"], b(d["key"]), b(d["value"]),
                           [(h[0], b(h[1])) for h in d["headers"]]))
    return out


def run_path(path: str, url: str, params: dict, tmp: str) -> dict:
    import fsspec_kbs  # noqa: F401
    from fsspec_kbs.api import open_reader, read_table
    from fsspec_kbs.dataset import KbsDataset
    from fsspec_kbs.maintenance.validate import validate_backup

    if path == "read_table":
        return {"kind": "rows", "rows": table_rows([read_table(url)])}
    if path == "read_offset":
        return {"kind": "rows", "rows": table_rows([read_table(url, start_offset=params["start_offset"],
                                                               end_offset=params["end_offset"])])}
    if path == "read_time":
        return {"kind": "rows", "rows": table_rows([read_table(url, start_time=params["start_time"],
                                                               end_time=params["end_time"])])}
    if path == "reader_view":
        import pyarrow as pa

        rows = []
        for batch in open_reader(url, binary_view=True, batch_size=97):
            rows += table_rows([pa.Table.from_batches([batch])])
        return {"kind": "rows", "rows": rows}
    if path == "count_rows":
        return {"kind": "count", "n": int(KbsDataset.open(url).count_rows())}
    if path == "validate":
        rep = validate_backup(url, deep=True)
        return {"kind": "validate", "ok": bool(rep.ok),
                "defects": [f"{d.error}: {d.message}"[:300] for d in rep.defects[:5]]}
    if path == "jsonl":
        import fsspec

        fs = fsspec.filesystem("kbs", fo=url)
        rows = []
        for top in fs.ls("", detail=True):
            if top["type"] != "directory":
                continue
            for part in fs.ls(top["name"], detail=True):
                if part["type"] != "directory":
                    continue
                with fs.open(part["name"].rstrip("/") + "/records.jsonl", "rb") as f:
                    rows += jsonl_rows(f.read().decode("utf-8"))
        return {"kind": "rows", "rows": rows}
    if path == "convert":
        from fsspec_kbs.maintenance.convert import convert_backup
        from fsspec_kbs.store import open_backup

        src = open_backup(url)
        to = "kbs" if src.layout == "oso" else "oso"
        dst = os.path.join(tmp, "converted", "oso-backup-1" if to == "oso" else "backup-1")
        convert_backup(url, dst, to=to, overwrite=True, segment_max_records=params.get("convert_records"))
        try:
            rows = table_rows([read_table(dst)])
        except Exception as e:  # the converted backup must read back
            return {"kind": "error", "stage": "readback", **_err(e)}
        return {"kind": "rows", "rows": rows, "stage": "readback"}
    if path in ("cli_cat", "cli_describe"):
        from click.testing import CliRunner

        from fsspec_kbs.cli.main import cli

        res = CliRunner().invoke(cli, ["cat" if path == "cli_cat" else "describe", url])
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception
        if res.exit_code != 0:
            return {"kind": "error", "kbs": True, "etype": f"exit {res.exit_code}", "msg": res.output[-400:],
                    "names_file": True}
        if path == "cli_describe":
            return {"kind": "status"}
        return {"kind": "rows", "rows": jsonl_rows(res.output)}
    raise ValueError(path)


def _err(e: BaseException) -> dict:
    from fsspec_kbs.errors import KbsError

    msg = str(e)
    return {"kind": "error", "kbs": isinstance(e, KbsError), "etype": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__[:4]], "msg": msg[:500],
            "names_file": any(s in msg for s in (".kbs", ".json", ".bin", "/")),
            "tb": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}


def _vmsize_mb() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def main() -> None:
    # The idle child already maps ~1.7-2.1 GiB of address space (malloc arenas of the decode
    # threads, LLVM/numba): the default limit of 4 GiB leaves ~2 GiB for what a read allocates.
    limit = int(os.environ.get("KBS_FUZZ_AS", str(4 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the library prints goes to stderr
    sys.stdout = sys.stderr
    sys.setrecursionlimit(3000)
    import fsspec_kbs  # noqa: F401  (import cost once)

    for line in sys.stdin:
        req = json.loads(line)
        for path in req["paths"]:
            out.write(json.dumps({"start": path}) + "\n")
            died = False
            try:
                res = run_path(path, req["url"], req["params"], req["tmp"])
            except MemoryError as e:
                res = {"kind": "oom", "etype": type(e).__name__, "msg": str(e)[:300]}
                died = True
            except RecursionError as e:
                res = _err(e)
                died = True
            except BaseException as e:  # noqa: BLE001
                res = _err(e)
            res["path"] = path
            res["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            res["vmsize_mb"] = _vmsize_mb()
            out.write(json.dumps(res) + "\n")
            if died:
                os._exit(3)
        out.write(json.dumps({"done": True}) + "\n")


if __name__ == "__main__":
    main()
