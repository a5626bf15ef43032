"""Options and helpers shared by the ``kbs`` commands."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.text import Text

from fsspec_kbs.format.codecs import CODEC_BY_NAME

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


def format_config(options: dict[str, Any]) -> str:
    """``key=value`` pairs as typed with ``-X``, secrets redacted."""
    return " ".join(f"{k}={v}" for k, v in sorted(redact(options).items()))


def _alias_callback(dest: str, new: str, is_time: bool) -> Callable[[click.Context, click.Parameter, Any], None]:
    """Store an old spelling's value for :func:`command_wrapper` to merge into ``dest``."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None or value == () or value is False:
            return
        if is_time:
            value = _time_callback(ctx, param, value)
        old = "/".join(param.opts)
        warn_line(f"{old} is deprecated and goes in the next release: use {new}")
        ctx.meta.setdefault(ALIASES, {})[dest] = value

    return callback


def alias(*decls: str, dest: str, new: str, callback_parse: bool = False, **kwargs: Any) -> Callable[[Callable], Callable]:
    """A hidden option under an old spelling whose value lands in ``dest`` (with a deprecation note);
    ``callback_parse``: the value is a time (parsed like ``--start-time``)."""
    return click.option(*decls, f"_alias_{dest}_{decls[-1].lstrip('-').replace('-', '_')}", hidden=True,
                        expose_value=False, callback=_alias_callback(dest, new, callback_parse), **kwargs)


def storage_options_option(fn: Callable) -> Callable:
    fn = click.option("-S", "--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
                      help="fsspec storage option (repeatable), e.g. -S endpoint_url=http://127.0.0.1:9000")(fn)
    return click.option("--storage-options", "storage_options_json", metavar="JSON",
                        help="fsspec storage options as one JSON object")(fn)


def dest_storage_options_option(fn: Callable) -> Callable:
    """--dest-storage-option(s) for the URL written to (old: -T/--to-storage-option(s), -D/--dst-storage-option)."""
    fn = alias("-D", "--dst-storage-option", dest="dest_storage_option", new="--dest-storage-option",
               multiple=True)(fn)
    fn = alias("-T", "--to-storage-option", dest="dest_storage_option", new="--dest-storage-option",
               multiple=True)(fn)
    fn = alias("--to-storage-options", dest="dest_storage_options_json", new="--dest-storage-options")(fn)
    fn = click.option("--dest-storage-option", "dest_storage_option", multiple=True, metavar="KEY=VALUE",
                      help="fsspec storage option for the destination (repeatable); default: the -S options "
                           "when both URLs use the same protocol.")(fn)
    return click.option("--dest-storage-options", "dest_storage_options_json", metavar="JSON",
                        help="fsspec storage options for the destination as one JSON object")(fn)


def storage_options_from(storage_option: tuple[str, ...], storage_options_json: str | None,
                         what: str = "--storage-options") -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if storage_options_json:
        try:
            opts.update(json.loads(storage_options_json))
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint=what) from e
    opts.update(parse_kv(storage_option, what.rstrip("s")))
    return opts


def dest_storage_options_from(src_url: str, dst_url: str, src_opts: dict[str, Any],
                              dest_storage_option: tuple[str, ...], dest_storage_options_json: str | None,
                              ) -> dict[str, Any]:
    """The destination's options; without any, the source's when both URLs use the same protocol."""
    if dest_storage_option or dest_storage_options_json:
        return storage_options_from(dest_storage_option, dest_storage_options_json, "--dest-storage-options")
    return dict(src_opts) if _protocol(src_url) == _protocol(dst_url) else {}


def _protocol(url: str) -> str:
    m = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", url)
    return m.group(1).lower() if m else "file"


def _time_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from fsspec_kbs.times import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def time_option(*decls: str, help: str) -> Callable[[Callable], Callable]:
    return click.option(*decls, callback=_time_callback, metavar="TIME", help=help)


TIME_HELP = "Unix ms, ISO 8601 (UTC unless an offset is given), -2h / '2h ago' / now-30m, today, yesterday"


