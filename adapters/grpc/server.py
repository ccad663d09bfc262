"""`GrpcAdapter`: the grpc.aio server lifecycle around `MessagingService` (bind, serve, drain), in
clear or over TLS. TLS uses gRPC's dynamic server credentials: gRPC asks `tls_credentials`'s fetcher
at each new handshake, which hands it the certificate again after a reload (SIGHUP)."""

from __future__ import annotations

import asyncio
import logging

import grpc

from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.limits import GrpcLimits
from adapters.grpc.outbound import OutboundBudgets
from adapters.grpc.service import RECEIVE_RAW, MessagingService
from adapters.limits import Limiter
from messaging_processor import MessagingProcessor
from runtime.tasks import cancel_and_wait
from runtime.tls import ServerTls

log = logging.getLogger("adapters.grpc")

MIB = 1024 * 1024
_WILDCARD = ("", "0.0.0.0", "::", "[::]")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


SERVICE = "apache.rocketmq.v2.MessagingService"
_HANDLER_KINDS = {  # (client streaming, server streaming) -> handler factory
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def method_handlers(
    service: MessagingService, limits: GrpcLimits | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """What `service_pb2_grpc.add_MessagingServiceServicer_to_server` registers, built from the
    service descriptor, except that the methods in `RECEIVE_RAW` write the bytes their handler
    yields (no response serializer); with `limits`, each handler refuses over-limit calls first."""
    out = {}
    for m in s.DESCRIPTOR.services_by_name["MessagingService"].methods:
        factory = _HANDLER_KINDS[(m.client_streaming, m.server_streaming)]
        response = getattr(s, m.output_type.name)
        handler = getattr(service, m.name)
        if limits is not None:
            handler = limits.wrap(m.name, handler, m.client_streaming, m.server_streaming)
        out[m.name] = factory(
            handler,
            request_deserializer=getattr(s, m.input_type.name).FromString,
            response_serializer=None if m.name in RECEIVE_RAW else response.SerializeToString,
        )
    return out


def tls_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Server credentials that follow `tls`: a reload (its `generation` changes) is picked up by
    the next handshake; client certificates are asked for and verified with its client CA."""

    def config() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(tls.pair.key, tls.pair.chain)], root_certificates=tls.client_ca
        )

    served = [tls.generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        if tls.generation == served[0]:
            return None  # unchanged: gRPC keeps the one it has
        served[0] = tls.generation
        return config()

    return grpc.dynamic_ssl_server_credentials(
        config(), fetch, require_client_authentication=tls.files.require_client_cert
    )


class GrpcAdapter:
    """RocketMQ 5 gRPC (`apache.rocketmq.v2.MessagingService`) listener.

    `advertise_host`: the host QueryRoute hands out as the broker endpoint. Default: the bound
    host; when bound to a wildcard address, the host (and port) the client addressed, taken from
    the request's `endpoints` field, else 127.0.0.1."""

    name = "grpc"

    def __init__(
        self,
        processor: MessagingProcessor,
        host: str = "127.0.0.1",
        port: int = 8081,
        advertise_host: str | None = None,
        max_inbound_message_size: int = 130 * MIB,
        tls: ServerTls | None = None,
        limiter: Limiter | None = None,
        max_outbound_bytes: int = 0,
        reuse_port: bool = False,
    ) -> None:
        """`tls`: the port serves TLS only (clients enable TLS, e.g. `tls_enable=True`). `limiter`:
        connection and publish-rate limits (docs/limits.md; adapters/grpc/limits.py).
        `max_outbound_bytes`: message bytes a client id's ReceiveMessage calls may hold (0: no bound)."""
        self.processor = processor
        self.tls = tls
        self.host = host
        self.port = port
        self.advertise_host = advertise_host
        self.max_inbound_message_size = max_inbound_message_size
        self.reuse_port = reuse_port  # SO_REUSEPORT (else a busy port is an error)
        self.service = MessagingService(processor)
        if max_outbound_bytes:
            self.service.outbound = OutboundBudgets(max_outbound_bytes)
        self.limits = GrpcLimits(limiter, self.service) if limiter is not None else None
        self._server: grpc.aio.Server | None = None
        self._bound_port = 0
        self._listening = False
        self._sweeper: asyncio.Task | None = None

    @property
    def listening(self) -> bool:
        return self._listening

    @property
    def address(self) -> str:
        return _hostport(self.host, self._bound_port or self.port)

    async def start(self) -> None:
        """Bind and serve; raises RuntimeError when the address cannot be bound."""
        n = self.max_inbound_message_size
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", n),
                ("grpc.max_send_message_length", n),
                ("grpc.so_reuseport", int(self.reuse_port)),
                # Clients ping to keep idle channels (Telemetry) alive: do not answer with GOAWAY.
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
                ("grpc.http2.max_ping_strikes", 0),
            ]
        )
        handlers = method_handlers(self.service, self.limits)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)
        try:
            bind = _hostport(self.host, self.port)
            if self.tls is not None:
                port = server.add_secure_port(bind, tls_credentials(self.tls))
            else:
                port = server.add_insecure_port(bind)
        except RuntimeError as e:
            raise RuntimeError(f"grpc: cannot bind {_hostport(self.host, self.port)}: {e}") from e
        if not port:
            raise RuntimeError(f"grpc: cannot bind {_hostport(self.host, self.port)}")
        self._bound_port = port
        svc = self.service
        svc.port = port
        if self.advertise_host:
            svc.advertise_host = self.advertise_host
        elif self.host not in _WILDCARD:
            svc.advertise_host = self.host.strip("[]")
        else:
            svc.advertise_host = None
        svc.store_host = _hostport(svc.advertise_host or self.host, port)
        await server.start()
        self._server = server
        self._listening = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        log.debug("grpc listening on %s", self.address)

    async def stop(self, grace: float) -> None:
        """Stop accepting at once; let in-flight calls finish for up to `grace` s, then cancel them."""
        self._listening = False
        await cancel_and_wait(self._sweeper)
        self._sweeper = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def _sweep(self) -> None:
        """Forget client sessions that stopped sending Heartbeats."""
        expiry = self.processor.client_idle_expiry_s
        while True:
            await asyncio.sleep(max(expiry / 4, 1.0))
            for cid in self.service.expire_sessions(expiry):
                log.debug("grpc session %s expired", cid)
            if self.limits is not None:
                self.limits.expire(expiry)
