"""A backup whose records over time have a shape: a daily cycle, a burst and an outage.

Writes it (default ``/tmp/kbs-activity-demo/backup-1``) and prints the ``kbs describe`` commands
that draw it; ``docs/describe-plot.png`` in the README was made this way::

    python examples/activity_demo.py /tmp/kbs-activity-demo/backup-1
    kbs describe /tmp/kbs-activity-demo/backup-1 --plot docs/describe-plot.png
"""

from __future__ import annotations

import math
import random
import sys

import pyarrow as pa

import fsspec_kbs

T0 = 1_763_942_400_000  # 2025-11-24T00:00:00Z
HOUR = 3_600_000


def activity_table(days: int = 3, seed: int = 5) -> pa.Table:
    """orders/0..2 with a daily cycle; orders/2 is down for 7 hours on day 2; payments/0 bursts."""
    rng = random.Random(seed)
    topics, parts, stamps, values = [], [], [], []
    for minute in range(days * 24 * 60):
        t = T0 + minute * 60_000
        hour = (minute / 60) % 24
        rate = 6 + 5 * math.sin((hour - 9) / 24 * 2 * math.pi)  # busiest mid-afternoon
        for p in range(3):
            if p == 2 and 30 * 60 <= minute < 37 * 60:
                continue  # an outage: no records from orders/2 for 7 hours
            for _ in range(rng.randrange(int(rate) + 1)):
                topics.append("orders")
                parts.append(p)
                stamps.append(t + rng.randrange(60_000))
                values.append(b'{"order": %d}' % len(values))
        if 50 * 60 <= minute < 53 * 60 or rng.random() < 0.3:  # a 3-hour burst of payments
            for _ in range(rng.randrange(20, 40)):
                topics.append("payments")
                parts.append(0)
                stamps.append(t + rng.randrange(60_000))
                values.append(b'{"payment": %d}' % len(values))
    table = pa.table({"topic": topics, "partition": pa.array(parts, pa.int32()), "value": values,
                      "timestamp": pa.array(stamps, pa.timestamp("ms", tz="UTC"))})
    return table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("timestamp", "ascending")])


def main(url: str = "/tmp/kbs-activity-demo/backup-1") -> None:
    fsspec_kbs.write_table(url, activity_table(), mode="overwrite", segment_max_records=4_000)
    print(f"wrote {url}\nkbs describe {url}\nkbs describe {url} --plot describe-plot.png")


if __name__ == "__main__":
    main(*sys.argv[1:])
