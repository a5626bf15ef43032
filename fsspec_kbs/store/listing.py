"""One listing of a backup's ``topics/`` tree, shared by the KBS and OSO layouts."""

from __future__ import annotations

from typing import Any

import fsspec


def topic_tree_entries(fs: fsspec.AbstractFileSystem, root: str, *,
                       withdirs: bool = False) -> list[tuple[list[str], str, dict[str, Any]]]:
    """``(parts, path, info)`` of every entry exactly three levels below ``root``
    (``topic/partition/file``), in path order; none when ``root`` does not exist.

    ``parts`` are the three names; ``path`` is ``root`` joined with them (the caller's form of
    the root, protocol included, whatever ``find`` returns); ``withdirs`` also yields
    directories, so one named like a segment cannot hide.
    """
    try:
        found = fs.find(root, withdirs=withdirs, detail=True)
    except FileNotFoundError:
        return []
    base = fs._strip_protocol(root).rstrip("/")
    out = []
    for path, info in sorted(found.items()):
        parts = path.rstrip("/")[len(base) + 1:].split("/")
        if len(parts) == 3:
            out.append((parts, f"{root}/{'/'.join(parts)}", info))
    return out
