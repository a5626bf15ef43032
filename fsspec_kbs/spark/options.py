"""Spark's string options for the ``kbs`` data source, parsed once into a frozen :class:`KbsOptions`.

The read options are those of Spark's Kafka source (``KafkaSourceProvider``) that make sense for
a backup, plus kbs's own; the write options are kbs's. An unknown option, a read option on a
write (or the reverse), two options that conflict, or a Kafka client option is an error naming
it, never silently ignored.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fsspec_kbs.filters import ScanFilter, to_millis
from fsspec_kbs.format.codecs import CODEC_BY_NAME

#: Which side of the data source options are parsed for.
Direction = Literal["read", "write"]

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


def offsets_json(name: str, text: str | None, *, ending: bool,
                 stream: bool = False) -> tuple[str | None, dict[str, dict[str, int]]]:
    """``"earliest"``/``"latest"`` or ``{"topic": {"0": 23, "1": -2}}`` as in the Kafka source;
    a stream (``stream``) may also start at ``latest`` (-1)."""
    if text is None or text.strip() == "":
        return None, {}
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        word = stripped.lower()
        if ending and word == "earliest":
            raise ValueError(f"option {name!r}: 'earliest' is not allowed for an ending offset")
        if not ending and not stream and word == "latest":
            raise ValueError(f"option {name!r}: 'latest' is not allowed for a starting offset in a batch read")
        return word, {}
    out = _partition_json(name, stripped, "'earliest', 'latest' or JSON like", "23", "offsets")
    for topic, parts in out.items():
        for part, off in parts.items():
            if off < EARLIEST:
                raise ValueError(f"option {name!r}: offset {off} of {topic}/{part} (use >= 0, -2 earliest, -1 latest)")
            if ending and off == EARLIEST:
                raise ValueError(f"option {name!r}: -2 (earliest) is not allowed as an ending offset ({topic}/{part})")
            if not ending and not stream and off == LATEST:
                raise ValueError(f"option {name!r}: -1 (latest) is not allowed as a starting offset "
                                 f"in a batch read ({topic}/{part})")
    return None, out


#: Options Spark itself puts in the map: ``.load(path)``/``.save(path)`` give ``path``,
#: ``.load([a, b])`` gives ``paths`` (a JSON list). Checked in Spark 4.x with a probe source.
SPARK_OPTIONS = ("path", "paths")

#: Read options, Spark's Kafka source names first (lower case -> the documented spelling).
READ_OPTIONS = {o.lower(): o for o in (
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestampStrategy",
    "includeHeaders", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
    # kbs's own
    "topics", "topicPattern", "partitions", "verifyChecksums", "onCorrupt", "allowIncomplete",
    "minPartitionBytes", "maxPartitionBytes", "maxSegmentsPerPartition",
)}
#: Write options (Spark's Kafka sink has ``topic``; the rest are kbs's).
WRITE_OPTIONS = {o.lower(): o for o in (
    "topic", "compression", "level", "segmentMaxBytes", "segmentMaxRecords", "batchMaxBytes",
)}
#: Both ways: where the backup is and how to reach it.
COMMON_OPTIONS = {o.lower(): o for o in ("storage_options",)}
_STORAGE_PREFIX = "storage."

#: Options of Spark's Kafka source or sink that have no meaning for a backup, with why.
_NO_CONSUMER = ("there is no Kafka consumer: kbs reads a backup from storage, so consumer settings "
                "have no meaning")
_STREAM_ONLY = ("it limits each micro-batch of a streaming query; a batch read of a backup reads the "
                "whole range (Spark's Kafka source ignores it in batch queries too); bound the read "
                "with endingOffsets instead")
REFUSED_OPTIONS = {
    "groupidprefix": ("groupIdPrefix", _NO_CONSUMER),
    "kafkaconsumer.polltimeoutms": ("kafkaConsumer.pollTimeoutMs", _NO_CONSUMER),
    "fetchoffset.numretries": ("fetchOffset.numRetries", _NO_CONSUMER),
    "fetchoffset.retryintervalms": ("fetchOffset.retryIntervalMs", _NO_CONSUMER),
    "maxoffsetspertrigger": ("maxOffsetsPerTrigger", _STREAM_ONLY),
    "minoffsetspertrigger": ("minOffsetsPerTrigger", _STREAM_ONLY),
    "maxtriggerdelay": ("maxTriggerDelay", _STREAM_ONLY),
}

#: At most one of each group may be given (as ``validateGeneralOptions`` insists for the first).
_EXCLUSIVE = (
    ("subscribe", "subscribePattern", "assign", "topics", "topicPattern"),
    ("assign", "partitions"),
    ("startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp"),
    ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"),
)


def check_option_names(options: Mapping[str, str], mode: Direction) -> None:
    """Refuse unknown options, options of the other direction, Kafka client options and
    conflicting ones; ``mode`` is ``"read"`` or ``"write"``.

    Raises
    ------
    ValueError
        Naming the option (and the closest known one for a typo).
    """
    own, other = (READ_OPTIONS, WRITE_OPTIONS) if mode == "read" else (WRITE_OPTIONS, READ_OPTIONS)
    known = {**own, **COMMON_OPTIONS}
    for raw in options:
        key = str(raw).lower()
        if key in known or key in SPARK_OPTIONS or key == "storageoptions":
            continue
        if key.startswith(_STORAGE_PREFIX) and len(key) > len(_STORAGE_PREFIX):
            continue
        if key.startswith("kafka."):
            where = "reads a backup from storage" if mode == "read" else "writes a backup to storage"
            raise ValueError(
                f"option {raw!r} is a Kafka client setting, and the kbs source {where}, not a Kafka "
                "cluster, so it has no meaning here; to reach the storage pass its fsspec options as "
                "storage.<name> or storage_options")
        if key in REFUSED_OPTIONS:
            name, why = REFUSED_OPTIONS[key]
            raise ValueError(f"option {name!r} is not supported by the kbs source: {why}")
        if key in other:
            raise ValueError(f"option {other[key]!r} is a {'write' if mode == 'read' else 'read'} option; "
                             f"it has no meaning for a kbs {mode}")
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        hint = f"; did you mean {known[close[0]]!r}?" if close else ""
        raise ValueError(f"unknown option {raw!r} for a kbs {mode}{hint} (the options are listed in docs/spark.md)")
    if mode != "read":
        return
    given = {str(k).lower() for k, v in options.items() if v is not None and str(v).strip() != ""}
    for group in _EXCLUSIVE:
        both = [name for name in group if name.lower() in given]
        if len(both) > 1:
            raise ValueError(f"options {both[0]!r} and {both[1]!r} cannot be used together: only one of "
                             f"{', '.join(group)} may be given")


def _timestamps_json(name: str, text: str | None) -> dict[str, dict[str, int]]:
    """``{"topic": {"0": 1700000000000}}`` (Unix ms per partition) as in the Kafka source."""
    if text is None or text.strip() == "":
        return {}
    return _partition_json(name, text, "JSON like", "1700000000000", "timestamps",
                           hint=" (a partition number and Unix ms)")


def _partition_json(name: str, text: str, expected: str, example: str, what: str,
                    hint: str = "") -> dict[str, dict[str, int]]:
    """``{"topic": {"0": <int>}}``, the per-partition JSON of the Kafka source's options:
    a partition number and an integer (not a bool) per entry."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"option {name!r} must be {expected} {{\"topic\": {{\"0\": {example}}}}}, got {text!r}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"option {name!r} must be a JSON object of topics, got {text!r}")
    out: dict[str, dict[str, int]] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise ValueError(f"option {name!r}: topic {topic!r} must map partitions to {what}")
        for part, value in parts.items():
            if not re.fullmatch(r"0|[1-9]\d*", str(part)) or isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"option {name!r}: bad entry {part!r}: {value!r} for topic {topic!r}{hint}")
            out.setdefault(str(topic), {})[str(int(part))] = value
    return out


def _assign_json(text: str) -> tuple[tuple[str, int], ...]:
    """``{"topicA": [0, 1], "topicB": [2]}`` as in the Kafka source's ``assign``."""
    if not text.strip().startswith("{"):
        raise ValueError(f"option 'assign' must be JSON like {{\"topicA\": [0, 1]}}, got {text!r}")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"option 'assign' must be JSON like {{\"topicA\": [0, 1]}}, got {text!r}") from e
    pairs: list[tuple[str, int]] = []
    for topic, parts in doc.items():
        if not isinstance(parts, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                  for p in parts):
            raise ValueError(f"option 'assign': topic {topic!r} must map to a list of partition numbers")
        pairs.extend((str(topic), int(p)) for p in parts)
    if not pairs:
        raise ValueError(f"option 'assign' names no partition: {text!r}")
    return tuple(sorted(set(pairs)))


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
    #: ``assign``: the (topic, partition) pairs to read.
    assign: tuple[tuple[str, int], ...] | None = None
    starting_offsets: dict = field(default_factory=dict)  # {"topic": {"0": 23}}
    ending_offsets: dict = field(default_factory=dict)
    #: ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp``: {"topic": {"0": ms}}.
    starting_offsets_by_timestamp: dict = field(default_factory=dict)
    ending_offsets_by_timestamp: dict = field(default_factory=dict)
    #: ``startingTimestamp``/``endingTimestamp``: the same lookup for every partition read.
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    #: No offset at or after a starting timestamp: ``error`` (the Kafka default) or ``latest``.
    by_timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    verify_checksums: bool = True
    on_corrupt: str = "fail"
    include_headers: bool = True
    allow_incomplete: bool = False
    min_partition_bytes: int = 8 * 1024 * 1024
    max_segments_per_partition: int = 64
    max_partition_bytes: int = 32 * 1024 * 1024
    # -- write
    topic: str | None = None
    compression: str | None = None  # None: zstd, or the codec of the backup appended to
    level: int | None = None
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_records: int | None = None
    batch_max_bytes: int = 1024 * 1024

    @property
    def time_lookups(self) -> bool:
        """Whether planning must find offsets by timestamp in the data."""
        return bool(self.starting_offsets_by_timestamp or self.ending_offsets_by_timestamp
                    or self.starting_timestamp is not None or self.ending_timestamp is not None)

    def starting_time(self, topic: str, partition: int) -> int | None:
        """The starting timestamp of a partition: its ``startingOffsetsByTimestamp`` entry
        (None if that option does not name it), else ``startingTimestamp``."""
        if self.starting_offsets_by_timestamp:
            return self.starting_offsets_by_timestamp.get(topic, {}).get(str(partition))
        return self.starting_timestamp

    def ending_time(self, topic: str, partition: int) -> int | None:
        """The ending timestamp of a partition, as :meth:`starting_time`."""
        if self.ending_offsets_by_timestamp:
            return self.ending_offsets_by_timestamp.get(topic, {}).get(str(partition))
        return self.ending_timestamp

    def wants(self, topic: str, partition: int) -> bool:
        """The ``assign`` choice (the other selections are in :meth:`scan_filter`)."""
        return self.assign is None or (topic, partition) in self.assign

    def scan_filter(self) -> ScanFilter:
        """The record bounds the options give without looking at the data: topics,
        partitions, ``assign`` (narrowed to its topics and partitions; :meth:`wants` is exact)
        and the offset JSONs. Timestamp options are offsets found at planning."""
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
        topics = None if self.topics is None else list(self.topics)
        partitions = None if self.partitions is None else list(self.partitions)
        if self.assign is not None:
            topics = sorted({t for t, _ in self.assign})
            partitions = sorted({p for _, p in self.assign})
        sf = ScanFilter.make(topics=topics, partitions=partitions, topic_pattern=self.topic_pattern)
        return sf.and_(ScanFilter(offset_ranges=ranges)) if ranges else sf


