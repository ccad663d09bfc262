"""Push subscriptions against a real local webhook (uvicorn) over sockets: handshake, delivery,
retries with back-off, Retry-After, dead letters, replies, filters, concurrency, durability."""

from __future__ import annotations

import base64
import json

import pytest

from adapters.cloudevents.codec import BATCH, STRUCTURED
from adapters.cloudevents.push import backoff_ms, parse_retry_after
from messaging_processor import ClientContext, Message
from tests.adapters.cloudevents.support import Reply, close_gateway, open_gateway, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
EV = {"specversion": "1.0", "source": "/shop", "type": "com.acme.order"}
FAST = {"backoff_delay": "PT0.1S", "retry": 3}
CTX = ClientContext("test")


async def subscribe(env, receiver, path: str = "sink", **spec) -> dict:
    spec.setdefault("topic", env.topic)
    spec.setdefault("sink", receiver.url(path))
    r = await env.client.post("/subscriptions", json=spec)
    assert r.status_code == 201, r.text
    sub = r.json()
    assert r.headers["location"] == f"/subscriptions/{sub['id']}"
    return sub


async def status(env, sub: dict) -> dict:
    r = await env.client.get(f"/subscriptions/{sub['id']}")
    assert r.status_code == 200
    return r.json()["status"]


async def active(env, sub: dict) -> None:
    await wait_until(lambda: _is(env, sub, "active"))


async def _is(env, sub, state) -> bool:
    return (await status(env, sub))["state"] == state


async def publish(env, *events: dict) -> None:
    body = json.dumps([{**EV, **e} for e in events])
    r = await env.client.post(env.url, headers={"content-type": BATCH}, content=body)
    assert r.status_code == 202, r.text


def gaps(posts) -> list[float]:
    return [b.at - a.at for a, b in zip(posts, posts[1:], strict=False)]


async def test_handshake_then_binary_delivery(env, receiver):
    sub = await subscribe(env, receiver, delivery={"origin": "gw.test"})
    await active(env, sub)
    (opt,) = receiver.options()
    assert opt.headers["webhook-request-origin"] == "gw.test"
    await publish(
        env, {"id": "e1", "subject": "Grüße", "n": 3, "datacontenttype": "application/json", "data": {"a": 1}}
    )
    (post,) = await receiver.wait_posts(1)
    assert post.headers["ce-id"] == "e1" and post.headers["content-type"] == "application/json"
    assert post.headers["webhook-request-origin"] == "gw.test" and post.headers["prefer"] == "reply"
    ev = post.event()  # a valid CloudEvent for the SDK
    assert (ev.get_subject(), ev.get_extension("n"), ev.get_data()) == ("Grüße", "3", {"a": 1})
    st = await wait_until(lambda: _delivered(env, sub, 1))
    assert st["failed_attempts"] == 0 and st["inflight"] == 0


async def _delivered(env, sub, n):
    st = await status(env, sub)
    return st if st["delivered"] >= n else None


async def test_structured_delivery(env, receiver):
    sub = await subscribe(env, receiver, delivery={"content_mode": "structured", "handshake": False})
    await active(env, sub)
    await publish(env, {"id": "s1", "ext": True, "data_base64": "AAE="})
    (post,) = await receiver.wait_posts(1)
    assert post.headers["content-type"] == STRUCTURED and "webhook-request-origin" not in post.headers
    body = json.loads(post.body)
    assert "traceparent" not in body  # none added by the gateway (issue 47)
    assert body == {**EV, "id": "s1", "ext": True, "data_base64": "AAE="}
    assert receiver.options() == []


async def test_refused_handshake_blocks_delivery(env, receiver):
    receiver.grant = False
    sub = await subscribe(env, receiver)
    await wait_until(lambda: _is(env, sub, "handshake_refused"))
    await publish(env, {"id": "never"})
    assert "did not grant" in (await status(env, sub))["detail"]
    assert receiver.posts() == []
    receiver.grant = True  # granted on the next try (1 s back-off): the waiting event goes out
    (post,) = await receiver.wait_posts(1)
    assert post.headers["ce-id"] == "never"


async def test_retries_with_exponential_backoff_after_503(env, receiver):
    receiver.answer("sink", Reply(503), Reply(503), Reply(503), Reply(202))
    sub = await subscribe(env, receiver, delivery=FAST)
    await active(env, sub)
    await publish(env, {"id": "r1"})
    posts = await receiver.wait_posts(4)
    assert [p.headers["ce-id"] for p in posts] == ["r1"] * 4
    g = gaps(posts)
    assert g[0] >= 0.095 and g[1] >= 0.195 and g[2] >= 0.395, g  # 0.1, 0.2, 0.4 s
    st = await wait_until(lambda: _delivered(env, sub, 1))
    assert st["failed_attempts"] == 3 and st["dead_lettered"] == 0


