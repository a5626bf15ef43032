"""``kbs import-log``, ``kbs compact``, ``kbs retain``: Kafka log directories and Kafka-style clean-up."""

from __future__ import annotations

import json
from collections.abc import Callable

import click

from fsspec_kbs.cli.common import (
    CODEC_CHOICE,
    TIME_HELP,
    dest_storage_options_from,
    dest_storage_options_option,
    fail,
    human_bytes,
    out,
    storage_options_from,
    storage_options_option,
    time_option,
)
from fsspec_kbs.errors import KbsError
from fsspec_kbs.maintenance.units import parse_duration, parse_size


def _parsed(parse: Callable[[str], int]) -> Callable[[click.Context, click.Parameter, str | None], int | None]:
    """A click callback turning the option's text into ``parse(text)``; its ValueError is a usage error."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from e

    return callback


@click.command("import-log")
@click.argument("kafka_log_dir")
@click.option("--to", "to_url", required=True, help="Backup directory to create (<root>/<backup-id>).")
@storage_options_option
@dest_storage_options_option
@click.option("-t", "--topic", "topics", multiple=True, help="Topic to import (repeatable; default all).")
@click.option("--topic-pattern", help="Regular expression topics must match.")
@click.option("-p", "--partition", "partitions", multiple=True, type=int, help="Partition (repeatable).")
@click.option("--compression", type=CODEC_CHOICE, default="zstd", show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a backup already at --to.")
@click.option("--strict", is_flag=True, help="Fail at a corrupt or truncated tail instead of stopping there.")
@click.option("--no-verify", is_flag=True, help="Skip the CRC-32C check of every batch.")
@click.option("--include-internal", is_flag=True, help="Also import __consumer_offsets and other internal topics.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def import_log_cmd(kafka_log_dir: str, to_url: str, storage_option: tuple, storage_options_json: str | None,
                   dest_storage_option: tuple, dest_storage_options_json: str | None, topics: tuple, topic_pattern: str | None,
                   partitions: tuple, compression: str, overwrite: bool, strict: bool, no_verify: bool,
                   include_internal: bool, as_json: bool) -> None:
    """Import a Kafka broker's log directory (KAFKA_LOG_DIR, one of its log.dirs) into a new backup.

    Reads every <topic>-<partition>/ directory, every segment and codec; checks CRC-32C; leaves out
    control records and aborted transactions. At a corrupt or truncated tail the partition stops
    there (like Kafka's log recovery) and the file, byte position and dropped bytes are reported.
    """
    from fsspec_kbs.kafka_log import import_log

    so = storage_options_from(storage_option, storage_options_json)
    try:
        report = import_log(
            kafka_log_dir, to_url, storage_options=so,
            to_storage_options=dest_storage_options_from(kafka_log_dir, to_url, so, dest_storage_option,
                                                          dest_storage_options_json),
            topics=list(topics) or None, topic_pattern=topic_pattern, partitions=list(partitions) or None,
            compression=compression, mode="overwrite" if overwrite else "error", verify_crc=not no_verify,
            on_corrupt_tail="error" if strict else "truncate", include_internal=include_internal)
    except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(e)
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
        return
    for p in report.partitions:
        extra = ""
        if p.aborted_records:
            extra += f", {p.aborted_records} aborted-transaction records left out"
        if p.tail:
            extra += f", [red]tail truncated at byte {p.tail.position} of {p.tail.path.rsplit('/', 1)[-1]}[/]"
        out.print(f"{p.topic}-{p.partition}: {p.records:,} records, offsets {p.first_offset} … {p.last_offset}, "
                  f"{'/'.join(sorted(p.to_dict()['timestamp_types'])) or '-'}{extra}", highlight=False)
    out.print(f"[green]imported[/] {report.records:,} records from {len(report.partitions)} partition(s) "
              f"into {to_url}" + (f" ([red]{len(report.tails)} truncated tail(s)[/])" if report.tails else ""))


@click.command("compact")
@click.argument("backup_url")
@click.option("--to", "to_url", required=True, help="Backup directory to create.")
@storage_options_option
@dest_storage_options_option
@click.option("--delete-retention", callback=_parsed(parse_duration), metavar="DURATION",
              help="Drop tombstones older than this (e.g. 1d, 12h, 86400000), measured back from the "
                   "partition's newest timestamp. Default: keep tombstones.")
@click.option("--compression", type=CODEC_CHOICE, help="Default: the source's.")
@click.option("--overwrite", is_flag=True, help="Replace a backup already at --to.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def compact_cmd(backup_url: str, to_url: str, storage_option: tuple, storage_options_json: str | None,
                dest_storage_option: tuple, dest_storage_options_json: str | None, delete_retention: int | None,
                compression: str | None, overwrite: bool, as_json: bool) -> None:
    """Kafka log compaction: keep the latest record per key in each partition (offsets unchanged)."""
    from fsspec_kbs.maintenance.compact import compact_backup

    so = storage_options_from(storage_option, storage_options_json)
    try:
        report = compact_backup(
            backup_url, to_url, storage_options=so,
            to_storage_options=dest_storage_options_from(backup_url, to_url, so, dest_storage_option,
                                                          dest_storage_options_json),
            delete_retention=delete_retention, compression=compression,
            mode="overwrite" if overwrite else "error")
    except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(e)
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
        return
    for p in report.partitions:
        out.print(f"{p.topic}/{p.partition}: {p.records_in:,} -> {p.records_out:,} records "
                  f"({p.superseded:,} superseded, {p.tombstones_removed:,} tombstones removed, "
                  f"{p.null_key_records:,} null keys kept)", highlight=False)
    out.print(f"[green]compacted[/] {report.records_in:,} -> {report.records_out:,} records into {to_url}")


@click.command("retain")
@click.argument("backup_url")
@click.option("--to", "to_url", required=True, help="Backup directory to create.")
@storage_options_option
@dest_storage_options_option
@click.option("--max-age", callback=_parsed(parse_duration), metavar="DURATION",
              help="Drop leading segments whose newest record is older than this (e.g. 7d).")
@click.option("--max-bytes", callback=_parsed(parse_size), metavar="SIZE",
              help="Per partition, drop leading segments while the rest stays at or above this (e.g. 10GiB).")
@time_option("--now", help=f"Reference time for --max-age ({TIME_HELP}); default: the backup's "
                          "latest timestamp.")
@click.option("--overwrite", is_flag=True, help="Replace a backup already at --to.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def retain_cmd(backup_url: str, to_url: str, storage_option: tuple, storage_options_json: str | None,
               dest_storage_option: tuple, dest_storage_options_json: str | None, max_age: int | None,
               max_bytes: int | None, now: int | None, overwrite: bool, as_json: bool) -> None:
    """Kafka time/size retention: copy the backup without the leading segments retention drops."""
    from fsspec_kbs.maintenance.retain import retain_backup

    if max_age is None and max_bytes is None:
        raise click.UsageError("give --max-age and/or --max-bytes")
    so = storage_options_from(storage_option, storage_options_json)
    try:
        report = retain_backup(
            backup_url, to_url, storage_options=so,
            to_storage_options=dest_storage_options_from(backup_url, to_url, so, dest_storage_option,
                                                          dest_storage_options_json),
            max_age=max_age, max_bytes=max_bytes, now=now, overwrite=overwrite)
    except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(e)
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
        return
    for p in report.partitions:
        out.print(f"{p.topic}/{p.partition}: {p.segments_in} -> {p.segments_out} segments "
                  f"({p.segments_dropped_by_age} by age, {p.segments_dropped_by_size} by size), "
                  f"{human_bytes(p.bytes_in)} -> {human_bytes(p.bytes_out)}", highlight=False)
    out.print(f"[green]retained[/] into {to_url}: {report.segments_dropped} segment(s) dropped")


def register(group: click.Group) -> None:
    for cmd in (import_log_cmd, compact_cmd, retain_cmd):
        group.add_command(cmd)
