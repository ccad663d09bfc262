"""MQTT caps with real clients (paho 5.0 and 3.1.1): client id length (CONNACK 0x85; 3.1.1: 2,
identifier rejected), topic length and levels (PUBACK 0x90, SUBACK 0x8F) and retained messages
(PUBACK 0x97), against a gateway started with small `--mqtt-max-*` settings."""

from __future__ import annotations

import asyncio
import threading

import paho.mqtt.client as paho
import pytest

from tests.tls.support import start_gateway

T = 15.0


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    proc = start_gateway(
        tmp_path_factory.mktemp("caps"),
        *("--mqtt-max-client-id-length", "23", "--mqtt-max-topic-length", "40"),
        *("--mqtt-max-topic-levels", "4", "--mqtt-max-retained-messages", "2"),
        *("--mqtt-max-retained-bytes", "1000", "--auto-create-topics"),
        protocols="mqtt,http",
    )
    yield int(proc.listeners["mqtt"].rsplit(":", 1)[1])
    assert proc.stop() == 0


def rc_value(rc) -> int:
    return rc.value if hasattr(rc, "value") else int(rc)


class Client:
    """A paho client in its network thread, with CONNACK and PUBACK codes collected."""

    def __init__(self, port: int, client_id: str, protocol: int = paho.MQTTv5) -> None:
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        self.connack: int | None = None
        self.connected = threading.Event()
        self.acks: dict[int, int] = {}
        self.subacks: list[list[int]] = []
        self.changed = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_publish = self._on_publish
        self.c.on_subscribe = self._on_subscribe
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def _on_connect(self, client, userdata, flags, rc, props=None) -> None:
        self.connack = rc_value(rc)
        self.connected.set()

    def _on_publish(self, client, userdata, mid, rc, props=None) -> None:
        with self.changed:
            self.acks[mid] = rc_value(rc)
            self.changed.notify_all()

    def _on_subscribe(self, client, userdata, mid, rcs, props=None) -> None:
        with self.changed:
            self.subacks.append([rc_value(r) for r in rcs])
            self.changed.notify_all()

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int:
        mid = self.c.publish(topic, payload, qos=1, retain=retain).mid
        with self.changed:
            assert self.changed.wait_for(lambda: mid in self.acks, T), "no PUBACK"
        return self.acks[mid]

    def subscribe(self, filt: str) -> list[int]:
        n = len(self.subacks)
        self.c.subscribe(filt, qos=1)
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.subacks) > n, T), "no SUBACK"
        return self.subacks[n]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def connack_of(port: int, client_id: str, protocol: int) -> int:
    c = Client(port, client_id, protocol)
    try:
        assert c.connected.wait(T)
        return c.connack  # type: ignore[return-value]
    finally:
        c.close()


async def test_client_id_length(gw) -> None:
    assert await asyncio.to_thread(connack_of, gw, "x" * 23, paho.MQTTv5) == 0
    assert await asyncio.to_thread(connack_of, gw, "x" * 24, paho.MQTTv5) == 0x85
    # 3.1.1 CONNACK 2 (identifier rejected), which paho reports as the 5.0 code 0x85
    assert await asyncio.to_thread(connack_of, gw, "y" * 24, paho.MQTTv311) == 0x85


async def test_topic_length_and_levels(gw) -> None:
    def run() -> tuple[list[int], list[list[int]]]:
        c = Client(gw, "caps-topics")
        try:
            assert c.connected.wait(T) and c.connack == 0
            codes = [
                c.publish("caps/a/b/c", b"ok"),  # 4 levels
                c.publish("caps/a/b/c/d", b"5 levels"),
                c.publish("caps/" + "x" * 36, b"41 bytes"),
                c.publish("caps/" + "x" * 35, b"40 bytes"),
            ]
            subs = [c.subscribe("caps/+/b/#"), c.subscribe("caps/+/b/c/#"), c.subscribe("caps/" + "z" * 40)]
            return codes, subs
        finally:
            c.close()

    codes, subs = await asyncio.to_thread(run)
    assert codes == [0, 0x90, 0x90, 0]
    assert subs[0][0] <= 2 and subs[1] == [0x8F] and subs[2] == [0x8F]


async def test_retained_caps(gw) -> None:
    def run() -> list[int]:
        c = Client(gw, "caps-retained")
        try:
            assert c.connected.wait(T) and c.connack == 0
            return [
                c.publish("ret/1", b"a" * 600, retain=True),
                c.publish("ret/2", b"b" * 500, retain=True),  # 1100 bytes > 1000
                c.publish("ret/2", b"b" * 300, retain=True),
                c.publish("ret/1", b"a" * 100, retain=True),  # replacing: counts the change only
                c.publish("ret/3", b"c", retain=True),  # a third message > 2
                c.publish("ret/1", b"", retain=True),  # clearing one frees a place
                c.publish("ret/3", b"c", retain=True),
                c.publish("ret/4", b"d"),  # not retained: no cap
            ]
        finally:
            c.close()

    assert await asyncio.to_thread(run) == [0, 0x97, 0, 0, 0x97, 0, 0, 0]
