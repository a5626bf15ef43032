"""``kbs ls``, ``kbs describe``, ``kbs validate``, ``kbs cat``: looking at backups."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from fsspec_kbs.cli.common import (
    console,
    fail,
    filter_options,
    filters_from,
    human_bytes,
    human_duration,
    iso_ms,
    out,
    storage_options_from,
    storage_options_option,
    warn_line,
)
from fsspec_kbs.errors import KbsError

if TYPE_CHECKING:  # a type only: importing the store here would slow `kbs --help`
    from fsspec_kbs.store.layout import BackupDescription

#: ``kbs cat --binary`` choices (the encoders are in fsspec_kbs.arrow.jsonl; importing it here
#: would make ``kbs --help`` import pyarrow).
BINARY_CHOICES = ("base64", "hex", "utf8")


@click.command("ls")
@click.argument("root_url")
@storage_options_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def ls_cmd(root_url: str, storage_option: tuple, storage_options_json: str | None, as_json: bool) -> None:
    """List the backups under ROOT_URL."""
    from fsspec_kbs.store import list_backups

    try:
        found = list_backups(root_url, storage_options_from(storage_option, storage_options_json))
    except (KbsError, FileNotFoundError) as e:
        fail(e)
    if as_json:
        out.print_json(json.dumps([b.__dict__ for b in found]))
        return
    table = Table("backup id", "complete", "url")
    for b in found:
        table.add_row(b.backup_id, "yes" if b.complete else "[red]no (no manifest)[/]", b.url)
    out.print(table)


def _partition_rows(info: BackupDescription) -> list[dict[str, Any]]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for ref in info.segments:
        r = rows.setdefault((ref.topic, ref.partition), {
            "topic": ref.topic, "partition": ref.partition, "segments": 0, "records": 0,
            "first_offset": None, "last_offset": None, "min_ts": None, "max_ts": None, "bytes": 0})
        r["segments"] += 1
        r["records"] += ref.records or 0
        r["bytes"] += ref.size_bytes or 0
        if ref.first_offset is not None and (r["first_offset"] is None or ref.first_offset < r["first_offset"]):
            r["first_offset"] = ref.first_offset
        if ref.last_offset is not None and (r["last_offset"] is None or ref.last_offset > r["last_offset"]):
            r["last_offset"] = ref.last_offset
        if ref.min_timestamp is not None and (r["min_ts"] is None or ref.min_timestamp < r["min_ts"]):
            r["min_ts"] = ref.min_timestamp
        if ref.max_timestamp is not None and (r["max_ts"] is None or ref.max_timestamp > r["max_ts"]):
            r["max_ts"] = ref.max_timestamp
    return [rows[k] for k in sorted(rows)]


def _time_range(info: BackupDescription, rows: list[dict[str, Any]]) -> str:
    tr = info.time_range or {}
    lo, hi = tr.get("earliest_timestamp"), tr.get("latest_timestamp")
    if lo is None or hi is None:
        los = [r["min_ts"] for r in rows if r["min_ts"] is not None]
        his = [r["max_ts"] for r in rows if r["max_ts"] is not None]
        lo, hi = (min(los) if los else None), (max(his) if his else None)
    if lo is None or hi is None:
        return "not recorded by this layout (kbs describe --exact reads it from the records)"
    read = " [dim](read from the records)[/]" if any(r.get("times_from") for r in rows) else ""
    return f"{iso_ms(lo)} … {iso_ms(hi)} ({human_duration(hi - lo)}){read}"


def _fill_times(rows: list[dict[str, Any]], picture: Any) -> None:
    """Partition time ranges the layout does not record, from the records (exact activity)."""
    found = {(p.topic, p.partition): p for p in picture.partitions}
    for r in rows:
        p = found.get((r["topic"], r["partition"]))
        if r["min_ts"] is None and p is not None and p.first_ts is not None:
            r["min_ts"], r["max_ts"], r["times_from"] = p.first_ts, p.last_ts, "records"


def _compression(info: BackupDescription) -> str:
    comp = info.compression or {}
    if not comp:
        return "not recorded"
    algo = comp.get("algorithm") or "not recorded"
    level = comp.get("level")
    return f"{algo}, level {level}" if level is not None else f"{algo} (level not recorded)"


def _source_cluster(value: Any) -> str:
    if not value:
        return "not recorded"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "not recorded"
    return str(value)


def _activity_lines(activity: Any, width: int) -> list[Text]:
    from fsspec_kbs.cli.activity import gap_spans, sparkline

    labels = [f"{p.topic}/{p.partition}" for p in activity.partitions]
    label_w = min(max(len(x) for x in labels), 28)
    bin_ms = (activity.end - activity.start) / activity.bins
    lines = [Text.assemble(("records over time", "bold"),
                           f" (from {activity.source}; one column = {human_duration(bin_ms)}, "
                           f"{iso_ms(activity.start)} … {iso_ms(activity.end)}; {_EMPTY_MARK} = none)")]
    for label, p in zip(labels, activity.partitions, strict=True):
        spark = sparkline(p.counts)
        gaps = gap_spans(p.counts)
        if len(label) > label_w:
            lines.append(Text(label))
            label = ""
        line = Text(f"{label:<{label_w}}  ") + Text(spark, style="cyan")
        if gaps:
            line.append(f"  {len(gaps)} gap(s)", style="yellow")
        lines.append(line)
    return lines


_EMPTY_MARK = "·"
#: Up to this many stored bytes, describe's activity reads every timestamp (``--exact``).
EXACT_ACTIVITY_BYTES = 64 * 1024 * 1024


@click.command("describe")
@click.argument("backup_url")
@storage_options_option
@click.option("--allow-incomplete", is_flag=True, help="Describe a backup without manifest.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--plot", "plot_path", metavar="FILE.png", type=click.Path(dir_okay=False),
              help="Draw records over time per partition (gaps shaded, segment boundaries dotted) "
                   "into a PNG; needs matplotlib (pip install 'fsspec-kbs[plot]').")
@click.option("--activity/--no-activity", default=None,
              help="Per-partition sparkline of records over time (default: on in a terminal).")
@click.option("--exact/--estimate", "exact", default=None,
              help="Activity from every record's timestamp (--exact: reads the whole backup) or from "
                   "batch indexes and segment time ranges (--estimate). Default: exact up to 64 MiB stored.")
@click.option("--bins", type=click.IntRange(min=4), help="Time bins of --plot (default 200).")
def describe_cmd(backup_url: str, storage_option: tuple, storage_options_json: str | None,
                 allow_incomplete: bool, as_json: bool, plot_path: str | None, activity: bool | None,
                 exact: bool | None, bins: int | None) -> None:
    """Topics, partitions, offsets, records, time range, sizes and compression of a backup."""
    from fsspec_kbs.cli import activity as act
    from fsspec_kbs.store import open_backup

    try:
        backup = open_backup(backup_url, storage_options_from(storage_option, storage_options_json),
                             allow_incomplete=allow_incomplete)
        info = backup.describe()
    except (KbsError, FileNotFoundError) as e:
        fail(e)
    rows = _partition_rows(info)
    stats = info.statistics or {}
    records = sum(r["records"] for r in rows)
    compressed = sum(r["bytes"] for r in rows)
    uncompressed = stats.get("uncompressed_bytes")
    ratio = (uncompressed / compressed) if uncompressed and compressed else None
    explicit_exact = bool(exact)
    if exact is None:
        exact = compressed <= EXACT_ACTIVITY_BYTES
    show_activity = (out.is_terminal and not as_json) if activity is None else activity
    nbins = bins or max(10, max(out.width, 40) - min(max((len(f"{r['topic']}/{r['partition']}") for r in rows),
                                                        default=8), 28) - 14)
    picture = None
    if show_activity or explicit_exact:
        picture = act.compute(backup, nbins, exact=exact)
        if picture is not None and picture.source == "records":
            _fill_times(rows, picture)
    if plot_path:
        _plot(backup, backup_url, info.backup_id, plot_path, bins or 200, exact)
    if as_json:
        doc = info.to_dict()
        doc["partitions"] = rows
        doc["records"] = records
        doc["compressed_bytes"] = compressed
        doc["compression_ratio"] = ratio
        if show_activity:
            doc["activity"] = None if picture is None else act.to_json(picture)
        out.print_json(json.dumps(doc, default=str))
        return
    _print_summary(info, rows, records, compressed, uncompressed, ratio)
    _print_partitions(rows)
    if show_activity:
        width = max(out.width, 40)
        out.print()
        if picture is None:
            out.print("records over time: no timestamps recorded by this layout (add --exact to read them)")
        else:
            for line in _activity_lines(picture, width):
                out.print(line, overflow="fold")
    for gap in info.gaps:
        warn_line(f"gap: {gap}")


def _print_summary(info: BackupDescription, rows: list[dict], records: int, compressed: int, uncompressed: int | None,
                   ratio: float | None) -> None:
    """The backup's label: value lines."""
    layout = f"{info.layout} {info.version or ''}".strip()
    for label, value in (
        ("backup", info.backup_id),
        ("url", info.url),
        ("layout", layout + (", complete" if info.complete else ", [red]incomplete: no manifest.json[/]")),
        ("created", f"{info.created_at or 'not recorded'}"),
        ("completed", f"{info.completed_at or 'not recorded'}"),
        ("source cluster", escape(_source_cluster(info.source_cluster))),
        ("compression", escape(_compression(info))),
        ("contents", f"{len({r['topic'] for r in rows})} topic(s), {len(rows)} partition(s), "
                     f"{sum(r['segments'] for r in rows):,} segment(s), {records:,} records"),
        ("time range", _time_range(info, rows)),
        ("size", f"{human_bytes(compressed)} stored, "
         + (f"{human_bytes(uncompressed)} of records (compression ratio {ratio:.2f}x)" if ratio
            else "size of the records not recorded")),
    ):
        out.print(Text.assemble((f"{label:<15}", "bold"), Text.from_markup(value)), overflow="fold")
    out.print()


