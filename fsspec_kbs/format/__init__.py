"""Pure KBS format code: bytes <-> records. No I/O, no fsspec (pyarrow only for its memory pools and codecs)."""

from fsspec_kbs.format.codecs import CODEC_BY_NAME, CODEC_NAMES, Codec, compress, decompress
from fsspec_kbs.format.columns import RecordColumns, ViewColumns
from fsspec_kbs.format.records import (
    EncodedBatch,
    Payload,
    decode_payloads,
    encode_batches,
    plan_encode,
)
from fsspec_kbs.format.segment import (
    BATCH_HEADER_SIZE,
    FOOTER_SIZE,
    HEADER_SIZE,
    MAX_BATCH_UNCOMPRESSED,
    BatchInfo,
    CompressedBatch,
    SegmentFooter,
    SegmentHeader,
    SegmentReader,
    SegmentStats,
    assemble_segment,
    compress_batch,
    encode_segment,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "CODEC_BY_NAME",
    "CODEC_NAMES",
    "FOOTER_SIZE",
    "HEADER_SIZE",
    "MAX_BATCH_UNCOMPRESSED",
    "BatchInfo",
    "CompressedBatch",
    "EncodedBatch",
    "Payload",
    "Codec",
    "RecordColumns",
    "SegmentFooter",
    "SegmentHeader",
    "SegmentReader",
    "SegmentStats",
    "ViewColumns",
    "assemble_segment",
    "compress",
    "compress_batch",
    "decode_payloads",
    "encode_batches",
    "decompress",
    "encode_segment",
    "plan_encode",
]
