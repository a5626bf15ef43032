"""Every code block of README.md and docs/*.md runs here, on local directories.

* ``python`` blocks of a file run in order in one namespace, after a prelude that writes a
  demo backup at ``<tmp>/backups/backup-1``; the storage URLs the docs show
  (``s3://bucket/backups/``, ``gs://…``, ``/backups/``, ``/data/backups/``) are rewritten to
  ``<tmp>/backups/``.
* ``bash`` blocks: each ``kbs …`` line runs through the CLI (same rewriting) and must exit 0
  (``validate`` of a good backup included); other lines (pip, scripts) are not run.
* ``toml`` and ``json`` blocks must parse; ``text`` blocks (trees, output) are not code.
* A block right after ``<!-- test: skip REASON -->`` is not run: it needs a live Kafka broker,
  Spark or a real object store (those paths have their own tests, named in REASON).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_SKIP = re.compile(r"<!--\s*test:\s*skip\b(.*?)-->")
_URLS = [(re.compile(r"(s3|gs|gcs|az|abfs)://bucket/backups/"), "{root}/"),
         (re.compile(r"(?<![\w./-])/(data/)?backups/"), "{root}/"),
         (re.compile(r"(?<![\w./-])/backups(?=[\s'\"]|$)"), "{root}"),
         (re.compile(r"(/mnt/dead-broker/kafka-logs|/mnt/kafka-logs|\./kafka-logs)"), "{root}/../kafka-logs"),
         (re.compile(r"(?<![\w./-])\./backups/"), "{root}/")]
T0 = 1_793_491_200_000  # 2026-11-01T00:00:00Z


def blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """(line, language, code, skip reason) of each fenced block."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        prev = next((x for x in reversed(lines[:i]) if x.strip()), "")
        skip = _SKIP.search(prev)
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        out.append((i + 1, m.group(1) or "", "\n".join(lines[i + 1:j]),
                    (skip.group(1).strip() or "skipped") if skip else None))
        i = j + 1
    return out


def rewrite(code: str, root: Path) -> str:
    for pattern, repl in _URLS:
        code = pattern.sub(repl.format(root=root), code)
    return code


def demo_backup(url: str) -> None:
    import fsspec_kbs

    n = 3000
    topics = ["orders" if i % 3 else "user.events-v2" for i in range(n)]
    parts = [i % 2 if t == "orders" else 0 for i, t in enumerate(topics)]
    table = pa.table({
        "topic": topics, "partition": pa.array(parts, pa.int32()),
        "key": [b"k%d" % (i % 50) for i in range(n)],
        "value": [b'{"n": %d}' % i for i in range(n)],
        "timestamp": pa.array([T0 + i * 60_000 for i in range(n)], pa.timestamp("ms", tz="UTC")),
    }).sort_by([("topic", "ascending"), ("partition", "ascending")])
    fsspec_kbs.write_table(url, table, segment_max_records=500)


def demo_kafka_log(log_dir: Path) -> None:
    """A broker's log directory with an ``orders`` partition (docs/kafka-log.md)."""
    from fsspec_kbs.format import kafka_log as kl
    from tests.kafka_log.logbuild import write_segment

    recs = [{"offset": i, "timestamp": T0 + i * 60_000, "key": b"k%d" % (i % 7), "value": b'{"n": %d}' % i,
             "headers": []} for i in range(200)]
    write_segment(log_dir / "orders-0", [kl.encode_kafka_batch(recs[i:i + 50]) for i in range(0, 200, 50)])


@pytest.fixture
def docs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "backups"
    demo_backup(str(root / "backup-1"))
    demo_backup(str(root / "b1"))
    demo_backup(str(root / "orders"))
    demo_kafka_log(tmp_path / "kafka-logs")
    monkeypatch.chdir(tmp_path)
    return root


def _prelude(root: Path) -> dict:
    import fsspec_kbs

    source = [pa.table({"value": [b"a", b"b"]}), pa.table({"value": [b"c"]})]
    return {"opts": {}, "source": source, "fsspec_kbs": fsspec_kbs, "__name__": "__docs__"}


def _run_kbs(line: str) -> None:
    from fsspec_kbs.cli.main import cli

    args = shlex.split(line, comments=True)[1:]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, f"{line}\n{result.output}"


def _cases() -> list:
    out = []
    for name in FILES:
        path = ROOT / name
        if path.exists() and any(lang not in ("", "text", "console") for _, lang, _, _ in blocks(path)):
            out.append(pytest.param(name, id=name))
    return out


@pytest.mark.parametrize("name", _cases())
def test_code_blocks_run(name: str, docs_root: Path) -> None:
    space = _prelude(docs_root)
    ran = 0
    for line, lang, code, skip in blocks(ROOT / name):
        if skip is not None or lang in ("", "text", "console"):
            continue
        where = f"{name}:{line}"
        if lang == "toml":
            pytest.importorskip("tomllib").loads(code)  # Python >= 3.11
        elif lang == "json":
            json.loads(code)
        elif lang == "python":
            try:
                exec(compile(rewrite(code, docs_root), where, "exec"), space)
            except Exception as e:
                raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e
        elif lang in ("bash", "sh", "shell"):
            for cmd in code.splitlines():
                cmd = cmd.strip()
                if cmd.startswith("kbs "):
                    _run_kbs(rewrite(cmd, docs_root))
        else:
            raise AssertionError(f"{where}: no runner for ```{lang} blocks (use text, or mark it skipped)")
        ran += 1
    assert ran, f"{name}: no block ran"


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    for name in FILES:
        for line, lang, _code, skip in blocks(ROOT / name):
            assert lang, f"{name}:{line}: a fenced block without a language (use ```text for output and trees)"
            assert skip != "skipped", f"{name}:{line}: say why the block is skipped"
