"""Client events of AMQP connections (messaging_processor/client_events.py, docs/system-topics.md),
as RabbitMQ's event exchange reports them: `connection.created` once connection.open is answered,
`connection.closed` with a reason when it ends, `user.authentication.failure` for a refused
login, `consumer.created` / `consumer.deleted` for basic.consume and its end (basic.cancel, the
channel or connection closing, the queue deleted). Called only when the broker has an emitter
(`--client-events`): each call site tests `broker.events` first.

Close reasons: `normal` (the client sent connection.close), `heartbeat_timeout`, `kicked` (closed
from the console), `error` (the gateway closed it with a connection error; `reply_code` and
`reply_text` say which), `closed` (the socket ended without connection.close)."""

from __future__ import annotations

from typing import Any

# (the connection and consumer are typed Any: importing session.py or consumer.py here, even for
# annotations, would put this module into the adapter's import cycle, tests/architecture)
Connection = Any
Consumer = Any


def _user(conn: Connection) -> str | None:
    return conn.ctx.identity.username


def connected(conn: Connection) -> None:
    conn.announced = True
    vh = conn.vhost_obj.name if conn.vhost_obj is not None else "/"
    conn.broker.events.connected(  # type: ignore[union-attr]
        "amqp",
        conn.ctx.client_id,
        _user(conn),
        conn.remote,
        vhost=vh,
        heartbeat=conn.heartbeat,
        frame_max=conn.frame_max,
        channel_max=conn.channel_max,
    )


def auth_failed(conn: Connection, mechanism: str, user: str | None) -> None:
    conn.broker.events.auth_failed(  # type: ignore[union-attr]
        "amqp",
        conn.ctx.client_id or f"amqp-{conn.remote}",
        user,
        conn.remote,
        "login_refused",
        mechanism=mechanism,
    )


def closed(conn: Connection) -> None:
    if not conn.announced:
        return
    conn.announced = False
    reason, code, text = conn.close_reason or ("closed", None, None)
    vh = conn.vhost_obj.name if conn.vhost_obj is not None else "/"
    extra = {"reply_code": code, "reply_text": text} if code is not None else {}
    conn.broker.events.disconnected(  # type: ignore[union-attr]
        "amqp", conn.ctx.client_id, _user(conn), conn.remote, reason, vhost=vh, **extra
    )


def _consumer_fields(cons: Consumer) -> dict[str, object]:
    return {
        "vhost": cons.queue.vhost,
        "queue": cons.queue.name,
        "consumer_tag": cons.tag,
        "channel": cons.channel.number,
        "exclusive": cons.exclusive,
        "ack_required": not cons.no_ack,
        "prefetch_count": cons.prefetch,
    }


def consumer_created(conn: Connection, cons: Consumer) -> None:
    conn.broker.events.subscribed(  # type: ignore[union-attr]
        "amqp", conn.ctx.client_id, _user(conn), conn.remote, cons.queue.name, **_consumer_fields(cons)
    )


def consumer_deleted(conn: Connection, cons: Consumer) -> None:
    conn.broker.events.unsubscribed(  # type: ignore[union-attr]
        "amqp", conn.ctx.client_id, _user(conn), conn.remote, cons.queue.name, **_consumer_fields(cons)
    )
