"""A backup slowed down by its ``on_chunk`` hook, for tests that kill it part-way.

``python -m tests.kafka.slow_backup BOOTSTRAP TOPIC URL SLEEP SEGMENT_MAX_RECORDS``
"""

from __future__ import annotations

import sys
import time

from fsspec_kbs.kafka import run_backup


def main(bootstrap: str, topic: str, url: str, sleep: str, segment_max_records: str) -> None:
    pause = float(sleep)
    run_backup({"bootstrap.servers": bootstrap}, [topic], url, segment_max_records=int(segment_max_records),
               consume_batch=100, on_chunk=lambda: time.sleep(pause))


if __name__ == "__main__":
    main(*sys.argv[1:])
