"""Helpers shared by the Spark tests."""

from __future__ import annotations

import pyarrow as pa

from tests.conftest import table_rows


def df_rows(df) -> list[dict]:  # type: ignore[no-untyped-def]
    """Rows of a Kafka-schema DataFrame in the form of ``load_expected`` (sorted)."""
    table = df.toArrow()
    i = table.schema.get_field_index("timestamp")
    table = table.set_column(i, "timestamp", table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")))
    return table_rows(table)


def add_batch_indexes(url: str) -> int:
    """Give every segment of the local backup at ``url`` its batch index (spec §7) and list
    ``index_crc32`` in ``manifest.json`` (version 1.2); returns how many were indexed.

    Test helper until every writer writes indexes itself: the index is built by decoding the
    segment (:func:`~fsspec_kbs.format.batch_index.index_from_segment`).
    """
    import json
    import zlib
    from pathlib import Path

    from fsspec_kbs.format.batch_index import encode_index, index_from_segment
    from fsspec_kbs.format.segment import SegmentReader
    from fsspec_kbs.store.batch_index import index_path

    root = Path(url.removeprefix("file://"))
    manifest = json.loads((root / "manifest.json").read_text())
    n = 0
    for topic in manifest["topics"]:
        for part in topic["partitions"]:
            for entry in part["segment_index"]:
                path = root / "topics" / topic["name"] / str(part["partition"]) / entry["file"]
                idx = encode_index(index_from_segment(SegmentReader(path.read_bytes(), str(path))))
                Path(index_path(str(path))).write_bytes(idx)
                entry["index_crc32"] = zlib.crc32(idx)
                n += 1
    manifest["version"] = "1.2"
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return n
