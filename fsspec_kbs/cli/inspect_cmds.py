"""``kbs ls``, ``kbs describe``, ``kbs validate``, ``kbs cat``: looking at backups."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from fsspec_kbs.cli.common import (
    console,
    fail,
    filter_options,
    filters_from,
    human_bytes,
    iso_ms,
    out,
    storage_options_from,
    storage_options_option,
)
from fsspec_kbs.errors import KbsError

_ENCODERS = {
    "base64": lambda b: base64.b64encode(b).decode("ascii"),
    "hex": lambda b: b.hex(),
    "utf8": lambda b: b.decode("utf-8", errors="replace"),
}


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


def _partition_rows(info: dict[str, Any]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for ref in info["segments"]:
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


@click.command("describe")
@click.argument("backup_url")
@storage_options_option
@click.option("--allow-incomplete", is_flag=True, help="Describe a backup without manifest.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def describe_cmd(backup_url: str, storage_option: tuple, storage_options_json: str | None,
                 allow_incomplete: bool, as_json: bool) -> None:
    """Topics, partitions, offsets, records, time range, sizes and compression of a backup."""
    from fsspec_kbs.store import open_backup

    try:
        backup = open_backup(backup_url, storage_options_from(storage_option, storage_options_json),
                             allow_incomplete=allow_incomplete)
        info = backup.describe()
    except (KbsError, FileNotFoundError) as e:
        fail(e)
    rows = _partition_rows(info)
    stats = info.get("statistics") or {}
    records = sum(r["records"] for r in rows)
    compressed = sum(r["bytes"] for r in rows)
    uncompressed = stats.get("uncompressed_bytes")
    ratio = (uncompressed / compressed) if uncompressed and compressed else None
    if as_json:
        doc = {k: v for k, v in info.items() if k != "segments"}
        doc["partitions"] = rows
        doc["records"] = records
        doc["compressed_bytes"] = compressed
        doc["compression_ratio"] = ratio
        out.print_json(json.dumps(doc, default=str))
        return
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    comp = info.get("compression") or {}
    tr = info.get("time_range") or {}
    for label, value in (
        ("backup", f"{info['backup_id']}  ({info['url']})"),
        ("layout", f"{info.get('layout', 'kbs')} {info.get('version') or ''}".strip()),
        ("complete", "yes" if info["complete"] else "[red]no: manifest.json missing[/]"),
        ("created / completed", f"{info.get('created_at') or '-'} / {info.get('completed_at') or '-'}"),
        ("source cluster", json.dumps(info.get("source_cluster"))),
        ("compression", f"{comp.get('algorithm', '-')} level {comp.get('level', '-')}" if comp else "-"),
        ("topics / partitions / segments",
         f"{len({r['topic'] for r in rows})} / {len(rows)} / {sum(r['segments'] for r in rows)}"),
        ("records", f"{records:,}"),
        ("time range", f"{iso_ms(tr.get('earliest_timestamp'))} … {iso_ms(tr.get('latest_timestamp'))}"),
        ("size", f"{human_bytes(compressed)} on storage, {human_bytes(uncompressed)} of records"
         + (f" (compression ratio {ratio:.2f}x)" if ratio else "")),
    ):
        summary.add_row(label, value)
    out.print(summary)
    table = Table("topic", "partition", "segments", "first offset", "last offset", "records",
                  "earliest", "latest", "size", title="partitions")
    for r in rows:
        table.add_row(r["topic"], str(r["partition"]), str(r["segments"]), str(r["first_offset"]),
                      str(r["last_offset"]), f"{r['records']:,}", iso_ms(r["min_ts"]), iso_ms(r["max_ts"]),
                      human_bytes(r["bytes"]))
    out.print(table)
    for gap in info.get("gaps") or []:
        console.print(f"[yellow]gap:[/] {gap}")


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
    from fsspec_kbs.store import open_backup
    from fsspec_kbs.validate import validate_backup

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
            out.print(f"[green]OK[/] ({kind}): {report.segments_checked} segments{extra}, no defects")
        else:
            out.print(f"[red]FAILED[/] ({kind}): {len(report.defects)} defect(s) in "
                      f"{report.segments_checked} segments checked")
    sys.exit(0 if report.ok else 1)


@click.command("cat")
@click.argument("backup_url")
@storage_options_option
@filter_options
@click.option("-n", "--limit", type=int, help="Print at most this many records.")
@click.option("--binary", type=click.Choice(sorted(_ENCODERS)), default="base64", show_default=True,
              help="How keys, values and header values are printed.")
@click.option("--allow-incomplete", is_flag=True, help="Read a backup without manifest.")
def cat_cmd(backup_url: str, storage_option: tuple, storage_options_json: str | None, limit: int | None,
            binary: str, allow_incomplete: bool, **kwargs: Any) -> None:
    """Print records as JSON lines (topic, partition, offset, timestamp, key, value, headers)."""
    from fsspec_kbs.dataset import KbsDataset

    enc = _ENCODERS[binary]
    filters = filters_from(kwargs)
    printed = 0
    try:
        ds = KbsDataset.open(backup_url, storage_options_from(storage_option, storage_options_json),
                             allow_incomplete=allow_incomplete).filter(**filters)
        for batch in ds.to_batches(columns=["topic", "partition", "offset", "timestamp", "key", "value",
                                            "headers"]):
            ts = batch.column("timestamp").cast("int64").to_pylist()
            for i, row in enumerate(batch.to_pylist()):
                if limit is not None and printed >= limit:
                    return
                doc = {
                    "topic": row["topic"], "partition": row["partition"], "offset": row["offset"],
                    "timestamp": ts[i],
                    "key": None if row["key"] is None else enc(row["key"]),
                    "value": None if row["value"] is None else enc(row["value"]),
                    "headers": [[h["key"], None if h["value"] is None else enc(h["value"])]
                                for h in row["headers"] or []],
                }
                sys.stdout.write(json.dumps(doc) + "\n")
                printed += 1
    except BrokenPipeError:  # `kbs cat … | head`
        return
    except (KbsError, FileNotFoundError) as e:
        sys.stdout.flush()
        fail(e)


def register(group: click.Group) -> None:
    for cmd in (ls_cmd, describe_cmd, validate_cmd, cat_cmd):
        group.add_command(cmd)