async def test_linear_backoff(env, receiver):
    receiver.answer("sink", Reply(500), Reply(504), Reply(500), Reply(200))
    sub = await subscribe(env, receiver, delivery={**FAST, "backoff_policy": "linear"})
    await active(env, sub)
    await publish(env, {"id": "l1"})
    g = gaps(await receiver.wait_posts(4))
    assert g[0] >= 0.095 and g[1] >= 0.195 and g[2] >= 0.295, g  # 0.1, 0.2, 0.3 s
    assert g[2] < 0.395 + 1.0, g


async def test_retry_after_on_429_is_honoured(env, receiver):
    receiver.answer("sink", Reply(429, {"Retry-After": "1"}), Reply(202))
    sub = await subscribe(env, receiver, delivery={"backoff_delay": "PT0.05S", "retry": 2})
    await active(env, sub)
    await publish(env, {"id": "ra"})
    posts = await receiver.wait_posts(2)
    assert gaps(posts)[0] >= 0.99  # Retry-After: 1 beats the 50 ms back-off
    await wait_until(lambda: _delivered(env, sub, 1))


async def test_dead_letter_sink_after_the_retry_budget(env, receiver):
    receiver.default = Reply(500, body=b"boom")
    receiver.answer("dls", Reply(202))
    sink = receiver.url("sink")
    sub = await subscribe(
        env,
        receiver,
        delivery={"retry": 2, "backoff_delay": "PT0.05S", "dead_letter_sink": receiver.url("dls")},
    )
    await active(env, sub)
    assert {o.path for o in receiver.options()} == {"/sink", "/dls"}  # both handshaken
    await publish(env, {"id": "d1", "data": {"x": 1}})
    (dl,) = await receiver.wait_posts(1, "dls")
    assert len(receiver.posts()) == 3  # first attempt + 2 retries
    ev = dl.event()
    assert ev.get_id() == "d1" and ev.get_data() == {"x": 1}
    assert ev.get_extension("knativeerrordest") == sink
    assert ev.get_extension("knativeerrorcode") == "500"
    assert base64.b64decode(ev.get_extension("knativeerrordata")) == b"boom"
    st = await wait_until(lambda: _dead(env, sub, 1))
    assert st["delivered"] == 0 and st["failed_attempts"] == 3


async def _dead(env, sub, n):
    st = await status(env, sub)
    return st if st["dead_lettered"] >= n else None


async def test_no_retry_on_400_and_store_dlq_without_a_sink(env, receiver):
    receiver.default = Reply(400)
    sub = await subscribe(env, receiver, delivery=FAST)
    await active(env, sub)
    await publish(env, {"id": "bad"})
    await wait_until(lambda: _dead(env, sub, 1))
    assert len(receiver.posts()) == 1  # a 400 is not retried
    dlq = await env.p.pop(CTX, "inspect", f"%DLQ%{sub['group']}", long_poll_ms=2000)
    assert [d.message.properties["ce.id"] for d in dlq] == ["bad"]


async def test_reply_events_are_ingested_with_a_hop_limit(env, receiver):
    # The sink answers every event with a reply event: the chain ends when knativebrokerttl runs out.
    reply = {"ce-specversion": "1.0", "ce-id": "re", "ce-source": "/sink", "ce-type": "com.acme.reply"}
    receiver.default = Reply(200, {**reply, "content-type": "text/plain"}, b"thanks")
    sub = await subscribe(env, receiver, delivery={"handshake": False})
    await active(env, sub)
    await publish(env, {"id": "first", "knativebrokerttl": 3})
    await wait_until(lambda: _delivered(env, sub, 3))
    posts = receiver.posts()
    assert [p.headers["ce-id"] for p in posts] == ["first", "re", "re"]
    assert [p.headers.get("ce-knativebrokerttl") for p in posts] == ["3", "2", "1"]
    assert posts[1].body == b"thanks" and posts[1].headers["content-type"] == "text/plain"
    st = await status(env, sub)
    assert st["replies"] == 2
    assert (await env.p.get_topic(env.topic)).messages == 3  # the third reply was dropped (ttl 0)


