"""Records over time per partition, for ``kbs describe``: sparklines and ``--plot FILE.png``.

Where the numbers come from, cheapest first:

* ``exact=True``: the ``timestamp`` column of every record (reads and decodes the backup).
* a segment's batch index (KBS 1.2, ``segment-N.index``): per batch, its offset span and its
  min/max timestamps; a batch's records are spread evenly over its time span.
* otherwise the manifest: per segment, its record count and min/max timestamps, spread evenly.
  OSO backups and 1.0 manifests record no timestamps: no picture then (``exact`` still works).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsspec_kbs.store import Backup, SegmentRef

BLOCKS = "▁▂▃▄▅▆▇█"
EMPTY = "·"


@dataclass
class PartitionActivity:
    topic: str
    partition: int
    counts: np.ndarray                       # records per bin
    boundaries: list[int] = field(default_factory=list)   # ms where a segment starts (not the first)
    offset_gaps: list[tuple[int, int]] = field(default_factory=list)  # (after offset, next offset)
    first_ts: int | None = None              # exact only: the partition's earliest / latest timestamp
    last_ts: int | None = None


@dataclass
class Activity:
    start: int            # ms, left edge of the first bin
    end: int              # ms, right edge of the last bin
    bins: int
    source: str           # "records", "batch indexes", "segments", "batch indexes and segments"
    partitions: list[PartitionActivity]

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.start, self.end, self.bins + 1)


def _spread(edges: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per bin, the sum of each unit's ``count`` spread evenly over ``[lo, hi]`` (ms)."""
    out = np.zeros(len(edges) - 1)
    hi = np.maximum(hi, lo + 1).astype(np.float64)
    lo = lo.astype(np.float64)
    for s in range(0, len(lo), 8192):  # units x edges at a time: bounded memory
        a, b, c = lo[s:s + 8192, None], hi[s:s + 8192, None], counts[s:s + 8192, None]
        cum = (c * np.clip((edges[None, :] - a) / (b - a), 0.0, 1.0)).sum(axis=0)
        out += np.diff(cum)
    return out


