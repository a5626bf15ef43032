"""Spark's string options for the ``kbs`` data source, parsed once into a frozen :class:`KbsOptions`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsspec_kbs.filters import ScanFilter, to_millis

#: Offsets in ``startingOffsets``/``endingOffsets`` JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(name: str, text: str | None, default: bool) -> bool:
    if text is None:
        return default
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"option {name!r} must be true or false, got {text!r}")


def _int(name: str, text: str | None, default: int | None, minimum: int | None = None) -> int | None:
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text.strip())
    except ValueError as e:
        raise ValueError(f"option {name!r} must be an integer, got {text!r}") from e
    if minimum is not None and value < minimum:
        raise ValueError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _storage_value(text: str) -> Any:
    """``storage.<key>`` values are strings; read JSON literals (true, 3, {...}) as such."""
    stripped = text.strip()
    if stripped in ("true", "false", "null") or re.fullmatch(r"-?\d+(\.\d+)?", stripped) \
            or stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    return text


def _offsets_json(name: str, text: str | None, *, ending: bool) -> tuple[str | None, dict[str, dict[str, int]]]:
    """``"earliest"``/``"latest"`` or ``{"topic": {"0": 23, "1": -2}}`` as in the Kafka source."""
    if text is None or text.strip() == "":
        return None, {}
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        word = stripped.lower()
        if ending and word == "earliest":
            raise ValueError(f"option {name!r}: 'earliest' is not allowed for an ending offset")
        if not ending and word == "latest":
            raise ValueError(f"option {name!r}: 'latest' is not allowed for a starting offset in a batch read")
        return word, {}
    try:
        doc = json.loads(stripped)
    except ValueError as e:
        raise ValueError(f"option {name!r} must be 'earliest', 'latest' or JSON like "
                         f'{{"topic": {{"0": 23}}}}, got {text!r}') from e
    if not isinstance(doc, dict):
        raise ValueError(f"option {name!r} must be a JSON object of topics, got {text!r}")
    out: dict[str, dict[str, int]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise ValueError(f"option {name!r}: topic {topic!r} must map partitions to offsets")
        for part, off in parts.items():
            if not re.fullmatch(r"0|[1-9]\d*", str(part)) or isinstance(off, bool) or not isinstance(off, int):
                raise ValueError(f"option {name!r}: bad entry {part!r}: {off!r} for topic {topic!r}")
            if off < EARLIEST:
                raise ValueError(f"option {name!r}: offset {off} of {topic}/{part} (use >= 0, -2 earliest, -1 latest)")
            if ending and off == EARLIEST:
                raise ValueError(f"option {name!r}: -2 (earliest) is not allowed as an ending offset ({topic}/{part})")
            if not ending and off == LATEST:
                raise ValueError(f"option {name!r}: -1 (latest) is not allowed as a starting offset "
                                 f"in a batch read ({topic}/{part})")
            out.setdefault(str(topic), {})[str(int(part))] = off
    return None, out


@dataclass(frozen=True)
class KbsOptions:
    """All options of a ``kbs`` read or write, parsed and checked.

    Only str/int/bool/dict/tuple fields, so it pickles to executors. ``storage_options`` is
    left out of ``repr`` because it may hold credentials.
    """

    path: str
    storage_options: dict = field(default_factory=dict, repr=False)
    # -- read
    topics: tuple[str, ...] | None = None
    topic_pattern: str | None = None
    partitions: tuple[int, ...] | None = None
    starting_offsets: dict = field(default_factory=dict)  # {"topic": {"0": 23}}
    ending_offsets: dict = field(default_factory=dict)
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    verify_checksums: bool = True
    on_corrupt: str = "fail"
    include_headers: bool = True
    allow_incomplete: bool = False
    min_partition_bytes: int = 8 * 1024 * 1024
    max_segments_per_partition: int = 64
    # -- write
    topic: str | None = None
    compression: str | None = None  # None: zstd, or the codec of the backup appended to
    level: int | None = None
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_records: int | None = None
    batch_max_bytes: int = 1024 * 1024

    def scan_filter(self) -> ScanFilter:
        """The record bounds the options ask for (topics, partitions, offsets, times)."""
        ranges: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        for topic, parts in self.starting_offsets.items():
            for part, off in parts.items():
                s = None if off == EARLIEST else off
                ranges[(topic, int(part))] = (s, None)
        for topic, parts in self.ending_offsets.items():
            for part, off in parts.items():
                e = None if off == LATEST else off
                s, _ = ranges.get((topic, int(part)), (None, None))
                ranges[(topic, int(part))] = (s, e)
        sf = ScanFilter.make(
            topics=None if self.topics is None else list(self.topics),
            partitions=None if self.partitions is None else list(self.partitions),
            start_time=self.starting_timestamp,
            end_time=self.ending_timestamp,
            topic_pattern=self.topic_pattern,
        )
        return sf.and_(ScanFilter(offset_ranges=ranges)) if ranges else sf


def parse_options(options: Mapping[str, str]) -> KbsOptions:
    """Read Spark's (case-insensitive, string) options into :class:`KbsOptions`.

    Parameters
    ----------
    options : mapping of str to str
        What ``spark.read.format("kbs").option(...)`` passed; ``.load(path)`` arrives as ``path``.

    Raises
    ------
    ValueError
        For a missing path, an unknown ``onCorrupt`` or a malformed value; the message names
        the option (never the value of a storage option).
    """
    opts = {str(k).lower(): v for k, v in options.items()}
    path = opts.get("path")
    if not path:
        raise ValueError("the kbs data source needs a path: .load('<url of the backup directory>')")
    storage: dict[str, Any] = {}
    raw_so = opts.get("storage_options") or opts.get("storageoptions")
    if raw_so:
        try:
            storage = json.loads(raw_so)
        except ValueError:
            # Not chained: the JSON error would quote the text, which may hold credentials.
            raise ValueError("option 'storage_options' must be a JSON object (its value is not shown)") from None
        if not isinstance(storage, dict):
            raise ValueError("option 'storage_options' must be a JSON object (its value is not shown)")
    for key, value in opts.items():
        if key.startswith("storage.") and len(key) > len("storage."):
            storage[key[len("storage."):]] = _storage_value(value)

    topics = None
    topic_pattern = opts.get("topicpattern") or opts.get("subscribepattern")
    raw_topics = opts.get("topics") or opts.get("subscribe")
    if raw_topics:
        topics = tuple(t.strip() for t in raw_topics.split(",") if t.strip())
    if topic_pattern:
        try:
            re.compile(topic_pattern)
        except re.error as e:
            raise ValueError(f"option 'topicPattern' is not a valid regex: {e}") from e
    partitions = None
    raw_parts = opts.get("partitions")
    if raw_parts:
        try:
            partitions = tuple(int(p) for p in raw_parts.split(",") if p.strip())
        except ValueError as e:
            raise ValueError(f"option 'partitions' must be a comma-separated list of ints, got {raw_parts!r}") from e

    start_word, starting = _offsets_json("startingOffsets", opts.get("startingoffsets"), ending=False)
    end_word, ending = _offsets_json("endingOffsets", opts.get("endingoffsets"), ending=True)
    del start_word, end_word  # "earliest"/"latest" are the defaults: no bound

    def _time(name: str) -> int | None:
        raw = opts.get(name.lower())
        if raw is None or raw.strip() == "":
            return None
        try:
            return to_millis(raw)
        except ValueError as e:
            raise ValueError(f"option {name!r}: {e}") from e

    on_corrupt = (opts.get("oncorrupt") or "fail").strip().lower()
    if on_corrupt not in ("fail", "skip"):
        raise ValueError(f"option 'onCorrupt' must be 'fail' or 'skip', got {on_corrupt!r}")
    compression = (opts.get("compression") or "").strip().lower() or None
    if compression not in (None, "zstd", "lz4", "none"):
        raise ValueError(f"option 'compression' must be zstd, lz4 or none, got {compression!r}")

    return KbsOptions(
        path=path,
        storage_options=storage,
        topics=topics,
        topic_pattern=topic_pattern or None,
        partitions=partitions,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp=_time("startingTimestamp"),
        ending_timestamp=_time("endingTimestamp"),
        verify_checksums=_bool("verifyChecksums", opts.get("verifychecksums"), True),
        on_corrupt=on_corrupt,
        include_headers=_bool("includeHeaders", opts.get("includeheaders"), True),
        allow_incomplete=_bool("allowIncomplete", opts.get("allowincomplete"), False),
        min_partition_bytes=_int("minPartitionBytes", opts.get("minpartitionbytes"), 8 * 1024 * 1024, 0),
        max_segments_per_partition=_int("maxSegmentsPerPartition", opts.get("maxsegmentsperpartition"), 64, 1),
        topic=(opts.get("topic") or None),
        compression=compression,
        level=_int("level", opts.get("level"), None),
        segment_max_bytes=_int("segmentMaxBytes", opts.get("segmentmaxbytes"), 64 * 1024 * 1024, 1),
        segment_max_records=_int("segmentMaxRecords", opts.get("segmentmaxrecords"), None, 1),
        batch_max_bytes=_int("batchMaxBytes", opts.get("batchmaxbytes"), 1024 * 1024, 1),
    )
