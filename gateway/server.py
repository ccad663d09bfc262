"""The gateway process: one MessagingProcessor and one listener per enabled protocol, all in one
event loop, over an embedded store (LOCAL mode) or over store nodes found through the name server
(CLUSTER mode, `--mode cluster`: the cluster package, docs/cluster.md).

Start: open the store, start the processor, start each listener (one log line each), log
``gateway ready``. Stop (SIGTERM/SIGINT): every listener stops accepting at once and drains
in-flight requests for up to ``drain_timeout_s``, then the processor and the store close.

TLS (`--tls-cert`): one `runtime.tls.ServerTls` gives every TLS listener its context (MQTT and AMQP
on their TLS ports, HTTPS, gRPC on its port, remoting in permissive mode on its port); SIGHUP
reloads the certificate for new connections (docs/security.md, "TLS")."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from fastapi import APIRouter

from adapters.base import Adapter
from gateway import collector as gc_collector
from gateway.config import PROTOCOLS, Settings, trace_retention_ms
from gateway.part_configs import cluster_auth, limiter_of, proxy_config, store_config
from runtime.oslimits import ProcessLimits
from runtime.tls import ServerTls, TlsError, TlsFiles

if TYPE_CHECKING:
    from cluster.remote_store import ClusterStoreClient
    from gateway.workers import ClaimsClient, WorkerLink
    from messaging_processor import LocalStoreClient
    from messaging_processor.security.jwt_tokens import JwtVerifier

log = logging.getLogger("gateway")

MIB = 1024 * 1024
GRPC_MIN_INBOUND = 130 * MIB


SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def shutdown_signals_blocked() -> Iterator[None]:
    """Block SIGTERM/SIGINT in this thread while the store starts its helper process (the fsync
    helper), which inherits the mask: a Ctrl-C or a `kill` of the whole process group (terminal,
    systemd, `timeout`) then reaches only the gateway, which stops the helper itself when it closes
    the store. Signals arriving meanwhile stay pending and are handled right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class StartupError(Exception):
    """The gateway could not start (store unavailable, port busy, adapter missing); one-line reason."""


