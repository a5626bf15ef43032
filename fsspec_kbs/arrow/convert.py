"""RecordColumns <-> Arrow record batches, without copying the data buffers where Arrow allows."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fsspec_kbs.arrow.schema import HEADER_TYPE, KAFKA_SCHEMA, VIEW_HEADER_TYPE, project
from fsspec_kbs.errors import RecordFormatError
from fsspec_kbs.format import RecordColumns, ViewColumns


def arrow_buffer(a: np.ndarray) -> pa.Buffer:
    """``a`` as an Arrow buffer, without copying.

    An array that is a whole buffer of Arrow's pool (``empty_array``) is given as that buffer:
    the batch then frees it in C++, where a wrapped numpy array has to be released under the
    GIL by whichever thread drops the batch (the consumer's loop went from ~8 % to ~6 % of the
    GIL time of a threaded scan; the scan's speed did not measurably change).
    """
    base = a.base
    if isinstance(base, pa.Buffer) and a.nbytes == base.size:
        return base
    return pa.py_buffer(a)


def numpy_array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A fixed-width numpy array as Arrow, sharing its memory.

    ``pa.array(ndarray)`` would do, but it imports pandas on first use when pandas is
    installed (~35 MB of RSS per reading process) even when nothing else needs it.
    """
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(typ, len(values), [None, arrow_buffer(values)])


def bool_mask(mask: np.ndarray) -> pa.Array:
    """A numpy bool mask as an Arrow boolean array (for ``filter``), without importing pandas."""
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(np.packbits(mask, bitorder="little"))])


