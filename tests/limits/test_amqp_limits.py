"""AMQP limits with pika: `--amqp-channel-max` and `--amqp-frame-max` offered in connection.tune
(the client takes them and opens channel_max channels), and `--amqp-max-queues-per-vhost`
(queue.declare of a new queue past it: channel closed with 406 PRECONDITION_FAILED, as RabbitMQ's
vhost queue limit; redeclaring an existing queue still works)."""

from __future__ import annotations

import asyncio

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.tls.support import start_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    proc = start_gateway(
        tmp_path_factory.mktemp("amqp"),
        *("--amqp-channel-max", "4", "--amqp-frame-max", "8192", "--amqp-max-queues-per-vhost", "3"),
        protocols="amqp,http",
    )
    yield int(proc.listeners["amqp"].rsplit(":", 1)[1])
    assert proc.stop() == 0


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=15)
    )


async def test_tune_offers_channel_max_and_frame_max(gw) -> None:
    def run() -> tuple[int, int, int]:
        conn = connect(gw)
        try:
            params = conn._impl.params  # negotiated in connection.tune-ok
            opened = [conn.channel() for _ in range(4)]  # all channel_max channels open
            return params.channel_max, params.frame_max, len([c for c in opened if c.is_open])
        finally:
            if conn.is_open:
                conn.close()

    assert await asyncio.to_thread(run) == (4, 8192, 4)


async def test_queue_limit_per_vhost(gw) -> None:
    def run() -> str:
        conn = connect(gw)
        try:
            ch = conn.channel()
            for i in range(3):
                ch.queue_declare(f"limited-{i}", durable=True)
            ch.queue_declare("limited-0", durable=True)  # redeclaring is not a new queue
            try:
                ch.queue_declare("limited-3", durable=True)
            except ChannelClosedByBroker as e:
                return f"{e.reply_code} {e.reply_text}"
            return "declared"
        finally:
            if conn.is_open:
                conn.close()

    assert (await asyncio.to_thread(run)).startswith("406 ")