def _print_partitions(rows: list[dict]) -> None:
    """One table row per partition when wide; one block per partition when narrow (nothing cut)."""
    if out.width >= 150:
        table = Table("topic", "partition", "segments", "first offset", "last offset", "records",
                      "earliest", "latest", "size", title="partitions", title_justify="left")
        for col in table.columns[1:]:
            col.no_wrap = True
            if col.header not in ("earliest", "latest"):
                col.justify = "right"
        table.columns[0].overflow = "fold"
        for r in rows:
            table.add_row(r["topic"], str(r["partition"]), f"{r['segments']:,}", _num(r["first_offset"]),
                          _num(r["last_offset"]), f"{r['records']:,}", iso_ms(r["min_ts"]), iso_ms(r["max_ts"]),
                          human_bytes(r["bytes"]))
        out.print(table)
    else:  # narrow (a terminal at 80 columns, a pipe): one block per partition, nothing cut
        out.print(Text("partitions", style="bold"))
        for r in rows:
            out.print(Text.assemble((f"{r['topic']}/{r['partition']}", "bold cyan"),
                                    f"  {r['records']:,} records in {r['segments']:,} segment(s), "
                                    f"{human_bytes(r['bytes'])}"), soft_wrap=False, overflow="fold")
            out.print(f"  offsets  {_num(r['first_offset'])} … {_num(r['last_offset'])}", highlight=False)
            if r["min_ts"] is not None:
                out.print(f"  time     {iso_ms(r['min_ts'])} … {iso_ms(r['max_ts'])}", highlight=False)


