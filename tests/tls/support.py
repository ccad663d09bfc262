"""Helpers of the TLS tests: a `gateway start` subprocess on ephemeral ports with TLS flags, the
serial number of the certificate a TLS port presents, and TLS client contexts."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from pathlib import Path

from conformance.gateway_proc import GatewayProc
from remoting import RemotingCommand, RequestCode
from remoting.command import Decoder

EPHEMERAL = [
    *("--grpc-port", "0", "--remoting-port", "0", "--http-port", "0", "--mqtt-port", "0"),
    *("--amqp-port", "0", "--https-port", "0", "--mqtt-tls-port", "0", "--amqp-tls-port", "0"),
]


def start_gateway(
    tmp_path: Path,
    *extra: str,
    protocols: str = "grpc,remoting,mqtt,amqp,http",
    env: Mapping[str, str] | None = None,
) -> GatewayProc:
    """`gateway start` with every port ephemeral, ready (its listeners in `.listeners`)."""
    args = ["start", "--data-dir", str(tmp_path / "data"), "--protocols", protocols, *EPHEMERAL, *extra]
    proc = GatewayProc(args, env=env)
    try:
        proc.wait_ready(60)
    except BaseException:
        proc.kill()
        raise
    return proc


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client context trusting `ca`, presenting `cert` when given."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def peer_serial(address: str, ca: str, alpn: tuple[str, ...] = ()) -> int:
    """The serial number of the certificate the TLS listener at `address` presents (verified)."""
    ctx = client_context(ca)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        cert = tls.getpeercert()
    assert cert is not None
    return int(cert["serialNumber"], 16)


def remoting_call(address: str, ctx: ssl.SSLContext | None = None) -> RemotingCommand:
    """GET_ROUTEINFO_BY_TOPIC over a raw (TLS with `ctx`) socket; the decoded reply."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    if ctx is not None:
        sock = ctx.wrap_socket(sock, server_hostname="localhost")
    with sock:
        sock.sendall(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, 7, ext_fields={"topic": "TlsGrpc"}).encode()
        )
        decoder = Decoder()
        while True:
            data = sock.recv(65536)
            assert data, "connection closed without a reply"
            decoder.feed(data)
            for cmd in decoder:
                return cmd
