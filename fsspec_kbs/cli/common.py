"""Options and helpers shared by the ``kbs`` commands."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from fsspec_kbs.errors import KbsError

console = Console(stderr=True)
out = Console()

_SECRET = re.compile(r"(secret|password|token|key|credential|sasl)", re.I)


def parse_kv(pairs: tuple[str, ...], what: str) -> dict[str, Any]:
    """``key=value`` pairs; values that parse as JSON (numbers, true, {...}) are decoded."""
    result: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint=what)
        key, value = pair.split("=", 1)
        try:
            result[key] = json.loads(value)
        except json.JSONDecodeError:
            result[key] = value
    return result


def redact(options: dict[str, Any]) -> dict[str, Any]:
    """Options with secret-looking values replaced, for printing."""
    return {k: ("***" if _SECRET.search(k) else v) for k, v in options.items()}


def storage_options_option(fn: Callable) -> Callable:
    fn = click.option("-S", "--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
                      help="fsspec storage option (repeatable), e.g. -S endpoint_url=http://127.0.0.1:9000")(fn)
    return click.option("--storage-options", "storage_options_json", metavar="JSON",
                        help="fsspec storage options as one JSON object")(fn)


def storage_options_from(storage_option: tuple[str, ...], storage_options_json: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if storage_options_json:
        try:
            opts.update(json.loads(storage_options_json))
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--storage-options") from e
    opts.update(parse_kv(storage_option, "--storage-option"))
    return opts


def filter_options(fn: Callable) -> Callable:
    """--topic/--partition/--start-offset/--end-offset/--start-time/--end-time."""
    for opt in reversed([
        click.option("-t", "--topic", "topics", multiple=True, help="Topic to include (repeatable)."),
        click.option("--topic-pattern", help="Regular expression topics must match."),
        click.option("-p", "--partition", "partitions", multiple=True, type=int, help="Partition (repeatable)."),
        click.option("--start-offset", type=int, help="First offset to include."),
        click.option("--end-offset", type=int, help="Offset to stop before (exclusive)."),
        click.option("--start-time", help="Earliest timestamp (Unix ms or ISO 8601), inclusive."),
        click.option("--end-time", help="Timestamp to stop before (Unix ms or ISO 8601), exclusive."),
    ]):
        fn = opt(fn)
    return fn


def filters_from(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "topics": list(kwargs.pop("topics")) or None,
        "topic_pattern": kwargs.pop("topic_pattern"),
        "partitions": list(kwargs.pop("partitions")) or None,
        "start_offset": kwargs.pop("start_offset"),
        "end_offset": kwargs.pop("end_offset"),
        "start_time": kwargs.pop("start_time"),
        "end_time": kwargs.pop("end_time"),
    }


def fail(error: BaseException) -> None:
    """Print a library error the way a user wants to read it and exit non-zero."""
    console.print(f"[bold red]error:[/] {error}", highlight=False, markup=True, soft_wrap=True)
    raise SystemExit(2 if isinstance(error, KbsError) else 1)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def iso_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