def _units(backup: Backup, refs: list[SegmentRef]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(counts, min ts, max ts) per batch (index) or per segment; bool: an index was used."""
    counts, lo, hi, indexed = [], [], [], False
    for ref in refs:
        index = None
        if ref.index_crc32 is not None:
            try:
                index = backup.batch_index(ref)
            except Exception:  # a damaged index: describe falls back to the manifest's numbers
                index = None
        if index is not None and len(index):
            counts.append((index.last - index.base + 1).astype(np.float64))
            lo.append(index.min_ts)
            hi.append(index.max_ts)
            indexed = True
        elif ref.min_timestamp is not None and ref.max_timestamp is not None and ref.records:
            counts.append(np.array([float(ref.records)]))
            lo.append(np.array([ref.min_timestamp], dtype=np.int64))
            hi.append(np.array([ref.max_timestamp], dtype=np.int64))
    if not counts:
        return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), False
    return np.concatenate(counts), np.concatenate(lo), np.concatenate(hi), indexed


def _offset_gaps(refs: list[SegmentRef]) -> list[tuple[int, int]]:
    gaps = []
    for a, b in zip(refs, refs[1:], strict=False):
        if a.last_offset is not None and b.first_offset is not None and b.first_offset > a.last_offset + 1:
            gaps.append((a.last_offset, b.first_offset))
    return gaps


def compute(backup: Backup, bins: int, exact: bool = False) -> Activity | None:
    """Records per time bin for each partition, or None when the backup records no timestamps
    (and ``exact`` is False) or holds no record."""
    by_part: dict[tuple[str, int], list[SegmentRef]] = {}
    for ref in backup.segments():
        by_part.setdefault((ref.topic, ref.partition), []).append(ref)
    keys = sorted(by_part)
    if exact:
        return _exact(backup, keys, by_part, bins)
    units = {k: _units(backup, by_part[k]) for k in keys}
    have = [u for u in units.values() if len(u[0])]
    if not have:
        return None
    start = int(min(u[1].min() for u in have))
    end = int(max(u[2].max() for u in have)) + 1
    edges = np.linspace(start, end, bins + 1)
    parts = []
    for k in keys:
        c, lo, hi, _ = units[k]
        counts = _spread(edges, c, lo, hi) if len(c) else np.zeros(bins)
        parts.append(PartitionActivity(k[0], k[1], counts, _boundaries(by_part[k]), _offset_gaps(by_part[k])))
    kinds = {"batch indexes" if u[3] else "segments" for u in have}
    return Activity(start, end, bins, " and ".join(sorted(kinds)), parts)


def _boundaries(refs: list[SegmentRef]) -> list[int]:
    return [r.min_timestamp for r in refs[1:] if r.min_timestamp is not None]


def _exact(backup: Backup, keys: list[tuple[str, int]], by_part: dict[tuple[str, int], list[SegmentRef]],
           bins: int) -> Activity | None:
    from fsspec_kbs.dataset import KbsDataset

    stamps: dict[tuple[str, int], list[np.ndarray]] = {k: [] for k in keys}
    for batch in KbsDataset(backup).to_batches(columns=["topic", "partition", "timestamp"]):
        topic = batch.column(0)[0].as_py()
        part = batch.column(1)[0].as_py()
        stamps[(topic, part)].append(batch.column(2).cast("int64").to_numpy())
    joined = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in stamps.items()}
    have = [v for v in joined.values() if len(v)]
    if not have:
        return None
    start, end = int(min(v.min() for v in have)), int(max(v.max() for v in have)) + 1
    edges = np.linspace(start, end, bins + 1)
    parts = [PartitionActivity(k[0], k[1], np.histogram(joined[k], edges)[0].astype(np.float64),
                               _boundaries(by_part[k]), _offset_gaps(by_part[k]),
                               int(joined[k].min()) if len(joined[k]) else None,
                               int(joined[k].max()) if len(joined[k]) else None) for k in keys]
    return Activity(start, end, bins, "records", parts)


def sparkline(counts: np.ndarray) -> str:
    """One character per bin, scaled to the partition's own busiest bin; ``·`` = no record."""
    top = counts.max() if len(counts) else 0
    if top <= 0:
        return EMPTY * len(counts)
    chars = []
    for c in counts:
        if c < 0.5:  # less than one record: nothing there
            chars.append(EMPTY)
        else:
            chars.append(BLOCKS[min(len(BLOCKS) - 1, int(c / top * (len(BLOCKS) - 1) + 0.5))])
    return "".join(chars)


def gap_spans(counts: np.ndarray, min_bins: int = 2) -> list[tuple[int, int]]:
    """(first, stop) runs of at least ``min_bins`` bins without records, strictly inside the
    partition's data (a single empty bin is usually a quiet spell, not an outage)."""
    nz = np.flatnonzero(counts >= 0.5)
    if len(nz) < 2:
        return []
    inside = counts[nz[0]:nz[-1] + 1] < 0.5
    edges = np.flatnonzero(np.diff(np.concatenate(([False], inside, [False])).astype(np.int8)))
    return [(int(nz[0] + a), int(nz[0] + b)) for a, b in zip(edges[::2], edges[1::2], strict=True)
            if b - a >= min_bins]


def plot(activity: Activity, path: str, title: str, max_partitions: int = 32) -> int:
    """Write a PNG: one row per partition, records per bin, gaps shaded, segment boundaries
    dotted. Returns the number of partitions drawn."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'fsspec-kbs[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    parts = activity.partitions[:max_partitions]
    edges_ms = activity.edges
    edges = (edges_ms / 1000.0).astype("datetime64[s]")  # matplotlib takes numpy datetimes
    width_ms = (activity.end - activity.start) / activity.bins
    fig, axes = plt.subplots(len(parts), 1, sharex=True, squeeze=False,
                             figsize=(10, 0.9 + 1.15 * len(parts)))
    for ax, p in zip(axes[:, 0], parts, strict=True):
        rate = p.counts / (width_ms / 1000.0)  # records per second
        ax.stairs(rate, edges, fill=True, color="#3b73b9", alpha=0.85)
        for a, b in gap_spans(p.counts):
            ax.axvspan(edges[a], edges[b], color="#d62728", alpha=0.18, lw=0)
        for t in p.boundaries:
            ax.axvline(np.datetime64(int(t), "ms"), color="#555555", ls=":", lw=0.8)
        ax.set_ylabel(f"{p.topic}/{p.partition}", rotation=0, ha="right", va="center", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(bottom=0)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].xaxis.set_major_formatter(mdates.ConciseDateFormatter(axes[-1, 0].xaxis.get_major_locator()))
    from matplotlib.patches import Patch

    handles = [Patch(color="#3b73b9", label="records/s"), Patch(color="#d62728", alpha=0.3, label="no records (gap)"),
               plt.Line2D([], [], color="#555555", ls=":", label="segment boundary")]
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=3, frameon=False)
    fig.suptitle(f"{title}: records per second (from {activity.source}), UTC", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(parts)


def to_json(activity: Activity) -> dict[str, Any]:
    return {"start": activity.start, "end": activity.end, "bins": activity.bins, "source": activity.source,
            "partitions": [{"topic": p.topic, "partition": p.partition, "counts": [round(float(c), 3) for c in p.counts],
                            "segment_boundaries": p.boundaries, "offset_gaps": p.offset_gaps}
                           for p in activity.partitions]}
