"""`--amqp-max-queues-per-user` with pika under `--auth`: a user's queues are counted over every vhost
from the declaration records (each names the user who declared it); the next new queue is refused
with 406 PRECONDITION_FAILED (the channel closes, as RabbitMQ's user queue limit), redeclaring one
of its queues still works, another user has its own count, and deleting a queue makes room. A
record written before queues named their user counts for nobody."""

from __future__ import annotations

import asyncio
import json

import httpx
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from adapters.amqp.queues import Queue
from adapters.amqp.records import QUEUES_NS, Records, queue_user, vkey
from tests.tls.support import start_gateway

ADMIN_PW = "admin-pw-queues-K"
CAP = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    proc = start_gateway(
        tmp_path_factory.mktemp("userq"),
        *("--auth", "--amqp-max-queues-per-user", str(CAP)),
        protocols="amqp,http",
        env={"GATEWAY_ADMIN_PASSWORD": ADMIN_PW},
    )
    base = f"http://{proc.listeners['http']}/admin"
    admin = ("admin", ADMIN_PW)
    for name in ("ana", "bob"):
        body = {"name": name, "password": f"{name}-pw"}
        assert httpx.post(f"{base}/users", json=body, auth=admin, timeout=10).status_code == 201
    rule = {"subject": "role:user", "pattern": "#", "actions": ["publish", "subscribe", "admin"]}
    assert httpx.post(f"{base}/acl", json=rule, auth=admin, timeout=10).status_code == 201
    yield int(proc.listeners["amqp"].rsplit(":", 1)[1])
    assert proc.stop() == 0


def declare_all(port: int, user: str, steps: list[tuple[str, str]]) -> list[str]:
    """Run ("declare" | "delete", queue) steps as `user`, reopening the channel after a refusal:
    "ok" or "<reply code> <reply text>" for each."""
    creds = pika.PlainCredentials(user, f"{user}-pw")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, credentials=creds))
    out: list[str] = []
    try:
        ch = conn.channel()
        for op, queue in steps:
            try:
                if op == "declare":
                    ch.queue_declare(queue, durable=True)
                else:
                    ch.queue_delete(queue)
                out.append("ok")
            except ChannelClosedByBroker as e:
                out.append(f"{e.reply_code} {e.reply_text}")
                ch = conn.channel()
    finally:
        if conn.is_open:
            conn.close()
    return out


async def test_queue_limit_per_user(gw) -> None:
    ana = [("declare", "ana-1"), ("declare", "ana-2"), ("declare", "ana-1"), ("declare", "ana-3")]
    got = await asyncio.to_thread(declare_all, gw, "ana", ana)
    assert got[:3] == ["ok", "ok", "ok"]  # redeclaring ana-1 is not a new queue
    assert (
        got[3]
        == "406 PRECONDITION_FAILED - cannot declare queue 'ana-3': queue limit for user 'ana' (2) is reached"
    )

    # bob has a count of his own
    assert await asyncio.to_thread(declare_all, gw, "bob", [("declare", "bob-1")]) == ["ok"]

    # a deleted queue no longer counts
    again = [("delete", "ana-1"), ("declare", "ana-3"), ("declare", "ana-4")]
    got = await asyncio.to_thread(declare_all, gw, "ana", again)
    assert got[:2] == ["ok", "ok"] and got[2].startswith("406 ")


class MemoryKV:
    """The key-value table of Records, in a dict."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        return self.rows.get((ns, key))

    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        self.rows[(ns, key)] = value

    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        old = self.rows.get((ns, key))
        if old is None:
            self.rows[(ns, key)] = value
        return old

    async def kv_delete(self, ns: str, key: str) -> bool:
        return self.rows.pop((ns, key), None) is not None

    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return sorted((k, v) for (n, k), v in self.rows.items() if n == ns and k.startswith(prefix))


async def test_records_without_a_user_count_for_nobody() -> None:
    kv = MemoryKV()
    old = {"durable": True, "exclusive": False, "auto_delete": False, "topic": "q0", "own_topic": True}
    await kv.kv_put(QUEUES_NS, vkey("/", "q0"), json.dumps({**old, "args": ""}).encode())
    records = Records(kv)
    for vh, name, user in (("/", "q1", "ana"), ("other", "q2", "ana"), ("/", "q3", "bob"), ("/", "q4", None)):
        q = Queue(vh, name, name, durable=True, exclusive=False, auto_delete=False, args={})
        assert await records.create_queue(q, {}, user) is None
    assert queue_user(await kv.kv_get(QUEUES_NS, vkey("/", "q0"))) is None
    assert queue_user(b"not json") is None
    assert [await records.user_queue_count(u) for u in ("ana", "bob", "carl")] == [2, 1, 0]
    q0 = await records.queue_of("/", "q0", await kv.kv_get(QUEUES_NS, vkey("/", "q0")))
    assert q0 is not None and q0.topic == "q0"  # an old record still reads