async def test_filters_select_events(env, receiver):
    await env.p.delete_topic(env.topic)
    await env.p.create_topic(env.topic, queues=1)  # one queue, one in flight: delivery keeps order
    filters = [{"prefix": {"type": "com.acme."}}, {"cesql": "subject LIKE 'eu-%' AND EXISTS region"}]
    sub = await subscribe(env, receiver, filters=filters, delivery={"max_inflight": 1, "handshake": False})
    await active(env, sub)
    await publish(
        env,
        {"id": "1", "subject": "eu-1", "region": "x"},
        {"id": "2", "subject": "us-1", "region": "x"},
        {"id": "3", "subject": "eu-2"},
        {"id": "4", "type": "org.other", "subject": "eu-3", "region": "x"},
        {"id": "5", "subject": "eu-4", "region": "y"},
    )
    await receiver.wait_posts(2)
    await wait_until(lambda: _delivered(env, sub, 2))
    assert [p.headers["ce-id"] for p in receiver.posts()] == ["1", "5"]


async def test_bounded_concurrency(env, receiver):
    receiver.default = Reply(202, delay=0.1)
    sub = await subscribe(env, receiver, delivery={"max_inflight": 2, "handshake": False})
    await active(env, sub)
    await publish(env, *({"id": str(i)} for i in range(6)))
    await wait_until(lambda: _delivered(env, sub, 6))
    assert receiver.max_inflight == 2


async def test_allowed_rate_paces_deliveries(env, receiver):
    receiver.allowed_rate = "600"  # per minute: one request per 0.1 s
    sub = await subscribe(env, receiver)
    await active(env, sub)
    await publish(env, *({"id": str(i)} for i in range(3)))
    g = gaps(await receiver.wait_posts(3))
    assert min(g) >= 0.05, g  # unpaced, the three go out within a few ms


async def test_messages_from_other_protocols_are_pushed_as_cloudevents(env, receiver):
    sub = await subscribe(env, receiver, delivery={"handshake": False})
    await active(env, sub)
    (receipt,) = await env.p.send(CTX, [Message(env.topic, b"hello", tag="T")])
    (post,) = await receiver.wait_posts(1)
    ev = post.event()
    assert (ev.get_id(), ev.get_type(), ev.get_subject()) == (
        receipt.message_id,
        "org.apache.rocketmq.message",
        "T",
    )
    assert ev.get_source() == f"/gateway/rocketmq/{env.topic}" and post.body == b"hello"


async def test_subscription_api_errors_and_delete(env, receiver):
    bad = [
        {"topic": "nosuch", "sink": receiver.url()},
        {"topic": env.topic, "sink": "ftp://x"},
        {"topic": env.topic, "sink": receiver.url(), "filters": [{"cesql": "a = "}]},
        {
            "topic": env.topic,
            "sink": receiver.url(),
            "filters": [{"exact": {"a": "b"}, "suffix": {"a": "b"}}],
        },
        {"topic": env.topic, "sink": receiver.url(), "delivery": {"backoff_delay": "soon"}},
        {"topic": env.topic, "sink": receiver.url(), "group": "bad group"},
    ]
    codes = [(await env.client.post("/subscriptions", json=b)).status_code for b in bad]
    assert codes == [404, 400, 400, 400, 400, 400]
    sub = await subscribe(env, receiver, delivery={"handshake": False})
    ids = [s["id"] for s in (await env.client.get("/subscriptions")).json()]
    assert sub["id"] in ids
    assert sub["group"] == f"ce-sub-{sub['id']}" and sub["status"]["state"] in ("starting", "active")
    assert (await env.client.delete(f"/subscriptions/{sub['id']}")).status_code == 204
    assert (await env.client.get(f"/subscriptions/{sub['id']}")).status_code == 404
    assert (await env.client.delete(f"/subscriptions/{sub['id']}")).status_code == 404


async def test_subscriptions_survive_a_restart(tmp_path, receiver):
    env = await open_gateway(str(tmp_path / "d"), protocols=("http",))
    env.topic, env.url = "orders", "/topics/orders/events"
    try:
        await env.p.create_topic("orders")
        sub = await subscribe(env, receiver, delivery={"retry": 1, "backoff_delay": "PT0.05S"})
        await active(env, sub)
    finally:
        await close_gateway(env)
    env = await open_gateway(str(tmp_path / "d"), protocols=("http",))
    env.topic, env.url = "orders", "/topics/orders/events"
    try:
        (again,) = (await env.client.get("/subscriptions")).json()
        assert again["id"] == sub["id"] and again["delivery"]["retry"] == 1
        await publish(env, {"id": "after-restart"})
        (post,) = await receiver.wait_posts(1)
        assert post.headers["ce-id"] == "after-restart"
        assert len(receiver.options()) == 2  # the handshake is repeated on each start
    finally:
        await close_gateway(env)


async def test_backoff_and_retry_after_parsing():
    assert [backoff_ms("exponential", 100, n) for n in (1, 2, 3)] == [100, 200, 400]
    assert [backoff_ms("linear", 100, n) for n in (1, 2, 3)] == [100, 200, 300]
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