def parse_options(options: Mapping[str, str], mode: Direction = "read") -> KbsOptions:
    """Read Spark's (case-insensitive, string) options into :class:`KbsOptions`.

    Parameters
    ----------
    options : mapping of str to str
        What ``spark.read.format("kbs").option(...)`` passed; ``.load(path)`` arrives as ``path``.
    mode : {"read", "write"}, default "read"
        Which option set is allowed (see :func:`check_option_names`).

    Raises
    ------
    ValueError
        For a missing path, an unknown or conflicting option, or a malformed value; the
        message names the option (never the value of a storage option).
    """
    if mode not in ("read", "write"):
        raise ValueError(f"mode must be 'read' or 'write', not {mode!r}")
    check_option_names(options, mode)
    opts = {str(k).lower(): v for k, v in options.items()}
    path, storage = _path(opts, mode), _storage(opts)
    if mode == "write":
        return _write_options(opts, path, storage)
    return _read_options(opts, path, storage)


def _path(opts: dict[str, str], mode: Direction) -> str:
    """The backup's URL: ``path``, or the one entry of ``paths`` (``.load([url])``)."""
    path = opts.get("path")
    if not path and opts.get("paths"):
        try:
            paths = json.loads(opts["paths"])
        except ValueError:
            paths = None
        if not isinstance(paths, list) or len(paths) != 1:
            raise ValueError("the kbs source reads one backup at a time: .load('<url of the backup directory>'); "
                             "union the DataFrames of several backups instead")
        path = str(paths[0])
    if not path:
        raise ValueError(f"the kbs data source needs a path: .{'load' if mode == 'read' else 'save'}"
                         "('<url of the backup directory>')")
    return path