def _validity(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    nulls = len(valid) - int(np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _varlen(typ: pa.DataType, offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    n = len(offsets) - 1
    validity, nulls = (None, 0) if valid is None else _validity(valid)
    return pa.Array.from_buffers(typ, n, [validity, arrow_buffer(offsets), arrow_buffer(data)], null_count=nulls)


#: Columns holding one value on every row (topic, partition, timestampType), by (type, value):
#: each batch gets a zero-copy slice. Building them for every decoded chunk held the GIL for
#: ~50 µs a chunk, a few % of a threaded scan. Bounded: cleared when it holds too many.
_CONSTANTS: dict[tuple[pa.DataType, str | int], pa.Array] = {}
_MAX_CONSTANTS = 256


def _constant(typ: pa.DataType, value: str | int, n: int) -> pa.Array:
    """``n`` rows of ``value`` (a string, or an integer of a fixed-width ``typ``)."""
    arr = _CONSTANTS.get((typ, value))
    if arr is None or len(arr) < n:
        size = max(n, 4096, 2 * len(arr) if arr is not None else 0)
        if isinstance(value, str):
            raw = value.encode("utf-8")
            offsets = np.arange(size + 1, dtype=np.int32) * len(raw)
            arr = pa.Array.from_buffers(typ, size, [None, pa.py_buffer(offsets), pa.py_buffer(raw * size)])
        else:
            arr = numpy_array(np.full(size, value, dtype=typ.to_pandas_dtype()), typ)
        if len(_CONSTANTS) >= _MAX_CONSTANTS:
            _CONSTANTS.clear()
        _CONSTANTS[(typ, value)] = arr  # a race only builds the same array twice
    return arr.slice(0, n)


def _views(typ: pa.DataType, views: np.ndarray, buffers: list[pa.Buffer], valid: np.ndarray | None) -> pa.Array:
    validity, nulls = (None, 0) if valid is None else _validity(valid)
    return pa.Array.from_buffers(typ, len(views) // 16, [validity, arrow_buffer(views), *buffers],
                                 null_count=nulls)


def _data_buffers(cols: RecordColumns | ViewColumns) -> list[pa.Buffer]:
    """The decompressed batches a :class:`ViewColumns`' views point into (none for copies)."""
    return [arrow_buffer(b) for b in cols.buffers] if isinstance(cols, ViewColumns) else []


def _header_parts(cols: RecordColumns | ViewColumns, bufs: list[pa.Buffer]) -> tuple[pa.Array, pa.Array, pa.DataType]:
    if isinstance(cols, ViewColumns):
        return (_views(pa.string_view(), cols.header_key_views, bufs, None),
                _views(pa.binary_view(), cols.header_value_views, bufs, cols.header_value_valid),
                VIEW_HEADER_TYPE)
    return (_varlen(pa.string(), cols.header_key_offsets, cols.header_key_data, None),
            _varlen(pa.binary(), cols.header_value_offsets, cols.header_value_data, cols.header_value_valid),
            HEADER_TYPE)


def check_header_keys(cols: RecordColumns | ViewColumns, path: str | None = None,
                      bufs: list[pa.Buffer] | None = None) -> tuple[pa.Array, pa.Array, pa.DataType]:
    """Header keys must be UTF-8 (Kafka's are strings): the check every path that hands
    records on (Arrow, ``validate``, ``convert``) makes. Returns the header parts."""
    keys, values, typ = _header_parts(cols, _data_buffers(cols) if bufs is None else bufs)
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid as e:
        raise RecordFormatError(f"a header key is not valid UTF-8: {e}", path) from e
    return keys, values, typ


def headers_array(cols: RecordColumns | ViewColumns, path: str | None = None,
                  bufs: list[pa.Buffer] | None = None) -> pa.Array:
    """The ``headers`` column; ``bufs``: :func:`_data_buffers` of ``cols`` if already made.

    A record with no header gives a null list item (Spark's Kafka source does the same).
    """
    keys, values, typ = check_header_keys(cols, path, bufs)
    struct = pa.StructArray.from_arrays([keys, values], fields=list(typ))
    # A record without headers is a null list, as in Spark's Kafka source (not an empty one).
    offsets = cols.header_offsets
    validity, nulls = _validity(offsets[1:] != offsets[:-1])
    return pa.Array.from_buffers(pa.list_(typ), len(cols), [validity, arrow_buffer(offsets)],
                                 null_count=nulls, children=[struct])


def _key_value(cols: RecordColumns | ViewColumns, name: str, views: bool, bufs: list[pa.Buffer]) -> pa.Array:
    if isinstance(cols, ViewColumns):
        if name == "key":
            return _views(pa.binary_view(), cols.key_views, bufs, cols.key_valid)
        return _views(pa.binary_view(), cols.value_views, bufs, cols.value_valid)
    if name == "key":
        arr = _varlen(pa.binary(), cols.key_offsets, cols.key_data, cols.key_valid)
    else:
        arr = _varlen(pa.binary(), cols.value_offsets, cols.value_data, cols.value_valid)
    return arr.cast(pa.binary_view()) if views else arr


def columns_to_batch(cols: RecordColumns | ViewColumns, topic: str, partition: int,
                     columns: list[str] | tuple[str, ...] | None = None,
                     path: str | None = None, views: bool = False) -> pa.RecordBatch:
    """Arrow batch (the Kafka schema, or ``columns`` of it) for records of one partition.

    ``views``: the view types of :data:`~fsspec_kbs.arrow.schema.KAFKA_VIEW_SCHEMA` (given
    :class:`ViewColumns`, they point into its batches; given :class:`RecordColumns`, a cast).
    """
    views = views or isinstance(cols, ViewColumns)
    schema = project(columns, views)
    n = len(cols)
    bufs = _data_buffers(cols)  # once: key, value and headers all point into them
    arrays = []
    for name in schema.names:
        if name in ("key", "value"):
            arrays.append(_key_value(cols, name, views, bufs))
        elif name == "topic":
            arrays.append(_constant(pa.string(), topic, n))
        elif name == "partition":
            arrays.append(_constant(pa.int32(), partition, n))
        elif name == "offset":
            arrays.append(numpy_array(cols.offsets, pa.int64()))
        elif name == "timestamp":
            arrays.append(numpy_array(cols.timestamps, KAFKA_SCHEMA.field("timestamp").type))
        elif name == "timestampType":
            arrays.append(_constant(pa.int32(), 0, n))
        else:
            headers = headers_array(cols, path, bufs)
            if views and not isinstance(cols, ViewColumns):
                headers = headers.cast(schema.field("headers").type)
            arrays.append(headers)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- Arrow -> RecordColumns (writing) ------------------------------------------------------------

def _np_valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=np.bool_)
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _binary_parts(arr: pa.Array, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) \
            or pa.types.is_binary_view(arr.type) or pa.types.is_string_view(arr.type) \
            or pa.types.is_fixed_size_binary(arr.type):
        arr = arr.cast(pa.binary())
    elif pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.binary())
    elif not pa.types.is_binary(arr.type):
        raise TypeError(f"column {what!r} must be binary or string, not {arr.type}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1] \
        if bufs[1] is not None else np.zeros(len(arr) + 1, dtype=np.int32)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data, _np_valid(arr)


def _headers_parts(arr: pa.Array | None, n: int) -> tuple[np.ndarray, ...]:
    empty32 = np.zeros(1, dtype=np.int32)
    none8 = np.zeros(0, dtype=np.uint8)
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n + 1, np.int32), empty32, none8, empty32, none8, np.zeros(0, np.bool_)
    if pa.types.is_map(arr.type):
        arr = arr.cast(pa.list_(pa.struct([pa.field("key", arr.type.key_type),
                                           pa.field("value", arr.type.item_type)])))
    if pa.types.is_large_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if not pa.types.is_list(arr.type) or not pa.types.is_struct(arr.type.value_type):
        raise TypeError(f"column 'headers' must be list<struct<key: string, value: binary>>, not {arr.type}")
    if arr.null_count:
        arr = pc.if_else(pc.is_valid(arr), arr, pa.scalar([], arr.type))
    offsets = arr.offsets.to_numpy().astype(np.int32, copy=False)
    struct = arr.values
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    if "key" not in names or "value" not in names:
        raise TypeError("headers structs need fields 'key' and 'value'")
    fields = dict(zip(names, struct.flatten(), strict=True))
    keys = fields["key"]
    if keys.null_count:
        raise ValueError("a header key is null; Kafka header keys are non-null strings")
    if pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.string())  # validates UTF-8
    hk_off, hk_data, _ = _binary_parts(keys, "headers.key")
    hv_off, hv_data, hv_valid = _binary_parts(fields["value"], "headers.value")
    return offsets, hk_off, hk_data, hv_off, hv_data, hv_valid


