"""Packages whose public names load on first use (PEP 562).

``import fsspec_kbs`` and ``kbs --help`` stay cheap, and a process that only writes (``kbs
backup``) never loads what only reading needs (pyarrow and the dataset stack, ~30 MB).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each submodule (relative
    to ``package``) to the names it defines; a name is imported when first asked for, then
    kept in ``namespace`` (the package's globals) as a plain attribute. Other names are
    submodules, as with an eager package."""
    home = {name: f"{package}.{module}" for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    return __getattr__, __dir__
