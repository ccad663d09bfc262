"""The flag tables of `gateway start` and `gateway store`: Settings field -> argparse options.

Every flag is also a GATEWAY_* environment variable and a TOML key (gateway/config.py)."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.config import FLUSH_POLICIES, MODES, MQTT_QUEUE_FULL_POLICIES, parse_protocols
from runtime.settings import SHARED_FLAGS

# Settings fields that `gateway start` takes as flags (all of them), with argparse types.
START_FLAGS: dict[str, dict[str, Any]] = {
    "data_dir": {"metavar": "DIR", "help": "store directory (default ./data)"},
    "host": {"metavar": "ADDR", "help": "address every listener binds (default 127.0.0.1)"},
    "flush": {"choices": FLUSH_POLICIES, "help": "store flush policy (default sync)"},
    "grpc_port": {"type": int, "metavar": "N", "help": "RocketMQ 5 gRPC port (default 8081; 0 = ephemeral)"},
    "remoting_port": {"type": int, "metavar": "N", "help": "RocketMQ 4.x remoting port (default 8080)"},
    "http_port": {"type": int, "metavar": "N", "help": "HTTP port: health, metrics, admin (default 8082)"},
    "mqtt_port": {"type": int, "metavar": "N", "help": "MQTT port (default 1883)"},
    "amqp_port": {"type": int, "metavar": "N", "help": "AMQP 0-9-1 port (default 5672)"},
    "protocols": {
        "type": parse_protocols,
        "metavar": "LIST",
        "help": "comma list of listeners to enable (default grpc,remoting,mqtt,amqp,http)",
    },
    "advertise_host": {"metavar": "ADDR", "help": "host clients are told to connect to (default: --host)"},
    "auto_create_topics": {
        "action": argparse.BooleanOptionalAction,
        "help": "create unknown topics on first send (default off)",
    },
    "max_body_size": {"type": int, "metavar": "BYTES", "help": "largest message body (default 4 MiB)"},
    "default_queues": {"type": int, "metavar": "N", "help": "queues of a new topic (default 8)"},
    "segment_size_mib": {
        "type": int,
        "metavar": "MIB",
        "help": "commit log segment size (default 128; grown to hold the largest body)",
    },
    "transaction_timeout_ms": {"type": int, "metavar": "MS", "help": "first transaction check (6000)"},
    "transaction_check_interval_ms": {"type": int, "metavar": "MS", "help": "between checks (5000)"},
    "drain_timeout_s": {"type": float, "metavar": "S", "help": "shutdown drain time (default 5)"},
    "event_loop": SHARED_FLAGS["event_loop"],
    "log_level": SHARED_FLAGS["log_level"],
    "tls_cert": {"metavar": "PEM", "help": "PEM certificate chain: enables TLS listeners"},
    "tls_key": SHARED_FLAGS["tls_key"],
    "mqtt_tls_port": {"type": int, "metavar": "N", "help": "MQTT over TLS port (default 8883)"},
    "amqp_tls_port": {"type": int, "metavar": "N", "help": "AMQP over TLS port (default 5671)"},
    "https_port": {"type": int, "metavar": "N", "help": "HTTPS port, with --tls-cert (default 8443)"},
    "grpc_plain": {
        "action": argparse.BooleanOptionalAction,
        "help": "with --tls-cert, keep the gRPC port in clear (default: TLS only)",
    },
    "tls_required": {
        "action": argparse.BooleanOptionalAction,
        "help": "remoting port: refuse clients that do not start TLS (default: both served)",
    },
    "tls_client_ca": SHARED_FLAGS["tls_client_ca"],
    "tls_require_client_cert": {
        "action": argparse.BooleanOptionalAction,
        "help": "refuse TLS clients without a certificate signed by --tls-client-ca",
    },
    "mqtt_cert_identity": {
        "action": argparse.BooleanOptionalAction,
        "help": "MQTT over TLS: the client certificate's CN is the user (no password)",
    },
    "mqtt_ws": {
        "action": argparse.BooleanOptionalAction,
        "help": "MQTT over WebSocket on --mqtt-ws-port, and --mqtt-wss-port with --tls-cert (default on)",
    },
    "mqtt_ws_port": {"type": int, "metavar": "N", "help": "MQTT over WebSocket port (default 8083)"},
    "mqtt_wss_port": {"type": int, "metavar": "N", "help": "MQTT over secure WebSocket port (default 8084)"},
    "mqtt_ws_path": {"metavar": "PATH", "help": "MQTT over WebSocket request path (default /mqtt)"},
    "amqp_mqtt_exchange": {
        "metavar": "NAME",
        "help": "AMQP exchange of vhost / that MQTT topics map to (default amq.topic; '' = none)",
    },
    "amqp_max_body_size": {
        "type": int,
        "metavar": "BYTES",
        "help": "largest AMQP message body (default 16 MiB, as RabbitMQ 4)",
    },
    "mqtt_max_keep_alive": {"type": int, "metavar": "S", "help": "longest MQTT keep-alive allowed (0 = any)"},
    "sys_interval": {
        "type": int,
        "metavar": "S",
        "help": "seconds between MQTT $SYS/broker/... updates (10; 0 = off)",
    },
    "client_events": {
        "action": argparse.BooleanOptionalAction,
        "help": "client connect/disconnect/subscribe/auth-failure events: $events/#, amq.rabbitmq.event",
    },
    "tombstone_retention": {
        "metavar": "DURATION",
        "help": "compacted topics: keep a deleted key's tombstone this long (24h; 30m, 90s, 500ms)",
    },
    "trace_retention": {
        "metavar": "DURATION",
        "help": "keep message trace records this long (24h; 30m, 90s; 0 or off: no tracing)",
    },
    "otlp_endpoint": {
        "metavar": "URL",
        "help": "send message trace events as OpenTelemetry spans to this OTLP/HTTP endpoint (off)",
    },
    "tier_s3_endpoint": {
        "metavar": "URL",
        "help": "tier closed commit log segments to this S3-compatible endpoint (credentials: AWS_* vars)",
    },
    "tier_bucket": {"metavar": "NAME", "help": "bucket of tiered segments (needed with --tier-s3-endpoint)"},
    "tier_after": {
        "metavar": "AGE|SIZE",
        "help": "tier segments older than an age (24h; 30m, 90s) or beyond a local size (10GiB, 512MiB)",
    },
    "disk_free_limit": {
        "metavar": "SIZES",
        "help": "refuse publishes below this free disk: a size, a %% of the volume, or both (the smaller)",
    },
    "mqtt_max_client_id_length": {"type": int, "metavar": "N", "help": "longest MQTT client id (65535)"},
    "mqtt_max_topic_length": {"type": int, "metavar": "N", "help": "longest MQTT topic, bytes (65535)"},
    "mqtt_max_topic_levels": {"type": int, "metavar": "N", "help": "most MQTT topic levels (128)"},
    "mqtt_max_retained_messages": {"type": int, "metavar": "N", "help": "retained messages cap (0 = none)"},
    "mqtt_max_retained_bytes": {"type": int, "metavar": "BYTES", "help": "retained bytes cap (0 = none)"},
    "mqtt_max_queued_messages": {
        "type": int,
        "metavar": "N",
        "help": "offline MQTT session backlog, cut at reconnect (default 0: no cap)",
    },
    "mqtt_max_queued_bytes": {
        "type": int,
        "metavar": "BYTES",
        "help": "offline MQTT session backlog, payload bytes (default 0: no cap)",
    },
    "mqtt_queue_full_policy": {
        "choices": MQTT_QUEUE_FULL_POLICIES,
        "help": "offline MQTT backlog over its cap: drop-oldest (default) or refuse-new (keep the oldest)",
    },
    "amqp_channel_max": {"type": int, "metavar": "N", "help": "AMQP channel_max offered (default 2047)"},
    "amqp_frame_max": {"type": int, "metavar": "BYTES", "help": "AMQP frame_max offered (default 131072)"},
    "amqp_max_queues_per_vhost": {"type": int, "metavar": "N", "help": "AMQP queues per vhost (0 = no cap)"},
    "amqp_max_queues_per_user": {
        "type": int,
        "metavar": "N",
        "help": "AMQP queues one user may declare, over all vhosts (0 = no cap)",
    },
    "cloudevents_dedup_window_s": {
        "type": int,
        "metavar": "S",
        "help": "CloudEvents ingest drops a source+id seen within S seconds (default 0: off)",
    },
    "max_connections": {"type": int, "metavar": "N", "help": "connections per listener (100000; 0 = any)"},
    "max_connections_per_user": {"type": int, "metavar": "N", "help": "connections per user (0 = any)"},
    "fd_reserve": {
        "type": int,
        "metavar": "N",
        "help": "descriptors kept from connections for the store (512; at most a quarter of the limit)",
    },
    "max_connection_rate": {
        "type": float,
        "metavar": "PER_S",
        "help": "new connections per second per source address (default 0: off)",
    },
    "connection_burst": {"type": int, "metavar": "N", "help": "connections an address may open at once"},
    "publish_rate_msgs": {"type": float, "metavar": "PER_S", "help": "messages/s per client and per user"},
    "publish_rate_bytes": {"type": int, "metavar": "BYTES", "help": "bytes/s per client and per user"},
    "publish_burst": {"type": float, "metavar": "S", "help": "seconds of publish rate sent at once (1)"},
    "metrics_per_object": {
        "action": argparse.BooleanOptionalAction,
        "help": "per-topic and per-group series in /metrics (default on; always in /metrics/per-object)",
    },
    "metrics_max_objects": {
        "type": int,
        "metavar": "N",
        "help": "topics and groups (each) in the per-object metrics, the busiest first (1000)",
    },
    "max_outbound_bytes_per_connection": {
        "type": int,
        "metavar": "BYTES",
        "help": "unsent bytes per MQTT/AMQP connection above which its deliveries pause (4 MiB; 0 = off)",
    },
    "workers": {
        "metavar": "N",
        "help": "LOCAL mode: N proxy processes on the same ports over one store process; auto: one per core",
    },
    "mode": {
        "choices": MODES,
        "help": "local: embedded store; cluster: proxy over store nodes (default local)",
    },
    "namesrv": {"metavar": "HOST:PORT", "help": "name server(s), ';'-separated (cluster mode)"},
    "cluster_name": {
        "metavar": "NAME",
        "help": "store cluster to use / register in (default DefaultCluster)",
    },
    "proxy_name": {"metavar": "NAME", "help": "name this proxy registers under (default proxy-<host>-<pid>)"},
    "lease_period_s": {"type": float, "metavar": "S", "help": "name server re-registration period (30)"},
    "lease_expiry_s": {"type": float, "metavar": "S", "help": "registration expiry without renewal (120)"},
    "route_refresh_s": {"type": float, "metavar": "S", "help": "store node list refresh period (5)"},
    "cluster_secret_file": {
        "metavar": "FILE",
        "help": "cluster mode: prove this secret to name servers and stores (docs/security.md)",
    },
    "cluster_tls": {
        "action": argparse.BooleanOptionalAction,
        "help": "cluster mode: speak TLS to name servers and store nodes (default off)",
    },
    "cluster_tls_ca": {
        "metavar": "PEM",
        "help": "CA to verify name servers and store nodes with (implies --cluster-tls; default: system)",
    },
    "auth": {
        "action": argparse.BooleanOptionalAction,
        "help": "authenticate every client and apply the ACL rules (default off; docs/security.md)",
    },
    "allow_anonymous": {
        "action": argparse.BooleanOptionalAction,
        "help": "admit clients without credentials: with --auth as the ACL's anonymous principal, "
        "without it on a non-loopback --host (default: refused)",
    },
    "jwt_jwks": {"metavar": "FILE", "help": "device tokens: verify JWTs (RS256/ES256) with this JWKS file"},
    "jwt_public_key": {
        "metavar": "PEM",
        "help": "device tokens: verify JWTs with this RSA or P-256 public key",
    },
    "jwt_secret_file": {
        "metavar": "FILE",
        "help": "device tokens: verify HS256 JWTs with this secret (mode 600)",
    },
    "jwt_user_claim": {"metavar": "CLAIM", "help": "the JWT claim naming the user (default sub)"},
    "jwt_device_claim": {"metavar": "CLAIM", "help": "the JWT claim that %%d stands for in ACL rules"},
    "jwt_audience": {"metavar": "AUD", "help": "refuse JWTs whose aud does not include this"},
    "jwt_issuer": {"metavar": "ISS", "help": "refuse JWTs whose iss is not this"},
    "jwt_leeway_s": {"type": float, "metavar": "S", "help": "clock skew allowed on exp and nbf (default 0)"},
}

# `gateway store`: flag -> Settings field (every one also a GATEWAY_* env var and a TOML key).
STORE_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "data_dir": ("data_dir", START_FLAGS["data_dir"]),
    "host": ("host", START_FLAGS["host"]),
    "port": ("store_port", {"type": int, "metavar": "N", "help": "store protocol port (default 10911)"}),
    "name": (
        "store_name",
        {"metavar": "NAME", "help": "node name in the cluster (default store-<host>-<port>)"},
    ),
    "namesrv": ("namesrv", {"metavar": "HOST:PORT", "help": "name server(s) to register with"}),
    "cluster_name": ("cluster_name", START_FLAGS["cluster_name"]),
    "advertise_host": ("advertise_host", {"metavar": "ADDR", "help": "host proxies connect to"}),
    "flush": ("flush", START_FLAGS["flush"]),
    "default_queues": ("default_queues", START_FLAGS["default_queues"]),
    "max_body_size": ("max_body_size", START_FLAGS["max_body_size"]),
    "segment_size_mib": ("segment_size_mib", START_FLAGS["segment_size_mib"]),
    "disk_free_limit": ("disk_free_limit", START_FLAGS["disk_free_limit"]),
    "tombstone_retention": ("tombstone_retention", START_FLAGS["tombstone_retention"]),
    "tier_s3_endpoint": ("tier_s3_endpoint", START_FLAGS["tier_s3_endpoint"]),
    "tier_bucket": ("tier_bucket", START_FLAGS["tier_bucket"]),
    "tier_after": ("tier_after", START_FLAGS["tier_after"]),
    "transaction_timeout_ms": ("transaction_timeout_ms", START_FLAGS["transaction_timeout_ms"]),
    "transaction_check_interval_ms": (
        "transaction_check_interval_ms",
        START_FLAGS["transaction_check_interval_ms"],
    ),
    "lease_period_s": ("lease_period_s", START_FLAGS["lease_period_s"]),
    "lease_expiry_s": ("lease_expiry_s", START_FLAGS["lease_expiry_s"]),
    "cluster_secret_file": (
        "cluster_secret_file",
        {"metavar": "FILE", "help": "every connection to this node, and its own, prove this secret first"},
    ),
    "tls_cert": (
        "tls_cert",
        {"metavar": "PEM", "help": "PEM certificate chain: the node's port serves TLS only"},
    ),
    "tls_key": ("tls_key", START_FLAGS["tls_key"]),
    "tls_client_ca": ("tls_client_ca", START_FLAGS["tls_client_ca"]),
    "tls_require_client_cert": ("tls_require_client_cert", START_FLAGS["tls_require_client_cert"]),
    "cluster_tls": ("cluster_tls", START_FLAGS["cluster_tls"]),
    "cluster_tls_ca": ("cluster_tls_ca", START_FLAGS["cluster_tls_ca"]),
    "group": (
        "store_group",
        {"metavar": "NAME", "help": "replica group of this node (needs --controller; docs/cluster.md)"},
    ),
    "controller": (
        "controller",
        {"metavar": "URLS", "help": "etcd client URL(s) of the replica groups' controller, comma separated"},
    ),
    "replication": (
        "replication",
        {
            "choices": ("sync", "async"),
            "help": "acknowledge a send when --min-insync nodes hold it (sync, "
            "default) or when the primary does (async)",
        },
    ),
    "min_insync": (
        "min_insync",
        {
            "type": int,
            "metavar": "N",
            "help": "sync: nodes, the primary included, that must hold a send (default 2)",
        },
    ),
    "drain_timeout_s": ("drain_timeout_s", START_FLAGS["drain_timeout_s"]),
    "event_loop": ("event_loop", START_FLAGS["event_loop"]),
    "log_level": ("log_level", START_FLAGS["log_level"]),
}