def batch_to_columns(batch: pa.RecordBatch, offsets: np.ndarray, timestamps: np.ndarray) -> RecordColumns:
    """Records of ``batch`` (one partition's rows) with the given offsets and timestamps."""
    n = batch.num_rows
    names = batch.schema.names
    if "value" not in names:
        raise ValueError("a 'value' column is required (binary or string)")
    k_off, k_data, k_valid = (
        _binary_parts(batch.column("key"), "key") if "key" in names
        else (np.zeros(n + 1, np.int32), np.zeros(0, np.uint8), np.zeros(n, np.bool_))
    )
    v_off, v_data, v_valid = _binary_parts(batch.column("value"), "value")
    h = _headers_parts(batch.column("headers") if "headers" in names else None, n)
    return RecordColumns(
        offsets=offsets, timestamps=timestamps,
        key_offsets=k_off, key_data=k_data, key_valid=k_valid,
        value_offsets=v_off, value_data=v_data, value_valid=v_valid,
        header_offsets=h[0], header_key_offsets=h[1], header_key_data=h[2],
        header_value_offsets=h[3], header_value_data=h[4], header_value_valid=h[5],
    )


def timestamps_of(batch: pa.RecordBatch) -> np.ndarray:
    """Unix-ms timestamps of ``batch`` (now, when it has no timestamp column)."""
    if "timestamp" not in batch.schema.names:
        return np.full(batch.num_rows, int(time.time() * 1000), dtype=np.int64)
    ts = batch.column("timestamp")
    if ts.null_count:
        raise ValueError("column 'timestamp' has nulls; every Kafka record has a timestamp")
    if pa.types.is_timestamp(ts.type):
        ts = ts.cast(pa.timestamp("ms", tz=ts.type.tz), safe=False).cast(pa.int64())
    elif pa.types.is_integer(ts.type):
        ts = ts.cast(pa.int64())
    else:
        raise TypeError(f"column 'timestamp' must be a timestamp or integer (Unix ms), not {ts.type}")
    return ts.to_numpy()


def split_table(data: pa.Table | pa.RecordBatch, topic: str | None = None,
                partition: int | None = None) -> Iterator[tuple[str, int, pa.RecordBatch]]:
    """Split rows by (topic, partition), keeping their order within each partition."""
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    names = table.schema.names
    if "topic" not in names and topic is None:
        raise ValueError("the data has no 'topic' column: pass topic=...")
    for batch in table.to_batches():
        n = batch.num_rows
        if n == 0:
            continue
        tcol = batch.column("topic") if "topic" in names else None
        if tcol is not None and tcol.null_count:
            if topic is None:
                raise ValueError("column 'topic' has nulls and no default topic was given")
            tcol = pc.fill_null(tcol, topic)
        pcol = batch.column("partition") if "partition" in names else None
        if pcol is not None and pcol.null_count:
            pcol = pc.fill_null(pcol, partition or 0)
        tvals = [topic] if tcol is None else pc.unique(tcol).to_pylist()
        pvals = [partition or 0] if pcol is None else pc.unique(pcol).to_pylist()
        if len(tvals) == 1 and len(pvals) == 1:
            yield str(tvals[0]), int(pvals[0]), batch
            continue
        for t in sorted(tvals):
            tmask = None if tcol is None else pc.equal(tcol, t)
            for p in sorted(pvals):
                pmask = None if pcol is None else pc.equal(pcol, p)
                mask = tmask if pmask is None else (pmask if tmask is None else pc.and_(tmask, pmask))
                part = batch.filter(mask)
                if part.num_rows:
                    yield str(t), int(p), part
