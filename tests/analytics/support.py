"""Helpers of the analytics tests: an in-process gateway (HTTP + MQTT, ephemeral ports) on its own
event loop thread, so that blocking Spark calls in the test thread can read from it; telemetry
publishers over MQTT (aiomqtt) and HTTP CloudEvents (httpx); an MQTT subscriber thread; one local
SparkSession with settings safe for 2 shared cores."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import aiomqtt
import httpx

from gateway.config import Settings
from gateway.server import Gateway
from tests.support import TEST_SEGMENT_SIZE_MIB

T = 30.0  # seconds any single wait may take


class GatewayThread:
    """A Gateway running on an event loop in a daemon thread."""

    def __init__(self, data_dir: str, **settings: Any) -> None:
        s = {
            "protocols": ("http", "mqtt"),
            "http_port": 0,
            "mqtt_port": 0,
            "flush": "async",
            "default_queues": 4,
            "segment_size_mib": TEST_SEGMENT_SIZE_MIB,
        }
        s.update(settings)
        self.settings = Settings(data_dir=data_dir, **s)
        self.loop = asyncio.new_event_loop()
        self.gw = Gateway(self.settings)
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway-loop", daemon=True)

    def start(self) -> GatewayThread:
        self._thread.start()
        self.call(self.gw.start())
        return self

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = T) -> Any:
        """Run `coro` on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.gw.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(T)
        self.loop.close()

    def _address(self, name: str) -> str:
        return next(a.address for a in self.gw.adapters if a.name == name)

    @property
    def url(self) -> str:
        return f"http://{self._address('http')}"

    @property
    def mqtt_port(self) -> int:
        return int(self._address("mqtt").rsplit(":", 1)[1])

    @property
    def processor(self) -> Any:
        return self.gw.processor


@dataclass(frozen=True)
class Reading:
    """One telemetry reading: published as JSON {"ts": ts, "value": value} on `path`."""

    path: str
    ts: float
    value: float

    def body(self) -> bytes:
        return json.dumps({"ts": self.ts, "value": self.value}).encode()

    @property
    def device(self) -> str:
        return self.path.split("/")[1]


def publish_mqtt(port: int, readings: Iterable[Reading], client_id: str = "analytics-test-pub") -> None:
    """Publish readings with QoS 1 (each stored once its PUBACK arrives), in order."""

    async def run() -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier=client_id) as c:
            for r in readings:
                await c.publish(r.path, r.body(), qos=1)

    asyncio.run(asyncio.wait_for(run(), T))


def publish_cloudevents(url: str, topic: str, readings: Iterable[Reading], prefix: str = "ce") -> None:
    """POST readings as one batch of structured CloudEvents; `subject` is the reading's path."""
    events = [
        {
            "specversion": "1.0",
            "id": f"{prefix}-{i}",
            "source": "/tests/analytics",
            "type": "telemetry.reading",
            "subject": r.path,
            "datacontenttype": "application/json",
            "data": {"ts": r.ts, "value": r.value},
        }
        for i, r in enumerate(readings)
    ]
    resp = httpx.post(
        f"{url}/topics/{topic}/events",
        content=json.dumps(events),
        headers={"content-type": "application/cloudevents-batch+json"},
        timeout=T,
    )
    assert resp.status_code == 202, resp.text


class Subscriber:
    """An MQTT subscriber on its own thread, collecting (topic, payload) of `topic_filter`."""

    def __init__(self, port: int, topic_filter: str, client_id: str = "analytics-test-sub") -> None:
        self.port, self.filter, self.client_id = port, topic_filter, client_id
        self.messages: list[tuple[str, bytes]] = []
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with aiomqtt.Client("127.0.0.1", self.port, identifier=self.client_id) as c:
            await c.subscribe(self.filter, qos=1)
            self._ready.set()
            async for m in _until(c.messages, self._stop):
                with self._cond:
                    self.messages.append((str(m.topic), bytes(m.payload)))
                    self._cond.notify_all()

    def start(self) -> Subscriber:
        self._thread.start()
        assert self._ready.wait(T), "the MQTT subscriber did not connect"
        return self

    def wait_for(self, n: int, timeout: float = T) -> list[tuple[str, bytes]]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.messages) >= n, timeout)
            return list(self.messages)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(T)


async def _until(messages: Any, stop: asyncio.Event) -> Any:
    it = messages.__aiter__()
    while not stop.is_set():
        nxt = asyncio.ensure_future(it.__anext__())
        halt = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({nxt, halt}, return_when=asyncio.FIRST_COMPLETED)
        if nxt in done:
            yield nxt.result()
        else:
            nxt.cancel()
        halt.cancel()


def spark_session() -> Any:
    """The tests' SparkSession: local[2], 2 shuffle partitions, no UI, this interpreter for workers."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from analytics.session import spark_session as make

    spark = make(
        "gateway-analytics-tests",
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "1",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
