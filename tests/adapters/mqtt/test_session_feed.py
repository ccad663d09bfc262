"""Session queues across proxies that share their sessions (`--workers`; session_feed.py): two
MQTT adapters, each with its own processor (and so its own dispatcher), over one store, as two
workers over the supervisor's store process. A subscription made through one reaches the other's
dispatcher; a proxy that starts later reads the feed first; an unsubscribe and a session's end
stop the dispatch everywhere."""

from __future__ import annotations

from adapters.mqtt import MqttAdapter
from adapters.mqtt.codec import Subscribe, Subscription, Unsubscribe, encode_subscribe, encode_unsubscribe
from adapters.mqtt.codec.packets import Suback, Unsuback
from messaging_processor import MessagingProcessor
from messaging_processor.store_client import LocalStoreClient
from tests.adapters.mqtt.support import V5, Env, Raw, close_env, open_env
from tests.adapters.mqtt.test_session_queues import publishes, queued
from tests.support import wait_until


async def worker(env: Env) -> Env:
    """Another proxy over `env`'s store, stopped when `env` closes."""
    p = MessagingProcessor(LocalStoreClient(env.store), auto_create_topics=True)
    await p.start()
    env.core.on_close(p.close)
    a = await env.core.add(MqttAdapter(p, "127.0.0.1", 0, shared_sessions=True))
    other = Env(env.core, a)
    other.processor = p
    return other


async def test_a_subscription_through_one_proxy_is_dispatched_by_the_other(tmp_path):
    a = await open_env(str(tmp_path / "data"), shared_sessions=True)
    try:
        raw, _ = await Raw.connect(a, "dev-1", 4, clean_start=False)
        raw.send(encode_subscribe(Subscribe(1, [Subscription("dev/1/cmd", 1)]), 4))
        assert isinstance(await raw.recv(), Suback)
        queue = a.adapter.broker.states["dev-1"].queue
        b = await worker(a)  # started later: reads the feed to its end first
        assert "dev-1" in b.adapter.broker.routes.index
        raw.send(encode_subscribe(Subscribe(2, [Subscription("dev/all/cmd", 1)]), 4))
        assert isinstance(await raw.recv(), Suback)
        await wait_until(lambda: b.adapter.broker.routes.dispatch_paths("dev/all/cmd") == [queue])
        async with b.client(V5) as pub:  # through the other proxy
            await pub.publish("dev/1/cmd", b"one", qos=1)
            await pub.publish("dev/all/cmd", b"all", qos=1)
            await pub.publish("dev/2/cmd", b"not-for-it", qos=1)
        assert await queued(a, queue) == 2
        assert [p.payload for p in await publishes(raw, 2)] == [b"one", b"all"]
        raw.send(encode_unsubscribe(Unsubscribe(3, ["dev/all/cmd"]), 4))
        assert isinstance(await raw.recv(), Unsuback)
        await wait_until(lambda: b.adapter.broker.routes.dispatch_paths("dev/all/cmd") == [])
        await raw.close()
        raw, ack = await Raw.connect(a, "dev-1", 4, clean_start=True)  # the session ends
        assert not ack.session_present
        await wait_until(lambda: "dev-1" not in b.adapter.broker.routes.index)
        await raw.close()
    finally:
        await close_env(a)
