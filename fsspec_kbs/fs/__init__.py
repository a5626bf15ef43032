"""``kbs://``: one backup as a read-only fsspec filesystem.

``filesystem.py`` holds :class:`KbsFileSystem` (the tree, listing, reading); ``views.py`` the
decoded views of a partition (``records.jsonl``, ``records.parquet``) and their file object.
The entry point ``fsspec.specs: kbs = "fsspec_kbs.fs:KbsFileSystem"`` names this package.
"""

from __future__ import annotations

from fsspec_kbs.fs.filesystem import KbsFileSystem

# The public path (the entry point, pickles, reprs): ``fsspec_kbs.fs.KbsFileSystem``.
KbsFileSystem.__module__ = __name__

__all__ = ["KbsFileSystem"]
