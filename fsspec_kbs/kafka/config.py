"""librdkafka client configuration from ``-X key=value`` pairs and Java-style properties files."""

from __future__ import annotations

from pathlib import Path

from fsspec_kbs.errors import KafkaOptionError


def load_client_config(path: str | Path) -> dict[str, str]:
    """Read a ``key=value`` properties file (``#``/``!`` comments, blank lines ignored)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise KafkaOptionError(f"cannot read client config file {path}: {e.strerror or e}") from e
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise KafkaOptionError(f"{path}:{n}: expected key=value")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


def parse_pairs(pairs: list[str] | tuple[str, ...], what: str = "client config") -> dict[str, str]:
    """``-X key=value`` pairs (values kept as strings, as librdkafka wants them)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise KafkaOptionError(f"{what} {pair!r} is not key=value")
        out[key.strip()] = value
    return out


def merge_client_config(bootstrap_servers: str | None, config_file: str | None = None,
                        pairs: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """File first, then ``-X`` pairs, then ``--bootstrap-servers`` (later wins)."""
    conf: dict[str, str] = {}
    if config_file:
        conf.update(load_client_config(config_file))
    conf.update(parse_pairs(pairs))
    if bootstrap_servers:
        conf["bootstrap.servers"] = bootstrap_servers
    if not conf.get("bootstrap.servers"):
        raise KafkaOptionError("no bootstrap servers: pass --bootstrap-servers or bootstrap.servers in the config")
    return conf
