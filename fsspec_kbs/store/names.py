"""Names in a backup (topics, backup ids, partitions, segment files) and the paths built from them."""

from __future__ import annotations

import re

from fsspec_kbs.errors import InvalidNameError

_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
_SEGMENT = re.compile(r"segment-(\d{8,})\.kbs")
MANIFEST = "manifest.json"
CHECKPOINT = "checkpoints/checkpoint.json"
TOPICS_DIR = "topics"


def _check(kind: str, name: object, max_len: int) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} must be a string, got {type(name).__name__}")
    if not (1 <= len(name) <= max_len) or name in (".", "..") or not _LEGAL.fullmatch(name):
        raise InvalidNameError(
            f"illegal {kind} {name!r}: use 1-{max_len} characters of [A-Za-z0-9._-], not '.' or '..'"
        )
    return name


def check_topic(name: object) -> str:
    """Return ``name`` if it is a legal Kafka topic name, else raise :class:`InvalidNameError`."""
    return _check("topic name", name, 249)


def check_backup_id(name: object) -> str:
    return _check("backup id", name, 255)


def backup_id_of(path: str) -> str:
    """The backup id a backup directory's path ends with, checked."""
    return check_backup_id(path.rstrip("/").rsplit("/", 1)[-1])


def check_partition(value: object) -> int:
    """Partitions are ints 0 … 2^31-1 (a decimal string without sign or leading zeros is accepted)."""
    if isinstance(value, str):
        if not re.fullmatch(r"0|[1-9][0-9]*", value):
            raise InvalidNameError(f"illegal partition directory {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
        raise InvalidNameError(f"illegal partition {value!r}: must be an integer 0 … 2^31-1")
    return value


def segment_name(seq: int) -> str:
    return f"segment-{seq:08d}.kbs"


def parse_segment_name(name: str) -> int:
    m = _SEGMENT.fullmatch(name)
    if not m:
        raise InvalidNameError(f"illegal segment file name {name!r}: expected segment-NNNNNNNN.kbs")
    return int(m.group(1))


def partition_dir(backup: str, topic: str, partition: int) -> str:
    return f"{backup}/{TOPICS_DIR}/{check_topic(topic)}/{check_partition(partition)}"


def join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p != "")


def backup_path(root: str, backup_id: str) -> str:
    """``<root>/<backup-id>`` with the id checked first: the one way to build a backup's path
    from a root and an id (an id such as ``../x`` or ``a/b`` would leave the root)."""
    return join(root, check_backup_id(backup_id))