def jwt_verifier(s: Settings) -> JwtVerifier | None:
    """The device token verifier (docs/security.md, "Device tokens (JWT)"), its keys read now; None
    without a JWT key; StartupError when a key file is unusable (never saying a secret)."""
    from messaging_processor.security.jwt_tokens import JwtConfigError, JwtSettings, JwtVerifier

    js = JwtSettings(
        s.jwt_jwks,
        s.jwt_public_key,
        s.jwt_secret_file,
        s.jwt_user_claim,
        s.jwt_device_claim,
        s.jwt_audience,
        s.jwt_issuer,
        s.jwt_leeway_s,
    )
    if not js.enabled:
        return None
    try:
        return JwtVerifier(js)
    except JwtConfigError as e:
        raise StartupError(f"device tokens: {e}") from None


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        extra_routers: Sequence[APIRouter] = (),
        worker: WorkerLink | None = None,
    ) -> None:
        """`worker`: this is one worker of `gateway start --workers` (gateway/workers): its store is
        the supervisor's store process, its listeners share their ports with the other workers."""
        self.settings = settings
        self.worker = worker
        self.claims: ClaimsClient | None = None  # a worker's link to the supervisor's session claims
        self.extra_routers = list(extra_routers)
        self.store = None
        self.cluster_store = None  # CLUSTER mode: the network StoreClient (no local store)
        self.registration = None  # CLUSTER mode: this proxy's name server registration
        self.processor = None
        self.otlp = None  # --otlp-endpoint: the span exporter of message trace events (gateway/otlp.py)
        self.adapters: list[Adapter] = []  # started ones, in start order
        self._enabled: list[Adapter] = []  # every enabled listener, for /healthz
        self.tls: ServerTls | None = None  # --tls-cert: the certificate every TLS listener serves
        self.limiter = limiter_of(settings)  # connection and publish-rate limits of every listener
        self.os_limits: ProcessLimits | None = None  # descriptor and memory limits (start)
        self.events = None  # --client-events: the emitter adapters call (docs/system-topics.md)
        self.bridges = None  # `[[bridge]]` links run in this process (gateway/bridges.py)

    def listeners(self) -> list[Adapter]:
        return list(self._enabled)

    async def start(self) -> None:
        """Open the store, start the processor and every enabled listener; StartupError on failure
        (what did start stays started: call stop())."""
        from messaging_processor import Limits, MessagingProcessor

        s = self.settings
        cluster_config = None
        self.os_limits = ProcessLimits()  # the descriptor limit raised first: the store opens files
        self.os_limits.install(asyncio.get_running_loop())
        reserve = self.limiter.set_fd_reserve(self.os_limits.fd_limit, s.fd_reserve)
        ceiling = self.os_limits.fd_limit - reserve
        log.info("connections hold descriptors below %d (%d kept for the store)", ceiling, reserve)
        if self.worker is not None:
            await self._open_claims(self.worker)
        if s.mode == "cluster":
            from cluster.proxy import open_cluster_store
            from remoting.cluster_auth import ClusterSecretError

            try:
                cluster_config = proxy_config(s, cluster_auth(s))
            except (ClusterSecretError, TlsError) as e:
                raise StartupError(str(e)) from e
            if self.worker is not None and s.proxy_name:  # each worker registers under its own name
                cluster_config = dataclasses.replace(
                    cluster_config, proxy_name=f"{s.proxy_name}-{self.worker.index}"
                )
            try:
                self.cluster_store = await open_cluster_store(cluster_config)
            except (OSError, ValueError) as e:
                raise StartupError(f"cannot reach the name server {s.namesrv}: {e}") from e
            store_client = self.cluster_store
        elif self.worker is not None:
            store_client = await self._open_worker_store(self.worker)
        else:
            store_client = await self._open_local_store()
        security = None
        if s.auth:
            from messaging_processor.security import Security

            security = Security(store_client, allow_anonymous=s.allow_anonymous, jwt=jwt_verifier(s))
        tracer = None
        retention = trace_retention_ms(s.trace_retention)
        if retention > 0:
            from messaging_processor.tracing import recorder_for

            tracer = recorder_for(store_client, retention)
            if s.otlp_endpoint:
                from gateway.otlp import OtlpExport

                self.otlp = OtlpExport(s.otlp_endpoint)
                tracer.sinks.append(self.otlp.export)
        self.processor = MessagingProcessor(
            store_client,
            limits=Limits(max_body_size=s.max_body_size, body_sizes={"amqp": s.amqp_max_body_size}),
            auto_create_topics=s.auto_create_topics,
            security=security,
            tracer=tracer,
        )
        await self.processor.start()
        if s.client_events:
            from messaging_processor.client_events import ClientEvents

            self.events = ClientEvents(self.processor, s.proxy_name)
            await self.events.start()
        if security is not None:
            from gateway.bootstrap import BootstrapError, ensure_admin

            try:
                await ensure_admin(
                    self.processor, s.data_dir, cluster=s.mode == "cluster" or self.worker is not None
                )
            except BootstrapError as e:
                raise StartupError(str(e)) from e
            d = security.directory
            log.info("authentication on: %d user(s), %d ACL rule(s)", len(d.users), len(d.rules))
        await self._start_listeners()
        if s.bridge:
            from gateway.bridges import start_bridges
            from runtime import ConfigError

            try:
                self.bridges = start_bridges(s, self.adapters, self.worker.index if self.worker else None)
            except ConfigError as e:
                raise StartupError(str(e)) from e
        if self.claims is not None and self.worker is not None:
            self.claims.ready(self.worker.index)
        if s.mode == "cluster":
            from cluster.proxy import ProxyRegistration

            host = s.advertise_host or s.host
            endpoints = {a.name: f"{host}:{a.address.rsplit(':', 1)[1]}" for a in self.adapters}
            assert cluster_config is not None
            self.registration = ProxyRegistration(cluster_config, endpoints)
            self.registration.start()

    async def _open_claims(self, worker: WorkerLink) -> None:
        """A worker's link to its supervisor's claims of unique sessions."""
        from gateway.workers import ClaimsClient

        self.claims = ClaimsClient()
        try:
            await self.claims.connect(worker.claims_socket)
        except OSError as e:
            raise StartupError(f"worker {worker.index}: cannot reach the supervisor: {e}") from e

    async def _open_worker_store(self, worker: WorkerLink) -> ClusterStoreClient:
        """A LOCAL mode worker's StoreClient: the supervisor's store process."""
        from cluster.proxy import open_worker_store

        try:
            self.cluster_store = await open_worker_store(worker.store_socket)
        except OSError as e:
            raise StartupError(f"worker {worker.index}: cannot reach the store process: {e}") from e
        return self.cluster_store

    async def _open_local_store(self) -> LocalStoreClient:
        from messaging_processor import LocalStoreClient
        from store import Store, StoreError

        s = self.settings
        config = store_config(s)
        t0 = time.monotonic()
        try:
            with shutdown_signals_blocked():
                self.store = await Store.open(config)
        except (StoreError, OSError) as e:
            raise StartupError(f"cannot open the store at {s.data_dir}: {e}") from e
        log.info(
            "store opened at %s (flush=%s, %d topics) in %.2f s",
            s.data_dir,
            s.flush,
            len(self.store.topic_configs),
            time.monotonic() - t0,
        )
        self.store.preallocate()  # a fresh store's first append need not wait for its segment
        return LocalStoreClient(self.store)

    async def _start_listeners(self) -> None:
        s = self.settings
        if s.tls_cert is not None:
            files = TlsFiles(s.tls_cert, s.tls_key, s.tls_client_ca, s.tls_require_client_cert)
            try:
                self.tls = ServerTls(files, logging.getLogger("gateway.tls"))
            except TlsError as e:
                raise StartupError(str(e)) from e
        ordered = [p for p in PROTOCOLS if p in s.protocols]
        self._enabled = [self._make_adapter(name) for name in ordered]
        for adapter in self._enabled:
            bind = f"{s.host}:{s.port(adapter.name)}"
            try:
                await adapter.start()
            except Exception as e:
                with contextlib.suppress(Exception):  # release whatever it did set up
                    await adapter.stop(0)
                if isinstance(e, OSError):
                    raise StartupError(f"{adapter.name} cannot listen on {bind}: {e.strerror or e}") from e
                raise StartupError(f"{adapter.name} listener failed to start on {bind}: {e}") from e
            self.adapters.append(adapter)
            log.info("%s listening on %s%s", adapter.name, adapter.address, self._tls_note(adapter.name))
            extra = getattr(adapter, "extra_listeners", None)
            if extra is None:  # the HTTP listener wrapped by CloudEvents
                extra = getattr(getattr(adapter, "http", None), "extra_listeners", {})
            for name, address in extra.items():
                log.info("%s listening on %s", name, address)

    def _tls_note(self, name: str) -> str:
        """How a listener's own port uses TLS, for its log line."""
        s = self.settings
        if self.tls is None:
            return ""
        if name == "grpc" and not s.grpc_plain:
            return " (TLS)"
        if name == "remoting":
            return " (TLS required)" if s.tls_required else " (TLS or plain, detected)"
        return ""

    def _tls_context(self) -> ssl.SSLContext | None:
        """A server TLS context (kept current by `reload_tls`) for one listener, or None without TLS."""
        return self.tls.context() if self.tls is not None else None

    def reload_tls(self) -> None:
        """SIGHUP: load the certificate files again; new connections get the new certificate, a file
        that does not load keeps the previous one (logged)."""
        if self.tls is None:
            log.info("SIGHUP: no TLS certificate configured, nothing to reload")
            return
        self.tls.reload()

    def _make_adapter(self, name: str) -> Adapter:
        s = self.settings
        if name == "http":
            from gateway.http.wiring import http_adapter

            return http_adapter(self)
        if name == "grpc":
            try:
                from adapters.grpc import GrpcAdapter
            except ImportError as e:
                raise StartupError(f"the grpc listener is not available in this build: {e}") from e
            return GrpcAdapter(
                self.processor,
                host=s.host,
                port=s.grpc_port,
                advertise_host=s.advertise_host,
                max_inbound_message_size=max(GRPC_MIN_INBOUND, 2 * s.max_body_size),
                tls=None if s.grpc_plain else self.tls,
                limiter=self.limiter,
                max_outbound_bytes=s.max_outbound_bytes_per_connection,
                reuse_port=self.worker is not None,
            )
        if name == "mqtt":
            from adapters.mqtt import MqttAdapter, MqttCaps
            from adapters.mqtt.websocket import MqttWebSockets

            websockets = None
            if s.mqtt_ws:
                websockets = MqttWebSockets(
                    s.host,
                    s.mqtt_ws_port,
                    path=s.mqtt_ws_path,
                    ssl=self._tls_context(),
                    tls_port=s.mqtt_wss_port,
                    optional=(s.mqtt_ws_port, s.mqtt_wss_port) == (8083, 8084),
                    reuse_port=self.worker is not None,
                )

            mqtt = MqttAdapter(
                self.processor,
                s.host,
                s.mqtt_port,
                max_packet_size=s.max_body_size + 65536,
                max_keep_alive=s.mqtt_max_keep_alive,
                caps=MqttCaps(
                    max_client_id_length=s.mqtt_max_client_id_length,
                    max_topic_length=s.mqtt_max_topic_length,
                    max_topic_levels=s.mqtt_max_topic_levels,
                    max_retained_messages=s.mqtt_max_retained_messages,
                    max_retained_bytes=s.mqtt_max_retained_bytes,
                    max_queued_messages=s.mqtt_max_queued_messages,
                    max_queued_bytes=s.mqtt_max_queued_bytes,
                    queue_full_policy=s.mqtt_queue_full_policy,
                ),
                ssl=self._tls_context(),
                tls_port=s.mqtt_tls_port,
                cert_identity=s.mqtt_cert_identity,
                limiter=self.limiter,
                max_outbound_bytes=s.max_outbound_bytes_per_connection,
                reuse_port=self.worker is not None,
                claims=self.claims.namespace("mqtt") if self.claims is not None else None,
                session_queues=s.mode != "cluster",
                shared_sessions=self.worker is not None,
                websockets=websockets,
                events=self.events,
                # (under --workers the first worker publishes $SYS, with its own process's counters)
                sys_interval=s.sys_interval if self.worker is None or self.worker.index == 1 else 0,
            )
            if self.claims is not None:
                self.claims.evictors["mqtt"] = mqtt.evict
            return mqtt
        if name == "amqp":
            from adapters.amqp import AmqpAdapter

            return AmqpAdapter(
                self.processor,
                s.host,
                s.amqp_port,
                ssl=self._tls_context(),
                tls_port=s.amqp_tls_port,
                mqtt_exchange=s.amqp_mqtt_exchange,
                limiter=self.limiter,
                channel_max=s.amqp_channel_max,
                frame_max=s.amqp_frame_max,
                max_queues_per_vhost=s.amqp_max_queues_per_vhost,
                max_queues_per_user=s.amqp_max_queues_per_user,
                max_outbound_bytes=s.max_outbound_bytes_per_connection,
                reuse_port=self.worker is not None,
                events=self.events,
            )
        if name == "remoting":
            from adapters.remoting import RemotingAdapter

            return RemotingAdapter(
                self.processor,
                s.host,
                s.remoting_port,
                advertise_host=s.advertise_host,
                default_queues=s.default_queues,
                max_frame_size=max(16 * MIB, s.max_body_size + MIB),
                ssl=self._tls_context(),
                tls_required=s.tls_required,
                limiter=self.limiter,
                reuse_port=self.worker is not None,
            )
        raise StartupError(f"the {name} listener is not available yet")

    async def stop(self) -> None:
        """Stop every started listener (concurrently: all stop accepting at once, then drain),
        close the processor and the store. Safe to call after a failed or partial start."""
        grace = self.settings.drain_timeout_s
        if self.bridges is not None:
            bridges, self.bridges = self.bridges, None
            await bridges.stop()
        if self.registration is not None:
            registration, self.registration = self.registration, None
            await registration.stop()
        adapters, self.adapters = self.adapters, []
        if adapters:
            results = await asyncio.gather(
                *(self._stop_adapter(a, grace) for a in reversed(adapters)), return_exceptions=True
            )
            for a, r in zip(reversed(adapters), results, strict=True):
                if isinstance(r, BaseException):
                    log.warning("%s listener failed to stop cleanly: %r", a.name, r)
        if self.events is not None:  # (after the listeners: their last disconnects are written)
            events, self.events = self.events, None
            await events.close()
        if self.processor is not None:
            await self.processor.close()
            self.processor = None
        if self.otlp is not None:  # after the processor: its last trace events are exported too
            await asyncio.to_thread(self.otlp.shutdown)
            self.otlp = None
        if self.store is not None:
            store, self.store = self.store, None
            await store.close()
            log.info("store closed")
        if self.cluster_store is not None:
            cluster_store, self.cluster_store = self.cluster_store, None
            await cluster_store.close()
        if self.claims is not None:
            claims, self.claims = self.claims, None
            await claims.close()
        if self.os_limits is not None:
            self.os_limits.close()

    @staticmethod
    async def _stop_adapter(adapter: Adapter, grace: float) -> None:
        try:
            await asyncio.wait_for(adapter.stop(grace), grace + 3.0)
        except TimeoutError:
            log.warning("%s listener did not stop within %.1f s; abandoning it", adapter.name, grace + 3.0)