def _plot(backup: Any, backup_url: str, backup_id: str, plot_path: str, bins: int, exact: bool) -> None:
    """``--plot``: records over time per partition as a PNG."""
    from fsspec_kbs.cli import activity as act

    picture = act.compute(backup, bins, exact=exact)
    if picture is None:
        warn_line(f"{backup_url}: no timestamps recorded for a picture; add --exact to read them from the records")
        return
    drawn = act.plot(picture, plot_path, backup_id)
    if drawn < len(picture.partitions):
        warn_line(f"--plot drew the first {drawn} of {len(picture.partitions)} partitions")
    console.print(f"wrote {plot_path}", highlight=False)


def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


@click.command("validate")
@click.argument("backup_url")
@storage_options_option
@click.option("--deep", is_flag=True, help="Check every CRC and decode every record.")
@click.option("--allow-incomplete", is_flag=True, help="Validate a backup without manifest.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def validate_cmd(backup_url: str, storage_option: tuple, storage_options_json: str | None, deep: bool,
                 allow_incomplete: bool, as_json: bool) -> None:
    """Check a backup; exit status 1 if any defect is found.

    Quick (default): manifest, names, segment sizes, headers and footers. --deep: also every
    checksum and every record.
    """
    from fsspec_kbs.maintenance.validate import validate_backup
    from fsspec_kbs.store import open_backup

    opts = storage_options_from(storage_option, storage_options_json)
    total = None
    with contextlib.suppress(KbsError, FileNotFoundError):  # validate_backup reports it
        total = len(open_backup(backup_url, opts, allow_incomplete=allow_incomplete).segments())
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, disable=not deep or as_json, transient=True) as progress:
        task = progress.add_task("validating segments", total=total)
        report = validate_backup(backup_url, opts, deep=deep, allow_incomplete=allow_incomplete,
                                 progress=lambda ref: progress.advance(task))
    if as_json:
        out.print_json(json.dumps({
            "url": report.url, "deep": report.deep, "ok": report.ok,
            "segments_checked": report.segments_checked, "records_checked": report.records_checked,
            "defects": [d.__dict__ for d in report.defects]}))
    else:
        for d in report.defects:
            console.print(f"[red]DEFECT[/] {d.error}: {d.message}", highlight=False, soft_wrap=True)
        kind = "deep" if deep else "quick"
        if report.ok:
            extra = f", {report.records_checked:,} records decoded" if deep else ""
            out.print(f"[green]OK[/] ({kind}): {report.segments_checked} segments{extra}, no defects"
                      + ("" if deep else "; headers, footers and sizes only: --deep checks every checksum "
                                         "and record"), highlight=False)
        else:
            out.print(f"[red]FAILED[/] ({kind}): {len(report.defects)} defect(s) in "
                      f"{report.segments_checked} segments checked")
    sys.exit(0 if report.ok else 1)


