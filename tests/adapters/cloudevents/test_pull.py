"""Pull consumption: pop (batch / structured, long polling), ack, nack, receipt handles."""

from __future__ import annotations

import asyncio
import json

import pytest

from adapters.cloudevents.codec import BATCH, STRUCTURED
from messaging_processor import ClientContext, Message

pytestmark = pytest.mark.asyncio(loop_scope="module")
EV = {"specversion": "1.0", "source": "/src", "type": "io.example.t"}
CTX = ClientContext("test")


async def publish(env, *ids: str) -> None:
    body = json.dumps([{**EV, "id": i} for i in ids])
    r = await env.client.post(env.url, headers={"content-type": BATCH}, content=body)
    assert r.status_code == 202, r.text


def base(env, group: str = "g") -> str:
    return f"/topics/{env.topic}/subscriptions/{group}"


async def pop(env, group: str = "g", **params) -> list[dict]:
    r = await env.client.post(base(env, group) + "/pop", json=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == BATCH
    return r.json()


async def test_pop_ack_and_redelivery_after_invisible_time(env):
    await publish(env, "a", "b", "c")
    got = await pop(env, max_events=10, invisible_time_ms=300)
    assert sorted(e["id"] for e in got) == ["a", "b", "c"]
    assert all(e["receipthandle"] for e in got)
    assert await pop(env) == []  # all invisible now
    acked = [e for e in got if e["id"] != "b"]
    r = await env.client.post(
        base(env) + "/ack", json={"receipt_handles": [e["receipthandle"] for e in acked]}
    )
    assert r.json() == {"acked": 2, "failed": []}
    again = await pop(env, wait_ms=5000)  # "b" becomes visible again after 300 ms
    assert [e["id"] for e in again] == ["b"]
    r = await env.client.post(
        base(env) + "/ack", json={"receipt_handles": [got[0]["receipthandle"], "bogus"]}
    )
    body = r.json()
    assert body["acked"] == 0 and len(body["failed"]) == 2  # an old handle and a bogus one
    assert body["failed"][1]["kind"] == "invalid_receipt_handle"


async def test_other_groups_get_every_event(env):
    await publish(env, "x")
    assert [e["id"] for e in await pop(env, "g1")] == ["x"]
    assert [e["id"] for e in await pop(env, "g2")] == ["x"]


async def test_nack_with_invisible_time_and_with_group_backoff(env):
    await publish(env, "n")
    (e,) = await pop(env)
    r = await env.client.post(
        base(env) + "/nack", json={"receipt_handles": [e["receipthandle"]], "invisible_time_ms": 0}
    )
    (new,) = r.json()["receipt_handles"]
    assert new and new != e["receipthandle"]
    (again,) = await pop(env)  # visible at once
    assert again["id"] == "n"
    r = await env.client.post(base(env) + "/nack", json={"receipt_handles": [again["receipthandle"], "bad"]})
    body = r.json()
    assert body["receipt_handles"][0] and body["receipt_handles"][1] is None
    assert body["failed"][0]["receipt_handle"] == "bad"
    assert await pop(env) == []  # the group's back-off (1 s for a new group) applies


async def test_structured_accept_returns_one_event_or_204(env):
    r = await env.client.post(base(env) + "/pop", headers={"accept": STRUCTURED}, json={})
    assert r.status_code == 204
    await publish(env, "s1", "s2")
    r = await env.client.post(base(env) + "/pop", headers={"accept": STRUCTURED}, json={"max_events": 10})
    assert r.status_code == 200 and r.headers["content-type"] == STRUCTURED
    assert r.json()["id"] in ("s1", "s2") and "receipthandle" in r.json()


async def test_long_poll_returns_when_an_event_arrives(env):
    task = asyncio.ensure_future(pop(env, wait_ms=10_000))
    await asyncio.sleep(0.2)  # the pop is waiting: nothing was published yet
    assert not task.done()
    await publish(env, "late")
    got = await asyncio.wait_for(task, 5)
    assert [e["id"] for e in got] == ["late"]


async def test_messages_from_other_protocols_pop_as_cloudevents(env):
    await env.p.send(CTX, [Message(env.topic, b"\x00raw", tag="TagA", born_timestamp=1_700_000_000_000)])
    (e,) = await pop(env)
    assert e["type"] == "org.apache.rocketmq.message" and e["subject"] == "TagA"
    assert e["source"] == f"/gateway/rocketmq/{env.topic}"
    assert e["time"] == "2023-11-14T22:13:20.000Z" and e["data_base64"] == "AHJhdw=="
    assert e["id"]


async def test_pop_errors(env):
    r = await env.client.post("/topics/nosuch/subscriptions/g/pop", json={})
    assert r.status_code == 404
    r = await env.client.post(f"/topics/{env.topic}/subscriptions/bad%20group/pop", json={})
    assert r.status_code == 400 and r.json()["kind"] == "illegal_group"
    r = await env.client.post(base(env) + "/pop", json={"max_events": 0})
    assert r.status_code == 400
    r = await env.client.post(base(env) + "/ack", json={"receipt_handles": []})
    assert r.status_code == 400
