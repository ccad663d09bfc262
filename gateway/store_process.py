"""`gateway store`: the process around a CLUSTER mode store node (cluster/store_node.py). Opens
the store on `data_dir`, serves it until SIGTERM/SIGINT, then unregisters, stops accepting,
lets in-flight requests finish (up to `drain_timeout_s`), closes (flushes) the store and exits 0;
exits 1 when the store cannot be opened or the port bound, 2 when `cluster_secret_file` is set but
unusable or a TLS file does not load (docs/security.md, "Closed cluster": with `--tls-cert` the
node's port serves TLS only; with `--cluster-tls` its own connections speak TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from cluster.store_node import StoreNode, StoreNodeConfig, default_node_name
from gateway import collector as gc_collector
from gateway.config import Settings
from gateway.part_configs import cluster_auth, cluster_tls, store_config
from gateway.server import SHUTDOWN_SIGNALS, shutdown_signals_blocked
from remoting.cluster_auth import ClusterAuth, ClusterSecretError
from runtime.tls import ServerTls, TlsError, TlsFiles
from store import Store, StoreConfig, StoreError

log = logging.getLogger("gateway.store")


def _node_store_config(settings: Settings) -> StoreConfig:
    """The node's store settings: its tiered segments go under its own name in the bucket (the
    nodes of a cluster, replicas included, may share one bucket)."""
    config = store_config(settings)
    config.tier_prefix = f"{settings.store_name or default_node_name(settings.store_port)}/"
    return config


def node_config(
    settings: Settings,
    auth: ClusterAuth | None = None,
    tls: ssl.SSLContext | None = None,
    cluster_tls: ssl.SSLContext | None = None,
) -> StoreNodeConfig:
    """The store node's own settings, taken from the gateway's (`auth`: the cluster secret; `tls`
    the server context of its port, `cluster_tls` the client context of its own connections)."""
    s = settings
    return StoreNodeConfig(
        name=s.store_name or default_node_name(s.store_port),
        host=s.host,
        port=s.store_port,
        advertise_host=s.advertise_host,
        namesrv=s.namesrv,
        cluster_name=s.cluster_name,
        lease_period_s=s.lease_period_s,
        lease_expiry_s=s.lease_expiry_s,
        max_body_size=s.largest_body_size,
        group=s.store_group,
        replication=s.replication,
        min_insync=s.min_insync if s.replication == "sync" else 1,
        auth=auth,
        tls=tls,
        cluster_tls=cluster_tls,
    )


def server_tls(s: Settings) -> ssl.SSLContext | None:
    """The node port's server context (`tls_cert`, `tls_key`, `tls_client_ca`,
    `tls_require_client_cert`), or None (in clear); TlsError when a file does not load."""
    if s.tls_cert is None:
        return None
    files = TlsFiles(s.tls_cert, s.tls_key, s.tls_client_ca, s.tls_require_client_cert)
    return ServerTls(files, logging.getLogger("gateway.tls")).context()


async def serve(settings: Settings) -> int:
    """Run a store node until SIGTERM/SIGINT; the exit code (0 clean, 1 cannot start, 2 bad secret)."""
    try:
        auth = cluster_auth(settings)
        tls = server_tls(settings)
        client_tls = cluster_tls(settings)
    except (ClusterSecretError, TlsError) as e:
        log.error("%s", e)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        with shutdown_signals_blocked():
            store = await Store.open(_node_store_config(settings))
    except (StoreError, OSError) as e:
        log.error("cannot open the store at %s: %s", settings.data_dir, e)
        return 1
    store.preallocate()  # a fresh store's first append need not wait for its segment
    node = StoreNode(node_config(settings, auth, tls, client_tls), store)
    try:
        await node.start()
    except OSError as e:
        log.error("store node cannot listen on %s: %s", node.address, e.strerror or e)
        await store.close()
        return 1
    log.info("store node %s listening on %s (data %s)", node.name, node.address, settings.data_dir)
    if auth is not None:
        log.info("closed cluster: every connection must prove the cluster secret first")
    if tls is not None:
        log.info("store node port serves TLS only (certificate %s)", settings.tls_cert)
    member = None
    if settings.store_group:
        from cluster.controller import EtcdController
        from cluster.group import GroupMember

        assert settings.controller
        controller = EtcdController(settings.controller, cluster=settings.cluster_name, lease_ttl_s=5)
        member = GroupMember(node, controller, settings.store_group)
        await member.start()
    collector = gc_collector.take_over()
    log.info("store node ready")
    await stop.wait()
    log.info("store node stopping")
    t0 = time.monotonic()
    collector.stop()
    if member is not None:
        await member.stop()  # a primary resigns: a replica takes over at once
        await member.controller.close()
    await node.stop(settings.drain_timeout_s)
    await store.close()
    log.info("store closed; store node stopped in %.2f s", time.monotonic() - t0)
    for sig in SHUTDOWN_SIGNALS:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
    return 0