@click.command("cat")
@click.argument("backup_url")
@storage_options_option
@filter_options
@click.option("-n", "--limit", type=int, help="Print at most this many records.")
@click.option("--binary", type=click.Choice(BINARY_CHOICES), default="base64", show_default=True,
              help="How keys, values and header values are printed.")
@click.option("--allow-incomplete", is_flag=True, help="Read a backup without manifest.")
def cat_cmd(backup_url: str, storage_option: tuple, storage_options_json: str | None, limit: int | None,
            binary: str, allow_incomplete: bool, **kwargs: Any) -> None:
    """Print records as JSON lines (topic, partition, offset, timestamp, key, value, headers)."""
    from fsspec_kbs.api import unmatched_filters
    from fsspec_kbs.arrow.jsonl import batch_jsonl
    from fsspec_kbs.dataset import KbsDataset

    filters = filters_from(kwargs)
    printed = 0
    try:
        ds = KbsDataset.open(backup_url, storage_options_from(storage_option, storage_options_json),
                             allow_incomplete=allow_incomplete).filter(**filters)
        for message in unmatched_filters(ds):
            warn_line(message)
        for batch in ds.to_batches(columns=["topic", "partition", "offset", "timestamp", "key", "value",
                                            "headers"]):
            if limit is not None:
                batch = batch.slice(0, max(0, limit - printed))
            for chunk in batch_jsonl(batch, binary):
                sys.stdout.buffer.write(chunk)
            printed += batch.num_rows
            if limit is not None and printed >= limit:
                break
        sys.stdout.flush()
        if printed == 0 and any(v not in (None, []) for v in filters.values()):
            warn_line(f"no record of {backup_url} matched the filters")
    except BrokenPipeError:  # `kbs cat … | head`
        return
    except (KbsError, FileNotFoundError) as e:
        sys.stdout.flush()
        fail(e)


def register(group: click.Group) -> None:
    for cmd in (ls_cmd, describe_cmd, validate_cmd, cat_cmd):
        group.add_command(cmd)
