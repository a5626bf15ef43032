"""``kbs convert``: rewrite a backup in the other layout (KBS <-> the OSO tool's oso-native)."""

from __future__ import annotations

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from fsspec_kbs.cli.common import (
    CODEC_CHOICE,
    alias,
    console,
    dest_storage_options_from,
    dest_storage_options_option,
    fail,
    out,
    storage_options_from,
    storage_options_option,
)
from fsspec_kbs.errors import KbsError


@click.command("convert")
@click.argument("src_url")
@click.argument("dst_url")
@click.option("--layout", "to", type=click.Choice(["kbs", "oso"]),
              help="Layout to write: kbs (published KBS format) or oso (the OSO kafka-backup tool's own). "
                   "Required.")
@alias("--to", dest="to", new="--layout", type=click.Choice(["kbs", "oso"]))
@storage_options_option
@dest_storage_options_option
@click.option("--compression", type=CODEC_CHOICE,
              help="Codec of the output (default: the source's).")
@click.option("--level", type=int, help="Codec level.")
@click.option("--segment-max-bytes", type=int, help="Roll output segments at this size.")
@click.option("--segment-max-records", type=int, help="Roll output segments after this many records.")
@click.option("--overwrite", is_flag=True, help="Replace a backup already at DST_URL.")
@click.option("--allow-incomplete", is_flag=True, help="Convert a source backup without manifest.")
@click.option("--no-verify", is_flag=True, help="Skip checksum verification of the source.")
def convert_cmd(src_url: str, dst_url: str, to: str | None, storage_option: tuple,
                storage_options_json: str | None, dest_storage_option: tuple,
                dest_storage_options_json: str | None, compression: str | None, level: int | None,
                segment_max_bytes: int | None, segment_max_records: int | None, overwrite: bool,
                allow_incomplete: bool, no_verify: bool) -> None:
    """Convert the backup at SRC_URL (layout detected) into DST_URL in layout --layout, streaming.

    Lossless: keys, values, headers (null header values too), timestamps and offsets. The
    manifest is written last, so an interrupted conversion leaves no usable-looking backup.
    """
    from fsspec_kbs.maintenance.convert import ConvertProgress, convert_backup

    if to is None:
        raise click.UsageError("give the layout to write: --layout kbs or --layout oso")
    opts = storage_options_from(storage_option, storage_options_json)
    dst_opts = dest_storage_options_from(src_url, dst_url, opts, dest_storage_option, dest_storage_options_json)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"converting to {to}", total=None)

        def report(state: ConvertProgress) -> None:
            progress.update(task, total=state.segments_total, completed=state.segments_done,
                            description=f"converting to {to}: {state.records:,} records")

        try:
            result = convert_backup(src_url, dst_url, to, storage_options=opts, dst_storage_options=dst_opts,
                                    compression=compression, level=level, segment_max_bytes=segment_max_bytes,
                                    segment_max_records=segment_max_records, overwrite=overwrite,
                                    verify_checksums=not no_verify, allow_incomplete=allow_incomplete,
                                    progress=report)
        except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
            progress.stop()
            fail(e)
    out.print(f"[green]OK[/]: {result.records:,} records, {result.segments_read} segments read, "
              f"{result.segments_written} written as {to} at {dst_url} in {result.seconds:.1f} s")


def register(group: click.Group) -> None:
    group.add_command(convert_cmd)