def filter_options(fn: Callable) -> Callable:
    """--topic/--topic-pattern/--partition/--start-offset/--end-offset/--start-time/--end-time."""
    for opt in reversed([
        click.option("-t", "--topic", "topics", multiple=True, metavar="NAME",
                     help="Topic to include, exact name (repeatable)."),
        click.option("--topic-pattern", metavar="REGEX", help="Regular expression topic names must match in full."),
        click.option("-p", "--partition", "partitions", multiple=True, type=int, help="Partition (repeatable)."),
        click.option("--start-offset", type=int, help="First offset to include."),
        click.option("--end-offset", type=int, help="Offset to stop before (exclusive)."),
        time_option("--start-time", help=f"Earliest record timestamp, inclusive: {TIME_HELP}."),
        time_option("--end-time", help="Timestamp to stop before, exclusive (same forms)."),
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


def fail(error: BaseException) -> NoReturn:
    """Hand a library error to :func:`command_wrapper`, which prints it as one line and exits."""
    raise error


# -- errors, warnings and exit codes ------------------------------------------------------------------

#: Exit codes (docs/cli.md).
EXIT_OK = 0
EXIT_DEFECTS = 1      # validate found defects
EXIT_FAILED = 2       # usage error, or the backup / URL / data stopped the command
EXIT_STORAGE = 3      # the storage could not be reached or refused access (credentials, network)
EXIT_INTERNAL = 4     # a bug in kbs: rerun with --debug and report the traceback
EXIT_INTERRUPTED = 130

ALIASES = "kbs.aliases"
_state: dict[str, Any] = {"debug": os.environ.get("KBS_DEBUG", "") not in ("", "0"), "seen": set()}


class CliError(click.ClickException):
    """One line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def print_error(message: str) -> None:
    console.print(Text.assemble(("error: ", "bold red"), " ".join(message.split())), soft_wrap=True)


def warn_line(message: str) -> None:
    """A warning as one line on stderr, once per message per run."""
    text = " ".join(str(message).split())
    if text in _state["seen"]:
        return
    _state["seen"].add(text)
    console.print(Text.assemble(("warning: ", "yellow"), text), soft_wrap=True)


def set_debug(ctx: click.Context | None, param: click.Parameter | None, value: bool) -> None:
    if value:
        _state["debug"] = True


def debug_enabled() -> bool:
    return bool(_state["debug"])


_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "ClientAuthenticationError", "DefaultCredentialsError", "RefreshError",
                      "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "AccessDenied"}
_NETWORK_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ServiceRequestError",
                   "ClientConnectorError", "ServerTimeoutError", "ConnectionError", "TimeoutError",
                   "ConnectionRefusedError", "ServiceResponseError"}
_CREDENTIAL_HINTS = {
    "s3": "give credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or -S key=... "
          "-S secret=... (and -S endpoint_url=... for MinIO and others); -S anon=true for a public bucket",
    "az": "give AZURE_STORAGE_CONNECTION_STRING, or -S account_name=... with -S account_key=... "
          "(or -S sas_token=..., -S anon=false for Azure AD credentials)",
    "gs": "give GOOGLE_APPLICATION_CREDENTIALS or -S token=PATH.json; -S token=anon for a public bucket",
}
_CREDENTIAL_HINTS.update({"s3a": _CREDENTIAL_HINTS["s3"], "abfs": _CREDENTIAL_HINTS["az"],
                          "abfss": _CREDENTIAL_HINTS["az"], "adl": _CREDENTIAL_HINTS["az"],
                          "gcs": _CREDENTIAL_HINTS["gs"]})
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


def _names(e: BaseException) -> set[str]:
    names = {t.__name__ for t in type(e).__mro__}
    code = getattr(e, "response", None)
    if isinstance(code, dict):
        names.add(str(code.get("Error", {}).get("Code", "")))
    return names


def _chain(e: BaseException) -> list[BaseException]:
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return out


def _pythonic_to_flags(text: str) -> str:
    """``pass overwrite=True`` (a library message) as the CLI flag ``--overwrite``."""
    return re.sub(r"\b([a-z][a-z_]*)=True\b", lambda m: "--" + m.group(1).replace("_", "-"), text)


def cli_error(e: BaseException, params: dict[str, Any]) -> CliError:
    """The one-line message and exit code for an exception out of a command."""
    from fsspec_kbs import errors as E

    url = next((str(v) for k, v in params.items() if k.endswith("url") and isinstance(v, str)), None)
    proto = _protocol(url) if url else "file"
    msg = _pythonic_to_flags(" ".join(str(e).split())) or type(e).__name__

    def where(text: str) -> str:
        return text if not url or url in text or (proto == "file" and url.rstrip("/") in text) else f"{url}: {text}"

    chain = _chain(e)
    names = set().union(*(_names(x) for x in chain))
    if names & _CREDENTIAL_ERRORS or (proto != "file" and any(isinstance(x, PermissionError) for x in chain)):
        hint = _CREDENTIAL_HINTS.get(proto, "check the credentials and permissions of the storage")
        return CliError(where(f"access refused or no credentials ({type(e).__name__}: {msg})") + f"; {hint}",
                        EXIT_STORAGE)
    if names & _NETWORK_ERRORS:
        return CliError(where(f"cannot reach the storage ({msg})") + "; check the URL, -S endpoint_url=... and "
                        "the network", EXIT_STORAGE)
    if (proto == "az" or proto.startswith("abfs")) and (
            "connection_string" in msg or "account_name" in msg or "AZURE_STORAGE" in msg):
        return CliError(where(f"no Azure account given ({msg})") + f"; {_CREDENTIAL_HINTS['az']}", EXIT_STORAGE)
    if isinstance(e, ImportError) or "Install " in msg and "to access" in msg:
        extra = _EXTRAS.get(proto)
        return CliError(where(msg) + (f"; pip install 'fsspec-kbs[{extra}]'" if extra else ""), EXIT_FAILED)
    if isinstance(e, E.IncompleteBackupError):
        return CliError(where(msg) + "; pass --allow-incomplete to read what it holds", EXIT_FAILED)
    if isinstance(e, (E.SegmentFormatError, E.ManifestError)):
        hint = f"; kbs validate --deep {url} lists every defect" if url else ""
        return CliError(where(msg) + hint, EXIT_FAILED)
    if isinstance(e, FileExistsError):
        hint = "" if "--overwrite" in msg else "; pass --overwrite to replace it, or choose another URL"
        return CliError(where(msg) + hint, EXIT_FAILED)
    if isinstance(e, FileNotFoundError):
        return CliError(where(msg) + "; check the URL (kbs ls ROOT lists the backups under ROOT)", EXIT_FAILED)
    if isinstance(e, (E.KbsError, ValueError, TypeError, IsADirectoryError, NotADirectoryError)):
        return CliError(where(msg), EXIT_FAILED)
    if isinstance(e, PermissionError):
        return CliError(where(msg) + "; check the file permissions", EXIT_STORAGE)
    if isinstance(e, OSError):
        return CliError(where(msg), EXIT_STORAGE)
    return CliError(f"internal error: {type(e).__name__}: {msg}; rerun with --debug and report the traceback",
                    EXIT_INTERNAL)


class _WarningsToLines(logging.Handler):
    """fsspec_kbs log records at WARNING and above, printed like warnings (once per message)."""

    def emit(self, record: logging.LogRecord) -> None:
        warn_line(record.getMessage())


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    log = logging.getLogger("fsspec_kbs")
    handler = _WarningsToLines(logging.WARNING)
    log.addHandler(handler)
    old_propagate = log.propagate
    log.propagate = debug_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ResourceWarning, ImportWarning):
            warnings.simplefilter("ignore", quiet)

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                 line: Any = None) -> None:
            warn_line(str(message))

        warnings.showwarning = show
        try:
            yield
        finally:
            log.removeHandler(handler)
            log.propagate = old_propagate


def command_wrapper(callback: Callable) -> Callable:
    """Run a command: old option spellings merged, warnings as lines, errors as one line + exit code."""

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        for dest, value in ctx.meta.get(ALIASES, {}).items():
            current = kwargs.get(dest)
            if isinstance(value, tuple):
                kwargs[dest] = tuple(current or ()) + value
            elif current in (None, False):
                kwargs[dest] = value
        try:
            with _warnings_as_lines():
                return callback(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except BrokenPipeError:  # `kbs cat … | head`
            with contextlib.suppress(Exception):
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
            raise SystemExit(EXIT_OK) from None
        except KeyboardInterrupt:
            if debug_enabled():
                raise
            raise CliError("interrupted", EXIT_INTERRUPTED) from None
        except Exception as e:
            if debug_enabled():
                raise
            raise cli_error(e, kwargs) from None

    return run


DEBUG_HELP = "Show the full traceback of an error (also: KBS_DEBUG=1)."


class KbsGroup(click.Group):
    """The ``kbs`` group: every command gets ``--debug`` and :func:`command_wrapper`, and click's
    own usage errors are one line too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                                        callback=set_debug, help=DEBUG_HELP))

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if cmd.callback is not None and not getattr(cmd.callback, "__kbs_wrapped__", False):
            cmd.callback = command_wrapper(cmd.callback)
            cmd.callback.__kbs_wrapped__ = True  # type: ignore[attr-defined]
            cmd.params.append(click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                                           callback=set_debug, help=DEBUG_HELP))
        super().add_command(cmd, name)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        _state["seen"] = set()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            print_error("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        except click.UsageError as e:
            hint = ""
            if e.ctx is not None:
                hint = f" (see {e.ctx.command_path} --help)"
            print_error(e.format_message() + hint)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_duration(ms: float) -> str:
    """``3 d 4 h``, ``12 min``, ``250 ms``: the two largest units."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    units = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))
    parts = []
    rest = ms
    for name, size in units:
        if rest >= size or parts:
            n = int(rest // size)
            rest -= n * size
            if n:
                parts.append(f"{n} {name}")
            if len(parts) == 2:
                break
    return " ".join(parts) if parts else f"{ms / 1000:.1f} s"


def iso_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


#: ``--compression`` choices: the codec registry's names.
CODEC_CHOICE = click.Choice(sorted(CODEC_BY_NAME))
