"""`[[bridge]]` entries (docs/bridges.md) parsed into plain, frozen settings: pure functions, no I/O
except reading a password file when asked (`Endpoint.password`).

One entry is one link, one direction: messages are read from `from` and written to `to`. An
endpoint is a URL (`mqtt://`, `mqtts://`, `amqp://`, `amqps://`) or `gateway:mqtt` /
`gateway:amqp`: the listener of the gateway the bridge runs inside (`gateway start` with
`[[bridge]]` in its config); `gateway bridge` resolves those with `--gateway-host` and the ports
given there."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from runtime import ConfigError

from .topics import TopicRule, check_filter

SCHEMES = {"mqtt": ("mqtt", False), "mqtts": ("mqtt", True), "amqp": ("amqp", False), "amqps": ("amqp", True)}
DEFAULT_PORTS = {("mqtt", False): 1883, ("mqtt", True): 8883, ("amqp", False): 5672, ("amqp", True): 5671}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

_ENDPOINT_KEYS = {
    "url",
    "username",
    "password_file",
    "ca_file",
    "cert_file",
    "key_file",
    "tls_insecure",
    # MQTT
    "client_id",
    "clean_session",
    "mqtt_version",
    "qos",
    "keepalive",
    # AMQP
    "vhost",
    "queue",
    "declare",
    "exchange",
    "routing_key",
    "mandatory",
}
_BRIDGE_KEYS = {
    "name",
    "from",
    "to",
    "topic",
    "inflight",
    "reconnect_min_s",
    "reconnect_max_s",
    "confirm_timeout_s",
}


@dataclass(frozen=True)
class Endpoint:
    """One side of a link. `gateway` is True for `gateway:<protocol>` (host and port filled in when
    the bridge starts, `resolve`)."""

    protocol: str  # "mqtt" | "amqp"
    host: str = "127.0.0.1"
    port: int = 0
    tls: bool = False
    gateway: bool = False
    username: str | None = None
    password_file: str | None = None
    url_password: str | None = field(default=None, repr=False)  # from the URL (discouraged)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_insecure: bool = False
    client_id: str | None = None
    clean_session: bool | None = None  # None: persistent when reading, clean when writing
    mqtt_version: str = "3.1.1"
    qos: int = 1
    keepalive: int = 30
    vhost: str = "/"
    queue: str | None = None
    declare: bool = False
    exchange: str = ""
    routing_key: str | None = None
    mandatory: bool = True

    def password(self) -> str | None:
        """The password: the first line of `password_file` (read at each connect, so a rotated file
        is picked up), else the URL's; ConfigError if the file cannot be read."""
        if self.password_file is None:
            return self.url_password
        try:
            with open(self.password_file, encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read password_file {self.password_file}: {e}") from None

    def address(self) -> str:
        scheme = self.protocol + ("s" if self.tls else "")
        return f"{scheme}://{self.host}:{self.port}"


@dataclass(frozen=True)
class BridgeConfig:
    name: str
    source: Endpoint
    sink: Endpoint
    rules: tuple[TopicRule, ...] = ()
    inflight: int = 100  # messages read and not yet confirmed by the sink (the duplicate bound)
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 30.0
    confirm_timeout_s: float = 30.0


def _bool(where: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {v!r}")
    return v


def _str(where: str, key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{where}: {key} must be a string, got {v!r}")
    return v


def _num(where: str, key: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ConfigError(f"{where}: {key} must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def _int(where: str, key: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{where}: {key} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def parse_endpoint(where: str, raw: Any) -> Endpoint:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table with a url")
    unknown = sorted(set(raw) - _ENDPOINT_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    url = _str(where, "url", raw.get("url", ""))
    kw: dict[str, Any] = {}
    if url.startswith("gateway:"):
        protocol = url.split(":", 1)[1]
        if protocol not in ("mqtt", "amqp"):
            raise ConfigError(f"{where}: url {url!r}: expected gateway:mqtt or gateway:amqp")
        kw |= {"protocol": protocol, "gateway": True}
    else:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ConfigError(
                f"{where}: url must be mqtt[s]:// or amqp[s]:// HOST[:PORT] or gateway:mqtt|amqp, got {url!r}"
            )
        protocol, tls = SCHEMES[parts.scheme]
        try:
            port = parts.port or DEFAULT_PORTS[(protocol, tls)]
        except ValueError:
            raise ConfigError(f"{where}: bad port in url {url!r}") from None
        kw |= {"protocol": protocol, "host": parts.hostname, "port": port, "tls": tls}
        if parts.username:
            kw["username"] = unquote(parts.username)
        if parts.password:
            kw["url_password"] = unquote(parts.password)
        if protocol == "amqp" and parts.path not in ("", "/"):
            kw["vhost"] = unquote(parts.path[1:])
    for key in (
        "username",
        "password_file",
        "ca_file",
        "cert_file",
        "key_file",
        "client_id",
        "vhost",
        "queue",
        "exchange",
        "routing_key",
    ):
        if key in raw:
            kw[key] = _str(where, key, raw[key])
    for key in ("tls_insecure", "clean_session", "declare", "mandatory"):
        if key in raw:
            kw[key] = _bool(where, key, raw[key])
    if "qos" in raw:
        kw["qos"] = _int(where, "qos", raw["qos"], 0, 1)
    if "keepalive" in raw:
        kw["keepalive"] = _int(where, "keepalive", raw["keepalive"], 1, 65535)
    if "mqtt_version" in raw:
        v = str(raw["mqtt_version"])
        if v not in ("3.1.1", "5"):
            raise ConfigError(f'{where}: mqtt_version must be "3.1.1" or "5", got {raw["mqtt_version"]!r}')
        kw["mqtt_version"] = v
    if any(k in raw for k in ("ca_file", "cert_file")) and not kw.get("tls") and not kw.get("gateway"):
        raise ConfigError(f"{where}: ca_file / cert_file need an mqtts:// or amqps:// url")
    mqtt_only = {"client_id", "clean_session", "mqtt_version", "qos", "keepalive"}
    amqp_only = {"vhost", "queue", "declare", "exchange", "routing_key", "mandatory"}
    wrong = sorted(set(raw) & (amqp_only if kw["protocol"] == "mqtt" else mqtt_only))
    if wrong:
        raise ConfigError(f"{where}: {', '.join(wrong)}: not for {kw['protocol']} endpoints")
    return Endpoint(**kw)


def parse_rule(where: str, raw: Any) -> TopicRule:
    if isinstance(raw, str):
        raw = {"filter": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table (filter, qos, from_prefix, to_prefix)")
    unknown = sorted(set(raw) - {"filter", "qos", "from_prefix", "to_prefix"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    flt = _str(where, "filter", raw.get("filter", "#"))
    try:
        check_filter(flt)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    return TopicRule(
        flt,
        _int(where, "qos", raw.get("qos", 1), 0, 1),
        _str(where, "from_prefix", raw.get("from_prefix", "")),
        _str(where, "to_prefix", raw.get("to_prefix", "")),
    )


def parse_bridge(raw: Any, index: int = 0) -> BridgeConfig:
    where = f"bridge[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(raw) - _BRIDGE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    name = _str(where, "name", raw.get("name", ""))
    if not _NAME.match(name):
        raise ConfigError(f"{where}: name must be 1-64 of A-Z a-z 0-9 _ . -, got {name!r}")
    where = f"bridge {name!r}"
    source = parse_endpoint(f"{where} from", raw.get("from"))
    sink = parse_endpoint(f"{where} to", raw.get("to"))
    rules_raw = raw.get("topic", [])
    if not isinstance(rules_raw, Sequence) or isinstance(rules_raw, str):
        raise ConfigError(f"{where}: topic must be a list of tables ([[bridge.topic]])")
    rules = tuple(parse_rule(f"{where} topic[{i}]", r) for i, r in enumerate(rules_raw))
    if source.protocol == "mqtt" and not rules:
        raise ConfigError(f"{where}: an MQTT source needs at least one [[bridge.topic]] filter")
    if source.protocol == "amqp" and not source.queue:
        raise ConfigError(f"{where}: an AMQP source needs a queue")
    if sink.protocol == "amqp" and sink.queue:
        raise ConfigError(f"{where}: an AMQP destination takes exchange and routing_key, not queue")
    if source.protocol == "amqp" and (source.exchange or source.routing_key):
        raise ConfigError(f"{where}: an AMQP source reads a queue; exchange / routing_key belong to `to`")
    if source.gateway and sink.gateway:
        raise ConfigError(f"{where}: one side must be another broker")
    kw: dict[str, Any] = {}
    if "inflight" in raw:
        kw["inflight"] = _int(where, "inflight", raw["inflight"], 1, 65535)
    for key, lo, hi in (
        ("reconnect_min_s", 0.01, 60.0),
        ("reconnect_max_s", 0.01, 3600.0),
        ("confirm_timeout_s", 0.1, 3600.0),
    ):
        if key in raw:
            kw[key] = _num(where, key, raw[key], lo, hi)
    cfg = BridgeConfig(name, source, sink, rules, **kw)
    if cfg.reconnect_max_s < cfg.reconnect_min_s:
        raise ConfigError(f"{where}: reconnect_max_s must be >= reconnect_min_s")
    return cfg


def parse_bridges(raw: Any) -> tuple[BridgeConfig, ...]:
    """The `bridge` array of a TOML document (`[[bridge]]`); names must be unique."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ConfigError("bridge must be an array of tables ([[bridge]])")
    out = tuple(parse_bridge(r, i) for i, r in enumerate(raw))
    names = [b.name for b in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"bridge names must be unique: {', '.join(dup)}")
    return out


def resolve(cfg: BridgeConfig, host: str, ports: Mapping[str, int]) -> BridgeConfig:
    """`gateway:<protocol>` endpoints pointed at `host` and the gateway's listener `ports`."""
    from dataclasses import replace

    def one(e: Endpoint) -> Endpoint:
        if not e.gateway:
            return e
        if e.protocol not in ports:
            raise ConfigError(
                f"bridge {cfg.name!r}: gateway:{e.protocol}, but the gateway has no {e.protocol} listener"
            )
        return replace(e, host=host, port=ports[e.protocol])

    return replace(cfg, source=one(cfg.source), sink=one(cfg.sink))
