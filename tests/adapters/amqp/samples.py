"""One sample instance of every AMQP method, with non-default values, shared by the codec tests (data
only; `channel_for` and `role_decoding` of a sample are in support.py)."""

from __future__ import annotations

from decimal import Decimal

from adapters.amqp.codec import METHODS, BasicProperties, Timestamp
from adapters.amqp.codec import methods as m

TABLE = {
    "product": "msg-gateway",
    "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True},
    "n": 42,
    "big": 1 << 40,
    "neg": -7,
    "pi": 3.25,
    "list": [1, "two", False, None],
    "when": Timestamp(1_700_000_000),
    "price": Decimal("12.34"),
    "void": None,
    "raw": b"\x00\xff",
}

SAMPLES: list[m.AMQPMethod] = [
    m.ConnectionStart(0, 9, TABLE, b"PLAIN AMQPLAIN", b"en_US"),
    m.ConnectionStartOk(
        {"product": "test", "capabilities": {"connection.blocked": True}}, "PLAIN", b"\x00u\x00p", "en_US"
    ),
    m.ConnectionSecure(b"challenge"),
    m.ConnectionSecureOk(b"response"),
    m.ConnectionTune(2047, 131072, 60),
    m.ConnectionTuneOk(2047, 131072, 30),
    m.ConnectionOpen("/vhost"),
    m.ConnectionOpenOk(),
    m.ConnectionClose(320, "CONNECTION_FORCED - broker shutdown", 10, 50),
    m.ConnectionCloseOk(),
    m.ConnectionBlocked("low on memory"),
    m.ConnectionUnblocked(),
    m.ConnectionUpdateSecret(b"new-token", "token refresh"),
    m.ConnectionUpdateSecretOk(),
    m.ChannelOpen(),
    m.ChannelOpenOk(),
    m.ChannelFlow(False),
    m.ChannelFlowOk(False),
    m.ChannelClose(404, "NOT_FOUND - no queue 'q'", 50, 10),
    m.ChannelCloseOk(),
    m.AccessRequest("/data", True, False, True, False, True),
    m.AccessRequestOk(1),
    m.ExchangeDeclare("orders", "topic", False, True, True, False, True, {"alternate-exchange": "ae"}),
    m.ExchangeDeclareOk(),
    m.ExchangeDelete("orders", True, True),
    m.ExchangeDeleteOk(),
    m.ExchangeBind("dst", "src", "a.*.c", True, {"x-match": "any"}),
    m.ExchangeBindOk(),
    m.ExchangeUnbind("dst", "src", "a.#", False, {"k": 1}),
    m.ExchangeUnbindOk(),
    m.QueueDeclare("q1", False, True, True, False, True, {"x-queue-type": "quorum", "x-max-length": 1000}),
    m.QueueDeclareOk("amq.gen-JzTY20BRgKO-HjmUJj0wLg", 12, 3),
    m.QueueBind("q1", "orders", "orders.created", True, {"x-arg": "v"}),
    m.QueueBindOk(),
    m.QueuePurge("q1", True),
    m.QueuePurgeOk(99),
    m.QueueDelete("q1", True, False, True),
    m.QueueDeleteOk(7),
    m.QueueUnbind("q1", "orders", "orders.created", {"x-arg": "v"}),
    m.QueueUnbindOk(),
    m.BasicQos(0, 250, True),
    m.BasicQosOk(),
    m.BasicConsume("q1", "ctag-1", False, True, True, False, {"x-priority": 10}),
    m.BasicConsumeOk("amq.ctag-abc"),
    m.BasicCancel("ctag-1", True),
    m.BasicCancelOk("ctag-1"),
    m.BasicPublish("amq.topic", "devices.42.telemetry", True, False),
    m.BasicReturn(312, "NO_ROUTE", "amq.direct", "nowhere"),
    m.BasicDeliver("ctag-1", (1 << 63) - 1, True, "amq.topic", "a.b.c"),  # pamqp reads longlong signed
    m.BasicGet("q1", True),
    m.BasicGetOk(5, True, "", "q1", 17),
    m.BasicGetEmpty(),
    m.BasicAck(123456789012, True),
    m.BasicReject(9, False),
    m.BasicRecoverAsync(True),
    m.BasicRecover(True),
    m.BasicRecoverOk(),
    m.BasicNack(77, True, False),
    m.ConfirmSelect(True),
    m.ConfirmSelectOk(),
    m.TxSelect(),
    m.TxSelectOk(),
    m.TxCommit(),
    m.TxCommitOk(),
    m.TxRollback(),
    m.TxRollbackOk(),
]

assert {type(s) for s in SAMPLES} == set(METHODS.values()), "a method has no sample"

PROPERTIES = BasicProperties(
    content_type="application/json",
    content_encoding="gzip",
    headers={"x-trace": "abc", "retries": 2, "nested": {"ok": True}, "tags": ["a", "b"]},
    delivery_mode=2,
    priority=5,
    correlation_id="corr-1",
    reply_to="amq.rabbitmq.reply-to",
    expiration="60000",
    message_id="msg-1",
    timestamp=1_700_000_000,
    type="order.created",
    user_id="guest",
    app_id="billing",
    cluster_id="c1",
)
