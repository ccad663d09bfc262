"""What each part of a gateway process is configured with, derived from its Settings: the
embedded store's StoreConfig (LOCAL mode, a `gateway store` node, the `--workers` store process),
CLUSTER mode's secret, TLS client context and ProxyConfig, and the listeners' Limiter."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from gateway.config import Settings

if TYPE_CHECKING:
    from adapters.limits import Limiter
    from cluster.proxy import ProxyConfig
    from remoting.cluster_auth import ClusterAuth
    from store import StoreConfig


def store_config(s: Settings) -> StoreConfig:
    """The embedded store's settings (LOCAL mode, and a `gateway store` node)."""
    from gateway.config import parse_disk_free_limit, parse_duration_ms, parse_tier_after
    from store import StoreConfig

    free_bytes, free_ratio = parse_disk_free_limit(s.disk_free_limit)
    tier_after_ms, tier_after_bytes = parse_tier_after(s.tier_after)

    return StoreConfig(
        data_dir=s.data_dir,
        flush=s.flush,
        segment_size=s.segment_size,
        default_queues=s.default_queues,
        auto_create_topics=False,  # the processor decides (settings.auto_create_topics)
        max_message_size=max(s.largest_body_size, StoreConfig().max_message_size),
        transaction_timeout_ms=s.transaction_timeout_ms,
        transaction_check_interval_ms=s.transaction_check_interval_ms,
        disk_free_limit_bytes=free_bytes,
        disk_free_limit_ratio=free_ratio,
        tombstone_retention_ms=parse_duration_ms("tombstone_retention", s.tombstone_retention),
        tier_endpoint=s.tier_s3_endpoint,
        tier_bucket=s.tier_bucket,
        tier_after_ms=tier_after_ms,
        tier_after_bytes=tier_after_bytes,
    )


def cluster_auth(s: Settings) -> ClusterAuth | None:
    """CLUSTER mode's secret (`cluster_secret_file`, read now), or None; ClusterSecretError if unusable."""
    from remoting.cluster_auth import ClusterAuth

    return None if s.cluster_secret_file is None else ClusterAuth.from_file(s.cluster_secret_file)


def cluster_tls(s: Settings) -> ssl.SSLContext | None:
    """The client context of CLUSTER mode's own connections (`cluster_tls`, `cluster_tls_ca`,
    presenting `tls_cert`), or None (in clear); TlsError when a file does not load."""
    if not (s.cluster_tls or s.cluster_tls_ca):
        return None
    from runtime.tls import client_context

    return client_context(s.cluster_tls_ca, s.tls_cert, s.tls_key)


def proxy_config(s: Settings, auth: ClusterAuth | None = None) -> ProxyConfig:
    """CLUSTER mode: how this proxy finds its stores and registers itself (`auth`: the cluster
    secret its connections prove; TLS as `cluster_tls` says)."""
    from cluster.proxy import ProxyConfig

    assert s.namesrv
    return ProxyConfig(
        namesrv=s.namesrv,
        cluster_name=s.cluster_name,
        route_refresh_s=s.route_refresh_s,
        lease_period_s=s.lease_period_s,
        lease_expiry_s=s.lease_expiry_s,
        proxy_name=s.proxy_name,
        auth=auth,
        tls=cluster_tls(s),
    )


def limiter_of(s: Settings) -> Limiter:
    """The process's connection and publish-rate limits (docs/limits.md)."""
    from adapters.limits import Limiter, LimitSettings

    return Limiter(
        LimitSettings(
            max_connections=s.max_connections,
            max_connections_per_user=s.max_connections_per_user,
            max_connection_rate=s.max_connection_rate,
            connection_burst=s.connection_burst,
            publish_rate_msgs=s.publish_rate_msgs,
            publish_rate_bytes=s.publish_rate_bytes,
            publish_burst=s.publish_burst,
        )
    )