def _storage(opts: dict[str, str]) -> dict[str, Any]:
    """fsspec options: ``storage_options`` (a JSON object), then each ``storage.<key>`` over it.
    Errors never show the value: it may hold credentials."""
    storage: dict[str, Any] = {}
    raw_so = opts.get("storage_options") or opts.get("storageoptions")
    if raw_so:
        try:
            storage = json.loads(raw_so)
        except ValueError:
            # Not chained: the JSON error would quote the text.
            raise ValueError("option 'storage_options' must be a JSON object (its value is not shown)") from None
        if not isinstance(storage, dict):
            raise ValueError("option 'storage_options' must be a JSON object (its value is not shown)")
    for key, value in opts.items():
        if key.startswith(_STORAGE_PREFIX) and len(key) > len(_STORAGE_PREFIX):
            storage[key[len(_STORAGE_PREFIX):]] = _storage_value(value)
    return storage


def _read_options(opts: dict[str, str], path: str, storage: dict[str, Any]) -> KbsOptions:
    # Checked in this order (the first bad option is the one reported), then the flags and sizes.
    topics, topic_pattern = _topics(opts)
    partitions = _partitions(opts.get("partitions"))
    assign = _assign_json(opts["assign"]) if opts.get("assign") is not None else None
    starting, ending = _offset_options(opts)
    starting_ts, ending_ts = _timestamp_options(opts)
    starting_timestamp, ending_timestamp = _time(opts, "startingTimestamp"), _time(opts, "endingTimestamp")
    if starting_timestamp is not None and ending_timestamp is not None and starting_timestamp > ending_timestamp:
        raise ValueError(f"startingTimestamp {starting_timestamp} is above endingTimestamp {ending_timestamp}")
    strategy = _one_of(opts, "startingOffsetsByTimestampStrategy", ("error", "latest"))
    on_corrupt = _one_of(opts, "onCorrupt", ("fail", "skip"))
    return KbsOptions(
        path=path,
        storage_options=storage,
        topics=topics,
        topic_pattern=topic_pattern or None,
        partitions=partitions,
        assign=assign,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_offsets_by_timestamp=starting_ts,
        ending_offsets_by_timestamp=ending_ts,
        starting_timestamp=starting_timestamp,
        ending_timestamp=ending_timestamp,
        by_timestamp_strategy=strategy,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), True),
        min_partitions=_int("minPartitions", opts.get("minpartitions"), None, 1),
        max_records_per_partition=_int("maxRecordsPerPartition", opts.get("maxrecordsperpartition"), None, 1),
        verify_checksums=_bool("verifyChecksums", opts.get("verifychecksums"), True),
        on_corrupt=on_corrupt,
        include_headers=_bool("includeHeaders", opts.get("includeheaders"), True),
        allow_incomplete=_bool("allowIncomplete", opts.get("allowincomplete"), False),
        min_partition_bytes=_int("minPartitionBytes", opts.get("minpartitionbytes"), 8 * 1024 * 1024, 0),
        max_segments_per_partition=_int("maxSegmentsPerPartition", opts.get("maxsegmentsperpartition"), 64, 1),
        max_partition_bytes=_int("maxPartitionBytes", opts.get("maxpartitionbytes"), 32 * 1024 * 1024, 1),
    )


