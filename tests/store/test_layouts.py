"""The backup layouts are siblings under one base (``store/layout.py``): callers ask the
layout, never test it. What each layout answers for the methods callers use generically."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from fsspec_kbs.maintenance.validate import validate_backup
from fsspec_kbs.store import Backup, BackupWriter, KbsBackup, open_backup
from fsspec_kbs.store.open import LAYOUTS, backup_class
from fsspec_kbs.store.oso_backup import OsoBackup
from tests.oso.helpers import copy_vector, manifest
from tests.store.test_concurrent_commits import cols

STORE = Path(__file__).resolve().parents[2] / "fsspec_kbs" / "store"


def test_layouts_are_siblings() -> None:
    assert issubclass(KbsBackup, Backup) and issubclass(OsoBackup, Backup)
    assert not issubclass(OsoBackup, KbsBackup) and not issubclass(KbsBackup, OsoBackup)
    assert dict(LAYOUTS) == {"kbs": KbsBackup, "oso": OsoBackup}
    assert backup_class("oso") is OsoBackup and backup_class("kbs") is KbsBackup
    with pytest.raises(ValueError, match="unknown backup layout 'parquet'"):
        backup_class("parquet")


def test_no_forced_overrides_left() -> None:
    """The layouts' classes override nothing with another signature or attribute type."""
    for name in ("layout.py", "backup.py", "oso_backup.py", "open.py", "opened.py", "segment_ref.py"):
        text = (STORE / name).read_text()
        assert "ignore[override]" not in text and "ignore[assignment]" not in text, name


def _store_imports() -> dict[str, set[str]]:
    """Each ``store`` module's module-level imports of other ``store`` modules (``if
    TYPE_CHECKING:`` blocks included: a cycle hidden there is still a cycle of ideas)."""
    graph: dict[str, set[str]] = {}
    for path in STORE.glob("*.py"):
        if path.stem == "__init__":
            continue
        deps: set[str] = set()

        def visit(stmts: list[ast.stmt], deps: set[str] = deps) -> None:
            for node in stmts:
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fsspec_kbs.store"):
                    names = ([node.module.split(".")[2]] if node.module.count(".") >= 2
                             else [a.name for a in node.names if (STORE / f"{a.name}.py").exists()])
                    deps.update(names)
                elif isinstance(node, ast.If):
                    visit(node.body)
                    visit(node.orelse)

        visit(ast.parse(path.read_text()).body)
        graph[path.stem] = deps
    return graph


def test_store_modules_import_without_cycles() -> None:
    """E.g. ``opened`` (a segment opened for decoding) sits below both layouts and imports
    ``segment_ref``, not ``backup`` (issue 26: backup.py <-> opened.py)."""
    graph = _store_imports()
    assert "backup" not in graph["opened"] and "segment_ref" in graph["opened"]
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(node):], node]))
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            walk(dep, [*path, node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])


def _kbs(tmp_path: Path) -> str:
    url = str(tmp_path / "backup-1")
    w = BackupWriter(url, segment_max_records=4, source_cluster={"cluster_id": "c1", "bootstrap_servers": "a:9092,b:9092"})
    w.write_columns("t", 0, cols(list(range(10)), "v"))
    w.commit(extra={"kafka": {"partition_counts": {"t": 1}}})
    return url


def test_kbs_answers(tmp_path: Path) -> None:
    b = open_backup(_kbs(tmp_path))
    assert isinstance(b, KbsBackup)
    refs = b.segments()
    origin = b.origin()
    m = b.manifest
    assert m is not None
    assert (origin.created_at, origin.cluster_id, origin.brokers) == (m.created_at, "c1", ["a:9092", "b:9092"])
    assert origin.source_cluster == m.source_cluster and origin.created_at_ms is not None
    assert b.manifest_extra["kafka"] == {"partition_counts": {"t": 1}}
    assert "commit" in b.manifest_extra and "commit" not in b.copy_fields()  # a copy makes its own commits
    assert b.copy_fields()["kafka"] == {"partition_counts": {"t": 1}}
    assert b.gaps() == [] and b.manifest_defects(refs) == []
    assert b.max_uncompressed(refs[0]) is None
    assert all(b.batch_index(r) is not None for r in refs)  # written with 1.2 indexes


def test_oso_answers(conformance: Path, tmp_path: Path) -> None:
    src = copy_vector(conformance, "zstd", tmp_path)
    b = open_backup(str(src))
    assert isinstance(b, OsoBackup)
    m = manifest(src)
    refs = b.segments()
    origin = b.origin()
    assert origin.created_at_ms == m["created_at"] and origin.created_at is not None
    assert origin.brokers == (m.get("source_brokers") or []) and origin.cluster_id == m.get("source_cluster_id")
    assert b.manifest_extra == {}
    assert b.copy_fields()["converted_from"] == {"layout": "oso", "backup_id": m["backup_id"]}
    assert b.batch_index(refs[0]) is None and b.check_time_bounds(refs) == refs
    assert b.manifest_defects(refs) == []
    limit = b.max_uncompressed(refs[0])
    # An executor's backup (no manifest) gets the planner's bounds.
    bare = OsoBackup(b.fs, b.path, None, b.url)
    bare.set_max_uncompressed({refs[0].path: 123})
    assert bare.max_uncompressed(refs[0]) == 123 and limit is not None


def test_deep_validation_of_an_empty_oso_backup(conformance: Path, tmp_path: Path) -> None:
    """No segment: the OSO manifest claims no totals to compare (it used to reach the KBS
    manifest's ``time_range``, which the OSO manifest has not)."""
    src = copy_vector(conformance, "none", tmp_path)
    doc = manifest(src)
    doc["topics"] = []
    (src / "manifest.json").write_text(json.dumps(doc))
    shutil.rmtree(src / "topics")
    report = validate_backup(str(src), deep=True)
    assert report.ok and report.segments_checked == 0
