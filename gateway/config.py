"""Gateway settings, layered in rising precedence: defaults < TOML file < GATEWAY_* env < CLI flags.

Every field of `Settings` is a TOML key of the same name, an environment variable
``GATEWAY_<NAME>`` and a flag ``--<name-with-dashes>`` of ``gateway start``."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import EVENT_LOOPS, LOG_LEVELS, ConfigError
from runtime.settings import (
    check_bools,
    check_choices,
    check_file_paths,
    check_int,
    check_leases,
    check_needs,
    check_strings,
    field_types,
    from_env,
    overlay,
    read_toml,
)

FLUSH_POLICIES = ("sync", "async")
REPLICATION_POLICIES = ("sync", "async")
MODES = ("local", "cluster")
MQTT_QUEUE_FULL_POLICIES = ("drop-oldest", "refuse-new")  # docs/limits.md "MQTT"
ENV_PREFIX = "GATEWAY_"

# Listener names, in start order; all are enabled by default.
PROTOCOLS = ("grpc", "remoting", "mqtt", "amqp", "http")

PORT_FIELDS = (
    "grpc_port",
    "remoting_port",
    "http_port",
    "mqtt_port",
    "amqp_port",
    "mqtt_tls_port",
    "amqp_tls_port",
    "https_port",
    "mqtt_ws_port",
    "mqtt_wss_port",
)
MIB = 1024 * 1024
MAX_BODY_LIMIT = 100 * MIB  # a record must fit one 128 MiB commit log segment

_NODE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def parse_protocols(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A comma list (or list) of listener names -> normalized tuple; rejects unknown ones."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"protocols must be names, got {item!r}")
        name = item.strip().lower()
        if not name:
            continue
        if name not in PROTOCOLS:
            raise ConfigError(f"unknown protocol {name!r} in protocols (known: {', '.join(PROTOCOLS)})")
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError("protocols must name at least one listener")
    return tuple(out)


@dataclass(frozen=True)
class Settings:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    flush: str = "sync"
    grpc_port: int = 8081
    remoting_port: int = 8080
    http_port: int = 8082
    mqtt_port: int = 1883
    amqp_port: int = 5672
    protocols: tuple[str, ...] = PROTOCOLS
    advertise_host: str | None = None
    auto_create_topics: bool = False
    max_body_size: int = 4 * MIB
    segment_size_mib: int = 128  # commit log segment files (grown to hold the largest body)
    default_queues: int = 8
    transaction_timeout_ms: int = 6000
    transaction_check_interval_ms: int = 5000
    drain_timeout_s: float = 5.0
    event_loop: str = "uvloop"
    log_level: str = "info"
    tls_cert: str | None = None  # PEM certificate chain: enables the TLS listeners (MQTT on mqtt_tls_port)
    tls_key: str | None = None  # PEM private key of tls_cert (default: in the tls_cert file)
    mqtt_tls_port: int = 8883
    amqp_tls_port: int = 5671
    https_port: int = 8443  # with tls_cert: the HTTP app (CloudEvents, read and admin API) over TLS
    grpc_plain: bool = False  # with tls_cert: keep the gRPC port in clear (default: it serves TLS only)
    tls_required: bool = False  # remoting (TLS detected on its port): refuse plain clients
    tls_client_ca: str | None = None  # PEM CA(s): every TLS listener asks for and verifies client certs
    tls_require_client_cert: bool = False  # refuse TLS clients without a verified certificate
    mqtt_cert_identity: bool = False  # MQTT over TLS: a client certificate's CN is the user
    # MQTT over WebSocket (docs/mqtt.md "MQTT over WebSocket"): ws on mqtt_ws_port, wss (with
    # tls_cert) on mqtt_wss_port, path mqtt_ws_path; the default ports are skipped (logged) when taken
    mqtt_ws: bool = True
    mqtt_ws_port: int = 8083
    mqtt_wss_port: int = 8084
    mqtt_ws_path: str = "/mqtt"
    amqp_mqtt_exchange: str = "amq.topic"  # AMQP exchange (vhost "/") shared with MQTT; "" = none
    amqp_max_body_size: int = 16 * MIB  # AMQP's own body limit (RabbitMQ 4's default max_message_size)
    mqtt_max_keep_alive: int = 0  # 0: clients choose; else the most a client may ask (5.0: Server Keep Alive)
    # system topics and client events (docs/system-topics.md): seconds between MQTT `$SYS/broker/...`
    # updates (0 = none); client lifecycle events on `%EVENTS%` (MQTT `$events/...`, AMQP
    # `amq.rabbitmq.event`, CloudEvents push subscriptions of `%EVENTS%`)
    sys_interval: int = 10
    client_events: bool = False
    # disk low-watermark (docs/limits.md "Disk"): publishes are refused while the data volume has less
    # free space than the largest of a comma list of sizes and percentages of the volume; "0" = off
    disk_free_limit: str = "1GiB,5%"
    # compacted topics: how long a tombstone (empty body) that is the latest record of its key is kept
    # before compaction removes the key ("24h", "30m", "90s", "500ms" or milliseconds)
    tombstone_retention: str = "24h"
    # tiered storage (docs/store.md "Tiered storage"): closed commit log segments move to this
    # S3-compatible endpoint ("" = off) and bucket once older than `tier_after` (a duration, "24h")
    # or beyond the newest `tier_after` bytes of local segments (a size, "10GiB"); credentials come
    # from the usual AWS_* variables
    tier_s3_endpoint: str = ""
    tier_bucket: str = ""
    tier_after: str = "24h"
    # message trace (docs/observability.md "Message trace"): how long the lifecycle records are kept
    # in %TRACE% (a duration; "0" or "off" disables tracing); OTLP/HTTP endpoint for spans ("" = off)
    trace_retention: str = "24h"
    otlp_endpoint: str = ""
    mqtt_max_client_id_length: int = 65535  # longer client ids: CONNACK 0x85 (5.0) / 2 (3.1.1)
    mqtt_max_topic_length: int = 65535  # longer topic names or filters (bytes): 0x90 / 0x8F
    mqtt_max_topic_levels: int = 128  # more levels ('/'-separated) in a name or filter: 0x90 / 0x8F
    mqtt_max_retained_messages: int = 0  # retained messages kept (0 = no cap); over it: 0x97
    mqtt_max_retained_bytes: int = 0  # bytes of retained payloads kept (0 = no cap); over it: 0x97
    mqtt_max_queued_messages: int = 0  # offline session backlog (0 = no cap); cut at reconnect, per policy
    mqtt_max_queued_bytes: int = 0  # offline session backlog, payload bytes (0 = no cap)
    mqtt_queue_full_policy: str = "drop-oldest"  # or "refuse-new": keep the oldest, skip the newest
    amqp_channel_max: int = 2047  # channel_max offered in connection.tune (RabbitMQ's default)
    amqp_frame_max: int = 131072  # frame_max offered in connection.tune (RabbitMQ's default)
    amqp_max_queues_per_vhost: int = 0  # 0 = no cap; a new queue over it: 406 (as RabbitMQ)
    amqp_max_queues_per_user: int = 0  # queues one user declared, all vhosts (0 = no cap); over it: 406
    cloudevents_dedup_window_s: int = 0  # > 0: CloudEvents ingest skips a source+id stored this recently
    # connection and publish-rate limits (docs/limits.md); 0 = off
    max_connections: int = 100_000  # open connections per listener (gRPC: client ids)
    max_connections_per_user: int = 0  # open connections of one user over all listeners
    # descriptors at the top of the process's limit that connections never hold (kept for the
    # store's files; at most a quarter of the limit): a connection that would is closed at once
    fd_reserve: int = 512
    max_connection_rate: float = 0.0  # new connections per second per source address
    connection_burst: int = 0  # connections an address may open at once (0: max_connection_rate, >= 1)
    publish_rate_msgs: float = 0.0  # messages/s per client connection and, separately, per user
    publish_rate_bytes: int = 0  # body bytes/s, same scopes
    publish_burst: float = 1.0  # seconds of the publish rates a client or user may send at once
    # bytes waiting in one MQTT/AMQP connection's write buffer above which its deliveries stop (0 = off)
    max_outbound_bytes_per_connection: int = 4 * MIB
    # /metrics (docs/observability.md): per-topic and per-group series in /metrics (/metrics/per-object
    # always has them), and how many topics and groups (each) they cover, the busiest first
    metrics_per_object: bool = True
    metrics_max_objects: int = 1000
    # CLUSTER mode (docs/cluster.md): `gateway start --mode cluster` proxies and `gateway store` nodes.
    mode: str = "local"  # "cluster": no local data, stores found through the name server(s)
    # proxy processes sharing every port (gateway/workers): in LOCAL mode over one store process, in
    # CLUSTER mode over the cluster's stores; an integer >= 1 or "auto" (one per core); 1: one process
    workers: int | str = 1
    namesrv: str | None = None  # name server address(es), "host:port;host:port"
    cluster_name: str = "DefaultCluster"  # store nodes register under it; proxies use its nodes
    store_name: str | None = None  # `gateway store --name`: the node's name (default store-<host>-<port>)
    store_port: int = 10911  # `gateway store --port`
    store_group: str | None = None  # `gateway store --group`: replica group (docs/cluster.md)
    controller: str | None = None  # etcd client URL(s) of the replica groups' controller, "a,b,c"
    replication: str = "sync"  # a replica group's acknowledgement policy: "sync" or "async"
    min_insync: int = 2  # sync: nodes (the primary included) that hold a send before it is acknowledged
    proxy_name: str | None = None  # name a proxy registers under (default proxy-<host>-<pid>)
    lease_period_s: float = 30.0  # stores and proxies renew their name server registration this often
    lease_expiry_s: float = 120.0  # ... which expires when not renewed for this long
    route_refresh_s: float = 5.0  # proxies refresh the store node list this often
    # the cluster secret (docs/security.md, "Closed cluster"): every connection to a name server or a
    # store node proves it first; a file readable by its owner only, read once at start
    cluster_secret_file: str | None = None
    # TLS on the cluster's own connections (docs/security.md, "Closed cluster"): proxies and store
    # nodes speak TLS to name servers and store nodes, verifying them against cluster_tls_ca (a
    # PEM CA; None: the system store; setting it turns cluster_tls on) and presenting tls_cert
    cluster_tls: bool = False
    cluster_tls_ca: str | None = None
    auth: bool = False  # users, tokens and ACL rules on every listener (docs/security.md)
    # clients without credentials (docs/security.md, "Anonymous clients"): with auth on they are let in
    # as the one anonymous principal that only the ACL rules of `anonymous` grant anything (default:
    # refused); with auth off everyone is anonymous, and this lets a non-loopback host run so
    allow_anonymous: bool = False
    # device tokens (docs/security.md, "Device tokens (JWT)"), with auth on: a password or Bearer
    # token shaped as a JWT is verified against a JWKS file, a PEM public key (RS256/ES256) or an
    # HS256 secret file (owner-only, >= 32 bytes); the user is the `jwt_user_claim` claim, `%d` in
    # ACL rules the `jwt_device_claim` claim; `iss` / `aud` checked when set; `exp` / `nbf` always
    jwt_jwks: str | None = None
    jwt_public_key: str | None = None
    jwt_secret_file: str | None = None
    jwt_user_claim: str = "sub"
    jwt_device_claim: str | None = None
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_leeway_s: float = 0.0
    # `[[bridge]]` tables (TOML only): links to other MQTT / AMQP brokers run inside the gateway
    # (docs/bridges.md), parsed by bridge.config.parse_bridges when the file is read
    bridge: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        check_choices(
            self,
            (
                ("mode", MODES),
                ("flush", FLUSH_POLICIES),
                ("replication", REPLICATION_POLICIES),
                ("event_loop", EVENT_LOOPS),
                ("log_level", LOG_LEVELS),
                ("mqtt_queue_full_policy", MQTT_QUEUE_FULL_POLICIES),
            ),
        )
        check_strings(self, ("data_dir", "host"))
        check_strings(self, ("advertise_host",), optional=True)
        for name in (*PORT_FIELDS, "store_port"):
            check_int(name, getattr(self, name), 0, 65535)
        check_int("mqtt_max_keep_alive", self.mqtt_max_keep_alive, 0, 65535)
        check_int("sys_interval", self.sys_interval, 0, 86400)
        if not isinstance(self.mqtt_ws_path, str) or not self.mqtt_ws_path.startswith("/"):
            raise ConfigError(f"mqtt_ws_path must start with '/', got {self.mqtt_ws_path!r}")
        parse_disk_free_limit(self.disk_free_limit)
        parse_duration_ms("tombstone_retention", self.tombstone_retention)
        parse_tier_after(self.tier_after)
        trace_retention_ms(self.trace_retention)
        if not isinstance(self.otlp_endpoint, str) or (
            self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://"))
        ):
            raise ConfigError(f"otlp_endpoint must be an http(s) URL, got {self.otlp_endpoint!r}")
        if self.otlp_endpoint and trace_retention_ms(self.trace_retention) == 0:
            raise ConfigError("otlp_endpoint exports message trace events: it needs trace_retention on")
        if not isinstance(self.tier_s3_endpoint, str) or not isinstance(self.tier_bucket, str):
            raise ConfigError("tier_s3_endpoint and tier_bucket must be strings")
        if self.tier_s3_endpoint and not self.tier_bucket:
            raise ConfigError("tier_s3_endpoint needs tier_bucket (the bucket segments are tiered to)")
        if self.tier_s3_endpoint and not self.tier_s3_endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"tier_s3_endpoint must be an http(s) URL, got {self.tier_s3_endpoint!r}")
        for name in ("mqtt_max_client_id_length", "mqtt_max_topic_length"):
            check_int(name, getattr(self, name), 1, 65535)
        check_int("mqtt_max_topic_levels", self.mqtt_max_topic_levels, 1, 65535)
        for name in (
            "mqtt_max_retained_messages",
            "mqtt_max_retained_bytes",
            "mqtt_max_queued_messages",
            "mqtt_max_queued_bytes",
            "amqp_max_queues_per_vhost",
            "amqp_max_queues_per_user",
            "max_outbound_bytes_per_connection",
            "metrics_max_objects",
        ):
            check_int(name, getattr(self, name), 0, None)
        check_int("amqp_channel_max", self.amqp_channel_max, 1, 65535)
        check_int("amqp_frame_max", self.amqp_frame_max, 4096, 1 << 30)
        check_int("cloudevents_dedup_window_s", self.cloudevents_dedup_window_s, 0, 30 * 86400)
        for name in (
            "max_connections",
            "max_connections_per_user",
            "fd_reserve",
            "connection_burst",
            "publish_rate_bytes",
        ):
            check_int(name, getattr(self, name), 0, None)
        for name in ("max_connection_rate", "publish_rate_msgs", "publish_burst"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1e12:
                raise ConfigError(f"{name} must be a number >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.publish_burst <= 0:
            raise ConfigError(f"publish_burst must be > 0 seconds, got {self.publish_burst:g}")
        check_file_paths(
            self, ("tls_cert", "tls_key", "tls_client_ca", "cluster_secret_file", "cluster_tls_ca")
        )
        check_needs(self, ("tls_key", "tls_client_ca", "tls_required", "tls_require_client_cert"), "tls_cert")
        jwt_strings = ("jwt_jwks", "jwt_public_key", "jwt_secret_file", "jwt_device_claim", "jwt_audience")
        check_strings(self, (*jwt_strings, "jwt_issuer"), optional=True)
        if not isinstance(self.jwt_user_claim, str) or not self.jwt_user_claim:
            raise ConfigError(f"jwt_user_claim must name a claim, got {self.jwt_user_claim!r}")
        lw = self.jwt_leeway_s
        if isinstance(lw, bool) or not isinstance(lw, int | float) or not 0 <= lw <= 3600:
            raise ConfigError(f"jwt_leeway_s must be a number of seconds in [0, 3600], got {lw!r}")
        object.__setattr__(self, "jwt_leeway_s", float(lw))
        if (self.jwt_jwks or self.jwt_public_key or self.jwt_secret_file) and not self.auth:
            raise ConfigError(
                "jwt_jwks, jwt_public_key and jwt_secret_file need auth (device tokens are logins)"
            )
        if self.tls_require_client_cert is True and self.tls_client_ca is None:
            raise ConfigError("tls_require_client_cert needs tls_client_ca (to verify certificates with)")
        check_int("max_body_size", self.max_body_size, 1, MAX_BODY_LIMIT)
        check_int("amqp_max_body_size", self.amqp_max_body_size, 1, MAX_BODY_LIMIT)
        check_int("default_queues", self.default_queues, 1, 1024)
        check_int("segment_size_mib", self.segment_size_mib, 1, 1024)
        check_int("transaction_timeout_ms", self.transaction_timeout_ms, 1, None)
        check_int("transaction_check_interval_ms", self.transaction_check_interval_ms, 1, None)
        check_bools(
            self,
            (
                "auto_create_topics",
                "auth",
                "allow_anonymous",
                "grpc_plain",
                "tls_required",
                "tls_require_client_cert",
                "mqtt_cert_identity",
                "mqtt_ws",
                "metrics_per_object",
                "client_events",
            ),
        )
        for name in ("namesrv", "store_name", "proxy_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        check_int("min_insync", self.min_insync, 1, 16)
        for name in ("store_group", "controller"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        if self.store_group is not None and not _NODE_NAME.match(self.store_group):
            raise ConfigError(f"store_group must be letters, digits, '_', '.', '-', got {self.store_group!r}")
        if self.store_group is not None and not self.controller:
            raise ConfigError("store_group needs controller (the etcd client URL(s) of the replica groups)")
        if self.store_name is not None and not _NODE_NAME.match(self.store_name):
            raise ConfigError(f"store_name must be letters, digits, '_', '.', '-', got {self.store_name!r}")
        if not isinstance(self.cluster_name, str) or not _NODE_NAME.match(self.cluster_name):
            raise ConfigError(
                f"cluster_name must be letters, digits, '_', '.', '-', got {self.cluster_name!r}"
            )
        object.__setattr__(self, "workers", parse_workers(self.workers))
        if self.mode == "cluster" and not self.namesrv:
            raise ConfigError("mode cluster needs namesrv (the name server address, host:port)")
        check_leases(self, ("lease_period_s", "lease_expiry_s", "route_refresh_s"))
        d = self.drain_timeout_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d <= 3600:
            raise ConfigError(f"drain_timeout_s must be a number of seconds in [0, 3600], got {d!r}")
        object.__setattr__(self, "drain_timeout_s", float(d))
        if not isinstance(self.protocols, tuple):
            if not isinstance(self.protocols, str | list):
                raise ConfigError(f"protocols must be a comma list of names, got {self.protocols!r}")
            object.__setattr__(self, "protocols", parse_protocols(self.protocols))
        else:
            parse_protocols(self.protocols)

    @property
    def largest_body_size(self) -> int:
        """The largest body any listener accepts (the store's and a store node's limit)."""
        return max(self.max_body_size, self.amqp_max_body_size)

    @property
    def segment_size(self) -> int:
        """Commit log segment size in bytes: `segment_size_mib`, at least the largest body + 1 MiB."""
        return max(self.segment_size_mib * MIB, -(-(self.largest_body_size + MIB) // MIB) * MIB)

    def port(self, protocol: str) -> int:
        return getattr(self, f"{protocol}_port")


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE_UNITS.update({"k": 1024, "kib": 1024, "m": MIB, "mib": MIB, "g": 1024 * MIB, "gib": 1024 * MIB})
_SIZE_UNITS.update({"t": 1024**4, "tib": 1024**4})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(name: str, text: str) -> int:
    """A duration setting ("24h", "30m", "90s", "500ms", "2d" or plain milliseconds) in milliseconds."""
    t = text.strip().lower()
    for unit in ("ms", "s", "m", "h", "d"):
        if t.endswith(unit) and t[: -len(unit)].strip().isdigit():
            return int(t[: -len(unit)]) * _DURATION_UNITS[unit]
    if t.isdigit():
        return int(t)
    raise ConfigError(f"{name} must be a duration like '24h', '30m', '90s' or '500ms', got {text!r}")


def trace_retention_ms(text: str) -> int:
    """`trace_retention` in ms; 0 when tracing is off ("0" or "off")."""
    if isinstance(text, str) and text.strip().lower() == "off":
        return 0
    return parse_duration_ms("trace_retention", str(text))


def parse_tier_after(text: str) -> tuple[int, int | None]:
    """`tier_after` -> (age in ms, local bytes or None): a size ("10GiB", "512MiB") or a duration
    ("24h", "30m", "90s"); with a size, the age is not used."""
    t = text.strip().lower() if isinstance(text, str) else ""
    m = _SIZE.match(t)
    if m is not None and m.group(2).endswith("b") and m.group(2) in _SIZE_UNITS:
        return 0, int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    try:
        return parse_duration_ms("tier_after", t), None
    except ConfigError:
        raise ConfigError(
            f"tier_after must be an age (24h, 30m, 90s) or a size (10GiB, 512MiB), got {text!r}"
        ) from None


def parse_disk_free_limit(text: str) -> tuple[int, float]:
    """`disk_free_limit` -> (bytes, fraction of the volume): a comma list of sizes ("1GiB", "500MiB",
    "2GB", "0") and percentages ("5%"); the effective limit is the largest size or percentage, and
    the smaller of the two when both are given (store/diskspace.py)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"disk_free_limit must be sizes or percentages like '1GiB,5%', got {text!r}")
    size, ratio = 0, 0.0
    for item in text.lower().split(","):
        item = item.strip()
        try:
            if item.endswith("%"):
                pct = float(item[:-1])
                if not 0 <= pct < 100:
                    raise ValueError
                ratio = max(ratio, pct / 100)
                continue
            m = _SIZE.match(item)
            if m is None or m.group(2) not in _SIZE_UNITS:
                raise ValueError
            size = max(size, int(float(m.group(1)) * _SIZE_UNITS[m.group(2)]))
        except ValueError:
            raise ConfigError(
                f"disk_free_limit: {item!r} is neither a size (1GiB, 500MiB) nor a percentage below 100 (5%)"
            ) from None
    return size, ratio


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    h = host.strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to anything