class Service(Protocol):
    """What `serve_until_signal` runs: a Gateway, or the supervisor of `--workers`."""

    async def start(self) -> None: ...  # StartupError when it cannot start

    async def stop(self) -> None: ...  # also after a failed or partial start


async def serve_until_signal(
    service: Service,
    *,
    ready: Callable[[], None],
    on_hup: Callable[[], None],
    gone: Callable[[], asyncio.Event | None] = lambda: None,
) -> int:
    """Start `service`, call `ready()`, serve until SIGTERM/SIGINT (or until the event `gone()`
    gives after the start is set), then stop it; the exit code (0 after a clean stop, 1 when it
    could not start). SIGHUP calls `on_hup()`."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.info("%s again: shutdown already under way", sig.name)
            return
        log.info("%s received, shutting down", sig.name)
        stop.set()

    for sig in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        try:
            await service.start()
        except StartupError as e:
            log.error("%s", e)
            await service.stop()
            return 1
        except BaseException:
            await service.stop()
            raise
        collector = gc_collector.take_over()
        ready()
        waits = [asyncio.ensure_future(stop.wait())]
        lost = gone()
        if lost is not None:
            waits.append(asyncio.ensure_future(lost.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if lost is not None and lost.is_set():
            log.warning("the supervisor is gone: stopping")
        t0 = time.monotonic()
        collector.stop()
        await service.stop()
        log.info("gateway stopped in %.2f s", time.monotonic() - t0)
        return 0
    finally:
        for sig in (*SHUTDOWN_SIGNALS, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


async def run(
    settings: Settings, *, extra_routers: Sequence[APIRouter] = (), worker: WorkerLink | None = None
) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code (0 after a clean stop, 1 when
    the gateway could not start). A `worker` also stops when its supervisor is gone."""
    gw = Gateway(settings, extra_routers=extra_routers, worker=worker)

    def ready() -> None:
        if worker is None:
            log.info("gateway ready")
        else:
            log.info("worker %d ready", worker.index)

    return await serve_until_signal(
        gw, ready=ready, on_hup=gw.reload_tls, gone=lambda: gw.claims.lost if gw.claims else None
    )
