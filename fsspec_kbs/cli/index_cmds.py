"""``kbs index``: add batch indexes (kbs-format.md §7) to a backup written without them."""

from __future__ import annotations

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from fsspec_kbs.cli.common import console, fail, out, storage_options_from, storage_options_option
from fsspec_kbs.errors import KbsError


@click.command("index")
@click.argument("url")
@storage_options_option
def index_cmd(url: str, storage_option: tuple, storage_options_json: str | None) -> None:
    """Write a batch index beside every segment of the backup at URL that lacks one.

    Each segment is read whole and checked first; a new 1.2 manifest naming the indexes is
    committed like any other write (readers see the old backup or the new one). Safe to run
    again or while other writers append: segments that already have a good index are only
    verified. OSO-layout backups are refused (their format has no index).
    """
    from fsspec_kbs.maintenance.index import add_indexes
    from fsspec_kbs.store.segment_ref import SegmentRef

    opts = storage_options_from(storage_option, storage_options_json)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("indexing", total=None)

        def report(done: int, total: int, ref: SegmentRef, action: str) -> None:
            progress.update(task, total=total, completed=done,
                            description=f"indexing: {ref.topic}/{ref.partition}/{ref.name} {action}")

        try:
            result = add_indexes(url, opts, progress=report)
        except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
            progress.stop()
            fail(e)
    for path, why in result.rebuilt.items():
        console.print(f"rebuilt the index of {path}: {why}", markup=False, highlight=False)
    if result.committed is None:
        out.print(f"[green]OK[/]: all {result.segments} segment(s) already have a good index; nothing written")
    else:
        out.print(f"[green]OK[/]: {result.indexed} segment(s) indexed, {len(result.rebuilt)} index(es) rebuilt, "
                  f"{result.verified} verified; commit {result.committed} published (manifest 1.2)")


def register(group: click.Group) -> None:
    group.add_command(index_cmd)