def check_exposure(s: Settings) -> None:
    """Secure by default: ConfigError when the listeners bind a non-loopback address with
    authentication off, unless `allow_anonymous` says so."""
    if not s.auth and not s.allow_anonymous and not is_loopback(s.host):
        raise ConfigError(
            f"refusing to start: the listeners would bind {s.host} (not loopback) with authentication "
            "off; start with --auth (docs/security.md), or --allow-anonymous to let anyone in"
        )


MAX_WORKERS = 256


def parse_workers(value: Any) -> int:
    """`workers`: an integer in [1, MAX_WORKERS] or "auto" (the cores this process may run on)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
    try:
        n = int(value) if isinstance(value, str) else value
    except ValueError:
        n = None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f'workers must be an integer in [1, {MAX_WORKERS}] or "auto", got {value!r}')
    return n


TOML_ONLY = ("bridge",)  # tables, not settings: no flag, no environment variable
FIELDS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in TOML_ONLY)
_TYPES = field_types(Settings)
# Environment variables read by load(): GATEWAY_DATA_DIR, GATEWAY_HOST, GATEWAY_GRPC_PORT, ...
ENV_VARS = {ENV_PREFIX + name.upper(): name for name in FIELDS}


def _from_toml(path: str | Path) -> dict[str, Any]:
    data = read_toml(path, (*FIELDS, *TOML_ONLY))
    if "bridge" in data:
        from bridge.config import parse_bridges

        data["bridge"] = parse_bridges(data["bridge"])
    for key in ("drain_timeout_s", "lease_period_s", "lease_expiry_s", "route_refresh_s"):
        if isinstance(data.get(key), int) and not isinstance(data[key], bool):
            data[key] = float(data[key])
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    # An empty variable counts as unset, so `GATEWAY_HOST= gateway start` falls back to lower layers.
    values = from_env(env, ENV_VARS, _TYPES)
    if "protocols" in values:
        values["protocols"] = parse_protocols(values["protocols"])
    return values


def load(
    argv_overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    toml_path: str | Path | None = None,
) -> Settings:
    """Build Settings from defaults, then the TOML file, then env vars, then flag overrides.

    ``argv_overrides`` maps field names to values; ``None`` values mean "flag not given".
    ``env`` is usually ``os.environ``; only ``GATEWAY_*`` variables are read.
    """
    values: dict[str, Any] = {}
    if toml_path is not None:
        values.update(_from_toml(toml_path))
    if env is not None:
        values.update(_from_env(env))
    overlay(values, argv_overrides, FIELDS)
    return Settings(**values)
