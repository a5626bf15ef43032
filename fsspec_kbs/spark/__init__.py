"""PySpark data source ``kbs`` (needs the ``spark`` extra: ``pip install 'fsspec-kbs[spark]'``).

>>> from fsspec_kbs.spark import register  # doctest: +SKIP
>>> register(spark)  # doctest: +SKIP
>>> spark.read.format("kbs").load("s3://bucket/backups/backup-1")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fsspec_kbs.spark needs PySpark >= 4.1: pip install 'fsspec-kbs[spark]'") from e

from fsspec_kbs.spark.options import KbsOptions, parse_options
from fsspec_kbs.spark.reader import (
    BackupChangedError,
    KbsPushdownReader,
    KbsReader,
    KbsSegmentPartition,
)
from fsspec_kbs.spark.source import (
    PUSHDOWN_CONF,
    KbsDataSource,
    KbsPushdownDataSource,
    spark_schema,
)
from fsspec_kbs.spark.writer import KbsCommitMessage, KbsWriter

__all__ = [
    "PUSHDOWN_CONF",
    "BackupChangedError",
    "KbsCommitMessage",
    "KbsDataSource",
    "KbsOptions",
    "KbsPushdownDataSource",
    "KbsPushdownReader",
    "KbsReader",
    "KbsSegmentPartition",
    "KbsWriter",
    "parse_options",
    "register",
    "spark_schema",
]


def register(spark: Any) -> type[KbsDataSource]:
    """Register the ``kbs`` format on ``spark``; returns the class registered.

    With ``spark.sql.python.filterPushdown.enabled`` true (PySpark >= 4.1) the reader takes
    Spark's filters on topic, partition, offset and timestamp and prunes segments; otherwise
    the plain source is registered, since Spark rejects a reader with ``pushFilters`` while
    the setting is off. Re-run after changing the setting.
    """
    enabled = str(spark.conf.get(PUSHDOWN_CONF, "false")).strip().lower() == "true"
    cls = KbsPushdownDataSource if enabled else KbsDataSource
    spark.dataSource.register(cls)
    return cls
