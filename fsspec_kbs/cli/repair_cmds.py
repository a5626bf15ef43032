"""``kbs repair``: finish a commit whose writer died, optionally clean abandoned staging."""

from __future__ import annotations

import click

from fsspec_kbs.cli.common import fail, out, storage_options_from, storage_options_option
from fsspec_kbs.errors import KbsError


@click.command("repair")
@click.argument("url")
@storage_options_option
@click.option("--clean-staging", is_flag=True,
              help="Also delete _staging/ (files of writers that died before committing). "
                   "Only when no writer is running on this backup.")
def repair_cmd(url: str, storage_option: tuple, storage_options_json: str | None, clean_staging: bool) -> None:
    """Roll forward a commit that was claimed but not published at the backup URL.

    Safe to run at any time (also while the committing writer still runs): applying a
    commit record twice gives the same backup.
    """
    from fsspec_kbs.store.txn import repair

    opts = storage_options_from(storage_option, storage_options_json)
    try:
        report = repair(url, opts, clean_staging=clean_staging)
    except (KbsError, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(e)
        return
    if report.rolled_forward is not None:
        out.print(f"rolled forward commit {report.rolled_forward}: {report.moved} file(s) moved into place, "
                  "manifest.json published")
    elif report.complete:
        out.print(f"nothing to repair: commit {report.version} is published" if report.version >= 0
                  else "nothing to repair: no commit records (backup written before them)")
    else:
        out.print(f"no commit pending and no manifest.json at {url}: nothing was committed here")
    if report.staging_removed:
        out.print(f"removed {len(report.staging_removed)} staging director(y/ies): "
                  + ", ".join(report.staging_removed))


def register(group: click.Group) -> None:
    group.add_command(repair_cmd)
