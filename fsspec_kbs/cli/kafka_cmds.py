"""``kbs backup`` and ``kbs restore``: a live Kafka cluster to a KBS backup and back."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fsspec_kbs.cli.common import (
    CODEC_CHOICE,
    TIME_HELP,
    CliError,
    alias,
    console,
    fail,
    format_config,
    human_bytes,
    iso_ms,
    out,
    storage_options_from,
    storage_options_option,
    time_option,
)
from fsspec_kbs.errors import KbsError
from fsspec_kbs.kafka.consume import BackupMemory

if TYPE_CHECKING:
    from fsspec_kbs.kafka.backup import BackupResult

_MEMORY = BackupMemory()


class _Rate(ProgressColumn):
    """records/s and MiB/s from the task's own counters."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text("-", style="progress.data.speed")
        mib = task.fields.get("nbytes", 0) / elapsed / 2**20
        return Text(f"{task.completed / elapsed:,.0f} rec/s  {mib:,.1f} MiB/s", style="progress.data.speed")


@contextmanager
def _progress(label: str, quiet: bool) -> Iterator[tuple[Callable[[int, int], None], Callable[[int], None]]]:
    """Yields (advance(records, bytes), set_total(records))."""
    if quiet:
        yield (lambda n, b: None), (lambda total: None)
        return
    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                    TextColumn("{task.completed:,.0f} records"), _Rate(), TimeElapsedColumn(),
                    console=console, transient=False)
    task = prog.add_task(label, total=None, nbytes=0)
    last = [0.0]

    def advance(n: int, b: int) -> None:
        t = prog.tasks[0]
        t.fields["nbytes"] = t.fields.get("nbytes", 0) + b
        prog.advance(task, n)
        now = time.monotonic()
        if now - last[0] > 0.1:
            last[0] = now
            prog.refresh()

    def set_total(total: int) -> None:
        prog.update(task, total=total)

    with prog:
        yield advance, set_total


