"""Strict JSON for manifests: duplicate keys, huge integers, NaN and deep nesting are errors.

``json.loads`` keeps the last of two equal keys (a duplicated ``"topics"`` silently drops a
topic), parses a 5,000-digit integer into a ``ValueError`` and recurses into a
``RecursionError`` on deep nesting; here each is a :class:`ManifestError` naming the file.
The typed checks of the fields are :mod:`msgspec`'s (see :func:`convert`).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

from fsspec_kbs.errors import ManifestError

#: No manifest field needs more digits (2^64 has 20).
MAX_INT_DIGITS = 20
#: A manifest is at most ~8 levels deep; unknown fields get some room on top.
MAX_DEPTH = 64

T = TypeVar("T")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ManifestError(f"key {key!r} appears twice in one object")
            seen.add(key)
    return out


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ManifestError(f"integer with {len(text)} digits (no manifest field has more than {MAX_INT_DIGITS})")
    return int(text)


def _constant(name: str) -> Any:
    raise ManifestError(f"{name} is not valid JSON")


def _depth(doc: Any) -> int:
    depth, level = 0, [doc]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            break
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
    return depth


def loads(raw: bytes | str, path: str | None) -> Any:
    """Parse manifest JSON strictly; every defect is a :class:`ManifestError` naming ``path``."""
    try:
        doc = json.loads(raw, object_pairs_hook=_pairs, parse_int=_int, parse_constant=_constant)
    except ManifestError as e:
        raise ManifestError(str(e), path) from None
    except RecursionError:
        raise ManifestError(f"JSON nested deeper than {MAX_DEPTH} levels", path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"not valid UTF-8 JSON: {e}", path) from e
    if _depth(doc) > MAX_DEPTH:
        raise ManifestError(f"JSON nested deeper than {MAX_DEPTH} levels", path)
    return doc


def convert(doc: Any, model: type[T], path: str | None) -> T:
    """``doc`` as ``model`` (a :class:`msgspec.Struct`), strictly typed: the error names the field."""
    try:
        return msgspec.convert(doc, model, strict=True)
    except msgspec.ValidationError as e:
        raise ManifestError(str(e).replace("`$", "`manifest"), path) from None
