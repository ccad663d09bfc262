"""AMQP 0-9-1 scenarios, run with two independent Python clients: pika 1.4.4 (``pika``,
BlockingConnection, its own frame codec) and aio-pika 10.2.1 (``aiopika``, on aiormq / pamqp).

Script: conformance/clients/python/amqp_scenarios.py (``config["client"]`` picks the library).
Queues and exchanges are declared by the scenarios themselves (AMQP applications do), named with the
run's unique prefix (``config["prefix"]``), so runs never see each other's messages; the runner
creates nothing through the admin API. Besides these scenarios, aiormq's own broker-facing test
suite runs against a spawned gateway: ``python -m conformance.amqp_suite`` (docs/conformance.md).
"""

from __future__ import annotations

from conformance.runner import Scenario

CLIENTS = ("pika", "aiopika")

_scenarios = [
    Scenario(
        "connect_confirm",
        "PLAIN login to vhost '/', durable queue, 20 persistent publishes with confirms, every basic "
        "property and header table round-trips, declare-ok/passive message count, basic.get + ack",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "work_queue",
        "prefetch 1, two consumers on one queue: 20 messages split fairly (each gets >= 5), none lost "
        "or twice, in order per consumer",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "topic_routing",
        "topic exchange: '*' matches one word, '#' zero or more; direct exchange by key",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "fanout_headers",
        "fanout to three queues; headers exchange x-match all / any",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "rpc",
        "RPC: server-named exclusive reply queue, reply_to + correlation_id, responder on a work queue",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "requeue_dlx",
        "reject with requeue -> redelivered=true; nack without requeue -> dead-lettered to "
        "x-dead-letter-exchange with x-dead-letter-routing-key and an x-death header",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "mandatory_return",
        "unroutable mandatory publish -> basic.return 312 NO_ROUTE (and still confirmed); routable "
        "mandatory publish delivered",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "channel_errors",
        "redeclare with other arguments -> 406 PRECONDITION_FAILED closes the channel only; passive "
        "declare of a missing queue -> 404; the connection stays usable",
        CLIENTS,
        timeout=30,
    ),
    Scenario(
        "cross_protocol",
        "AMQP publish to queue <q> -> MQTT subscriber of <q>/# (Paho); MQTT publish to <q>/dev1 -> "
        "AMQP consumer of queue <q>",
        CLIENTS,
        timeout=30,
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _scenarios}

__all__ = ["CLIENTS", "SCENARIOS"]
