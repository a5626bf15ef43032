"""The package's layers import only downwards (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fsspec_kbs"

#: Rank of each top-level module or sub-package; a module may import equal or lower ranks.
RANKS = {
    "errors": 0, "times": 0, "threads": 0, "lazy": 0,
    "format": 1,
    "store": 2,
    "arrow": 3,
    "filters": 4,
    "dataset": 5,
    "api": 6,
    "fs": 7,
    "maintenance": 8, "kafka_log": 8,
    "kafka": 9, "spark": 9,
    "cli": 10,
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "fsspec_kbs" else None


def test_every_module_has_a_layer() -> None:
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p.name != "__init__.py"}
    assert names <= set(RANKS), f"modules without a layer in RANKS: {sorted(names - set(RANKS))}"


def test_imports_go_down() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel == Path("__init__.py"):
            continue  # the package root re-exports the public API lazily
        mine = RANKS[rel.parts[0].removesuffix(".py")]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                       else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for target in targets:
                layer = _layer(target)
                if layer is not None and RANKS.get(layer, -1) > mine:
                    upward.append(f"{rel}:{node.lineno} imports {target}")
    assert not upward, "upward imports:\n" + "\n".join(upward)