def _client_options(fn: Callable) -> Callable:
    for opt in reversed([
        click.option("-b", "--bootstrap-servers", help="Kafka bootstrap servers, HOST:PORT[,...]."),
        click.option("-X", "client_config", multiple=True, metavar="KEY=VALUE",
                     help="librdkafka client property (repeatable), e.g. -X security.protocol=SASL_SSL."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="Client properties file (key=value lines); -X and --bootstrap-servers override it."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
        click.option("-v", "--verbose", count=True,
                     help="librdkafka's log lines: INFO with -v, DEBUG with -vv (default: WARNING and above)."),
        click.option("--connect-timeout", type=float, default=15.0, show_default=True,
                     help="Seconds the first contact with the cluster may take before the command fails."),
    ]):
        fn = opt(fn)
    return fn


def _client_config(bootstrap: str | None, config_file: str | None, pairs: tuple[str, ...]) -> dict[str, str]:
    from fsspec_kbs.kafka.config import merge_client_config

    return merge_client_config(bootstrap, config_file, pairs)


def _log_librdkafka(verbose: int) -> None:
    """librdkafka's log lines on stderr through Python logging, WARNING and above unless -v."""
    import logging

    from fsspec_kbs.kafka.clients import LOGGER

    LOGGER.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    if not any(getattr(h, "_kbs", False) for h in LOGGER.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("librdkafka %(levelname)s: %(message)s"))
        handler._kbs = True  # type: ignore[attr-defined]
        LOGGER.addHandler(handler)


def _backup_url(to: str, backup_id: str | None) -> tuple[str, str]:
    from fsspec_kbs.kafka.backup import default_backup_id
    from fsspec_kbs.store.names import backup_path

    bid = backup_id or default_backup_id()
    return backup_path(to, bid), bid  # checks the id before any broker is contacted


@click.command("backup")
@_client_options
@click.option("--topic", "topic_names", multiple=True, metavar="NAME", help="Topic to back up, exact name (repeatable).")
@click.option("--topic-pattern", "topics", multiple=True, metavar="REGEX",
              help="Topics to back up: regular expression matched against the whole name (repeatable).")
@alias("-t", "--topics", dest="topics", new="--topic-pattern", multiple=True)
@click.option("--to", "to", required=True, metavar="URL", help="Storage root; the backup goes to URL/BACKUP_ID.")
@click.option("--backup-id", help="Backup id (default backup-<UTC time>); required with --resume.")
@click.option("--compression", type=CODEC_CHOICE, default="zstd", show_default=True)
@click.option("--level", type=int, help="Compression level (zstd default 3).")
@click.option("--segment-max-bytes", type=int, default=64 * 1024 * 1024, show_default=True,
              help="Roll segments at this compressed size.")
@click.option("--segment-max-records", type=int, help="Roll segments after this many records.")
@click.option("--resume", is_flag=True, help="Continue the interrupted backup --backup-id from its checkpoint.")
@click.option("--incremental-from", metavar="BACKUP_URL",
              help="Start each partition after the last offset of this earlier backup.")
@click.option("--include-internal", is_flag=True, help="Let the patterns match internal topics (__*).")
@click.option("--no-consumer-groups", is_flag=True, help="Do not snapshot consumer-group offsets.")
@click.option("--checkpoint-interval", type=float, default=60.0, show_default=True,
              help="Seconds after which buffered records are written and checkpointed.")
@click.option("--buffer-bytes", type=int, default=_MEMORY.buffer_bytes, show_default=True,
              help="Consumed records waiting to be compressed, all partitions together.")
@click.option("--compress-ahead-bytes", type=int, default=_MEMORY.compress_ahead_bytes, show_default=True,
              help="Records queued for the compressing threads.")
@click.option("--segment-buffer-bytes", type=int, default=_MEMORY.segment_buffer_bytes, show_default=True,
              help="Compressed data of unfinished segments, all partitions together (beyond it the "
                   "largest is written early).")
@click.option("--fetch-queue-bytes", type=int, default=_MEMORY.fetch_queue_bytes, show_default=True,
              help="librdkafka's queue of fetched records (queued.max.messages.kbytes).")
@storage_options_option
def backup_cmd(bootstrap_servers: str | None, client_config: tuple[str, ...], config_file: str | None, quiet: bool,
               verbose: int, connect_timeout: float,
               topic_names: tuple[str, ...], topics: tuple[str, ...], to: str, backup_id: str | None, compression: str, level: int | None,
               segment_max_bytes: int, segment_max_records: int | None, resume: bool,
               incremental_from: str | None, include_internal: bool, no_consumer_groups: bool,
               checkpoint_interval: float, buffer_bytes: int, compress_ahead_bytes: int, segment_buffer_bytes: int,
               fetch_queue_bytes: int, storage_option: tuple[str, ...], storage_options_json: str | None) -> None:
    """Back up Kafka topics (a consistent cut: each partition up to its end offset at start)."""
    import re

    from fsspec_kbs.kafka.backup import IncrementalGapWarning, run_backup

    _log_librdkafka(verbose)

    patterns = [re.escape(t) for t in topic_names] + list(topics)
    if not patterns:
        raise click.UsageError("name the topics to back up: --topic NAME and/or --topic-pattern REGEX")

    try:
        if resume and not backup_id:
            raise click.UsageError("--resume needs the --backup-id of the backup to continue")
        conf = _client_config(bootstrap_servers, config_file, client_config)
        so = storage_options_from(storage_option, storage_options_json)
        memory = BackupMemory(fetch_queue_bytes=fetch_queue_bytes, buffer_bytes=buffer_bytes,
                              compress_ahead_bytes=compress_ahead_bytes, segment_buffer_bytes=segment_buffer_bytes)
        url, bid = _backup_url(to, backup_id)
        if not quiet:
            console.print(f"backup [bold]{bid}[/] -> {url}  (client: {format_config(conf)})", highlight=False)
        # A gap is shown in the summary table instead of as a Python warning.
        with _progress("resume" if resume else "backup", quiet) as (advance, set_total), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", IncrementalGapWarning)
            res = run_backup(conf, patterns, url, storage_options=so, compression=compression, level=level,
                             segment_max_bytes=segment_max_bytes, segment_max_records=segment_max_records,
                             resume=resume, incremental_from=incremental_from, include_internal=include_internal,
                             consumer_groups=not no_consumer_groups, checkpoint_interval=checkpoint_interval,
                             connect_timeout=connect_timeout, memory=memory, progress=advance, on_plan=set_total)
    except KbsError as e:
        fail(e)
        return
    except Exception as e:  # librdkafka errors (KafkaException) and storage errors
        fail(e)
        return
    _print_backup(res, quiet)


def _print_backup(res: BackupResult, quiet: bool) -> None:
    """The summary table of a finished ``kbs backup`` (quiet: only the backup's URL)."""
    m = res.manifest
    stats = m.statistics if m is not None else {}
    rate = res.bytes / res.seconds / 2**20 if res.seconds else 0.0
    table = Table(title=f"backup {res.backup_id}" + (" (resumed)" if res.resumed else ""), show_header=False)
    table.add_row("url", res.url)
    table.add_row("partitions", str(len(res.partitions)))
    table.add_row("records (this run)", f"{res.records:,}")
    table.add_row("records (backup)", f"{stats.get('records', 0):,}")
    table.add_row("segments", f"{stats.get('segments', 0):,}")
    table.add_row("uncompressed", human_bytes(stats.get("uncompressed_bytes")))
    table.add_row("compressed", human_bytes(stats.get("compressed_bytes")))
    table.add_row("consumer groups", str(res.groups))
    if res.gaps:
        lost = sum(b - a for a, b in res.gaps.values())
        table.add_row("[bold red]gaps[/]", f"{lost:,} records in {len(res.gaps)} partition(s) deleted from the "
                      "broker since the earlier backup: in neither backup (manifest: kafka.gaps)")
    table.add_row("time", f"{res.seconds:.1f} s ({rate:.1f} MiB/s)")
    if quiet:
        out.print(res.url, highlight=False)
    else:
        out.print(table)


@click.command("restore")
@click.argument("backup_url")
@_client_options
@click.option("-t", "--topic", "topics", multiple=True, help="Source topic to restore (repeatable; default all).")
@click.option("--topic-pattern", help="Regular expression source topics must match.")
@click.option("--map", "maps", multiple=True, metavar="SRC:DST", help="Restore topic SRC into DST (repeatable).")
@click.option("-p", "--partition", "partitions", multiple=True, type=int, help="Source partition (repeatable).")
@time_option("--start-time", "from_time", help=f"Earliest record timestamp to restore, inclusive: {TIME_HELP}.")
@time_option("--end-time", "to_time", help="Restore records before this timestamp, exclusive (same forms).")
@alias("--from-time", dest="from_time", new="--start-time", callback_parse=True)
@alias("--to-time", dest="to_time", new="--end-time", callback_parse=True)
@click.option("--offset-range", "offset_ranges", multiple=True, metavar="TOPIC:PARTITION:START:END",
              help="Offset bounds of one source partition, START inclusive, END exclusive, either may be empty.")
@click.option("--create-topics", is_flag=True, help="Create missing target topics with enough partitions.")
@click.option("--replication-factor", type=int, default=-1, show_default=True,
              help="For created topics (-1 = broker default).")
@click.option("--topic-config", "topic_configs", multiple=True, metavar="KEY=VALUE",
              help="Config of created topics (repeatable), e.g. retention.ms=-1 to keep old records.")
@click.option("--include-offset-headers", is_flag=True, help="Add the source offset/timestamp/partition headers.")
@click.option("--offset-header-style", type=click.Choice(["kbs", "oso"]), default="kbs", show_default=True,
              help="kbs: x-kafka-backup-* as ASCII decimal; oso: x-original-offset/-timestamp (i64 LE) and "
                   "x-source-partition (i32 LE).")
@click.option("--restore-consumer-offsets", is_flag=True,
              help="Set the backed-up consumer groups' offsets, translated to the restored records.")
@click.option("--dry-run", is_flag=True, help="Print what would be restored and exit.")
@storage_options_option
def restore_cmd(backup_url: str, bootstrap_servers: str | None, client_config: tuple[str, ...],
                config_file: str | None, quiet: bool, verbose: int, connect_timeout: float, topics: tuple[str, ...], topic_pattern: str | None,
                maps: tuple[str, ...], partitions: tuple[int, ...], from_time: int | None, to_time: int | None,
                offset_ranges: tuple[str, ...], create_topics: bool, replication_factor: int,
                topic_configs: tuple[str, ...], include_offset_headers: bool, offset_header_style: str, restore_consumer_offsets: bool,
                dry_run: bool, storage_option: tuple[str, ...], storage_options_json: str | None) -> None:
    """Restore a backup into a Kafka cluster (same partition numbers, exact records)."""
    from fsspec_kbs.kafka.config import parse_pairs
    from fsspec_kbs.kafka.produce import RestoreIncompleteError
    from fsspec_kbs.kafka.restore import (
        RetentionWarning,
        parse_map,
        parse_offset_ranges,
        run_restore,
    )

    _log_librdkafka(verbose)

    try:
        conf = _client_config(bootstrap_servers, config_file, client_config)
        so = storage_options_from(storage_option, storage_options_json)
        if not quiet and not dry_run:
            console.print(f"restore {backup_url} -> {conf['bootstrap.servers']}  (client: {format_config(conf)})",
                          highlight=False)
        with _progress("restore", quiet or dry_run) as (advance, set_total), warnings.catch_warnings():
            warnings.simplefilter("ignore", RetentionWarning)  # printed below, after the table
            res = run_restore(
                backup_url, conf, storage_options=so, topics=list(topics) or None, topic_pattern=topic_pattern,
                mapping=parse_map(maps), partitions=list(partitions) or None, from_time=from_time, to_time=to_time,
                offset_ranges=parse_offset_ranges(offset_ranges), create_topics=create_topics,
                replication_factor=replication_factor, topic_config=parse_pairs(topic_configs, "--topic-config"),
                include_offset_headers=include_offset_headers,
                offset_header_style=offset_header_style, restore_consumer_offsets=restore_consumer_offsets,
                dry_run=dry_run, connect_timeout=connect_timeout, progress=advance,
                on_plan=lambda plans: set_total(sum(p.records for p in plans)))
    except RestoreIncompleteError as e:
        for line in str(e).splitlines()[1:]:  # per partition: what reached the target, how to go on
            console.print(line, highlight=False, soft_wrap=True)
        raise CliError(str(e).splitlines()[0]) from e
    except Exception as e:
        fail(e)
        return
    table = Table(title="dry run: would restore" if dry_run else "restored")
    for col in ("source", "partition", "target", "records", "offsets", "time range"):
        table.add_column(col)
    for pp in res.plan:
        table.add_row(pp.topic, str(pp.partition), pp.target, f"{pp.records:,}",
                      f"{pp.first_offset}…{pp.last_offset}", f"{iso_ms(pp.min_timestamp)} … {iso_ms(pp.max_timestamp)}")
    out.print(table)
    if res.created_topics:
        out.print(("would create" if dry_run else "created") + " topics: " + ", ".join(res.created_topics))
    for msg in res.retention_warnings:
        console.print(f"[bold red]warning:[/] {msg}", highlight=False)
    if restore_consumer_offsets and not dry_run and not res.group_offsets:
        out.print("no consumer-group offsets to restore (the backup's snapshot has none for these partitions)")
    for gid, offs in res.group_offsets.items():
        out.print(f"consumer group {gid}: " + ", ".join(f"{t}/{p}={o}" for (t, p), o in sorted(offs.items())))
    if not dry_run:
        rate = res.bytes / res.seconds / 2**20 if res.seconds else 0.0
        out.print(f"{res.records:,} records, {human_bytes(res.bytes)} in {res.seconds:.1f} s ({rate:.1f} MiB/s)")


def register(group: click.Group) -> None:
    group.add_command(backup_cmd)
    group.add_command(restore_cmd)