def _topics(opts: dict[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    """``topics``/``subscribe`` (a comma-separated list) and ``topicPattern``/``subscribePattern``."""
    topics = None
    topic_pattern = opts.get("topicpattern") or opts.get("subscribepattern")
    for key, name in (("topics", "topics"), ("subscribe", "subscribe")):
        if opts.get(key) is not None:
            topics = tuple(t.strip() for t in opts[key].split(",") if t.strip())
            if not topics:
                raise ValueError(f"option {name!r} names no topic: {opts[key]!r}")
    if topic_pattern is not None:
        if not topic_pattern.strip():
            raise ValueError("option 'subscribePattern' (topicPattern) is empty")
        try:
            re.compile(topic_pattern)
        except re.error as e:
            raise ValueError(f"option 'topicPattern' is not a valid regex: {e}") from e
    return topics, topic_pattern


def _partitions(text: str | None) -> tuple[int, ...] | None:
    """``partitions``: a comma-separated list of partition numbers."""
    if not text:
        return None
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError as e:
        raise ValueError(f"option 'partitions' must be a comma-separated list of ints, got {text!r}") from e


def _offset_options(opts: dict[str, str]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """``startingOffsets`` and ``endingOffsets`` per partition ("earliest"/"latest" are the
    defaults: no bound), checked as the Kafka source's ``checkOffsetLimitValidity``."""
    _, starting = offsets_json("startingOffsets", opts.get("startingoffsets"), ending=False)
    _, ending = offsets_json("endingOffsets", opts.get("endingoffsets"), ending=True)
    for topic, parts in starting.items():
        for part, s in parts.items():
            e = ending.get(topic, {}).get(part)
            if e is not None and s >= 0 and e >= 0 and s > e:
                raise ValueError(f"startingOffsets {s} of {topic}/{part} is above its endingOffsets {e}")
    return starting, ending


def _timestamp_options(opts: dict[str, str]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """``startingOffsetsByTimestamp`` and ``endingOffsetsByTimestamp``, the start not above the end."""
    starting_ts = _timestamps_json("startingOffsetsByTimestamp", opts.get("startingoffsetsbytimestamp"))
    ending_ts = _timestamps_json("endingOffsetsByTimestamp", opts.get("endingoffsetsbytimestamp"))
    for topic, parts in starting_ts.items():
        for part, s in parts.items():
            e = ending_ts.get(topic, {}).get(part)
            if e is not None and s > e:
                raise ValueError(f"startingOffsetsByTimestamp {s} of {topic}/{part} is above its "
                                 f"endingOffsetsByTimestamp {e}")
    return starting_ts, ending_ts


def _time(opts: dict[str, str], name: str) -> int | None:
    """``startingTimestamp``/``endingTimestamp``: Unix ms or ISO-8601 (:func:`to_millis`)."""
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        return to_millis(raw)
    except ValueError as e:
        raise ValueError(f"option {name!r}: {e}") from e


def _one_of(opts: dict[str, str], name: str, choices: tuple[str, str]) -> str:
    """A word option (case-insensitive); the first choice is the default."""
    value = (opts.get(name.lower()) or choices[0]).strip().lower()
    if value not in choices:
        raise ValueError(f"option {name!r} must be {choices[0]!r} or {choices[1]!r}, got {value!r}")
    return value


def _write_options(opts: dict[str, str], path: str, storage: dict[str, Any]) -> KbsOptions:
    compression = (opts.get("compression") or "").strip().lower() or None
    if compression is not None and compression not in CODEC_BY_NAME:
        raise ValueError(f"option 'compression' must be one of {', '.join(sorted(CODEC_BY_NAME))}, "
                         f"got {compression!r}")
    return KbsOptions(
        path=path,
        storage_options=storage,
        topic=(opts.get("topic") or "").strip() or None,
        compression=compression,
        level=_int("level", opts.get("level"), None),
        segment_max_bytes=_int("segmentMaxBytes", opts.get("segmentmaxbytes"), 64 * 1024 * 1024, 1),
        segment_max_records=_int("segmentMaxRecords", opts.get("segmentmaxrecords"), None, 1),
        batch_max_bytes=_int("batchMaxBytes", opts.get("batchmaxbytes"), 1024 * 1024, 1),
    )
