"""What the gateway process expects of every protocol adapter (one listener each)."""

from __future__ import annotations

from typing import Protocol


class Adapter(Protocol):
    """A protocol listener. The gateway constructs it with the MessagingProcessor and settings,
    calls `start()` (bind and serve; raise if the port cannot be bound), reports `address` in its
    one-line start log and in /healthz, and calls `stop(grace)` on shutdown: stop accepting at
    once, let in-flight requests finish for up to `grace` seconds, then close connections."""

    name: str  # "grpc", "http", "mqtt", "amqp", "remoting"

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...

    @property
    def listening(self) -> bool: ...

    @property
    def address(self) -> str:  # "host:port" actually bound (useful with port 0 in tests)
        ...


class ConnectionSource(Protocol):
    """An adapter with long-lived connections the console lists and may close (MQTT, AMQP). Each
    entry: id, protocol, client_id, user, remote, since (epoch s), messages_in, messages_out."""

    def connections_info(self) -> list[dict[str, object]]: ...

    def close_connection(self, conn_id: str) -> bool: ...
