"""Entry point of the ``kbs`` console script; each command group lives in its own module."""

from __future__ import annotations

import importlib

import click

from fsspec_kbs import __version__
from fsspec_kbs.cli.common import KbsGroup

#: Modules that each define ``register(group)``; one per family of commands.
COMMAND_MODULES = (
    "fsspec_kbs.cli.inspect_cmds",
    "fsspec_kbs.cli.log_cmds",
    "fsspec_kbs.cli.convert_cmds",
    "fsspec_kbs.cli.kafka_cmds",
    "fsspec_kbs.cli.repair_cmds",
    "fsspec_kbs.cli.index_cmds",
)


@click.group(cls=KbsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kbs")
def cli() -> None:
    """Work with Kafka backups (KBS format) on any fsspec URL."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(cli)


def main() -> None:
    cli(prog_name="kbs")


if __name__ == "__main__":
    main()
