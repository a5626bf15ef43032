"""Read Apache Kafka's own log directories: as Arrow, or imported into a KBS backup.

See ``docs/kafka-log.md``.
"""

from fsspec_kbs.kafka_log.api import (
    KafkaLogReport,
    KafkaLogScan,
    import_log,
    open_kafka_log_reader,
    read_kafka_log,
)
from fsspec_kbs.kafka_log.log_dir import (
    KafkaLogDir,
    KafkaLogWarning,
    LogPartition,
    LogSegmentFile,
    PartitionStats,
    TailReport,
)

__all__ = [
    "KafkaLogDir",
    "KafkaLogReport",
    "KafkaLogScan",
    "KafkaLogWarning",
    "LogPartition",
    "LogSegmentFile",
    "PartitionStats",
    "TailReport",
    "import_log",
    "open_kafka_log_reader",
    "read_kafka_log",
]
