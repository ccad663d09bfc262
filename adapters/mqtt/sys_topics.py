"""`$SYS/broker/...`: the broker's status in Mosquitto's layout (mosquitto(8), "Broker status"),
published every `interval` seconds, each only when its value changed, and retained: a new
subscriber gets the current values at once (docs/system-topics.md lists every topic and where its
value comes from).

The values are read from what the gateway already counts, nothing new on the message path: the
processor's metrics (messages and payload bytes stored and delivered, by protocol), the broker's
sessions and retained index, the limiter's connection counts when there is one. Each tick writes
the changed values as messages of the store topic `%SYS%`, which `$SYS/...` maps to (mapping.py),
for those subscribed (and the copies persistent sessions' queues need, `session_copies`); a
SUBSCRIBE gets the values of that moment as its retained messages (`SysRetained`), so nothing of
`$SYS` is kept in the retained topic or counts against the retained caps. Clients cannot publish
to `$SYS`: the processor refuses producers `%` topics (PUBACK 0x90 Topic Name invalid)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from importlib import metadata
from typing import TYPE_CHECKING, Any

from messaging_processor import Message
from messaging_processor.client_events import send_with_copies
from messaging_processor.dispatch import DISPATCHED_FROM

from .codec import topic_matches
from .mapping import P_QOS, P_RETAIN, P_TOPIC, SYS_TOPIC
from .retained import Retained

if TYPE_CHECKING:
    from ..limits import Limiter

# the MQTT Broker (broker.py), typed Any: importing broker.py here, even for annotations, would put
# this module into the adapter's import cycle (tests/architecture/import_cycles.py)
Broker = Any

log = logging.getLogger("adapters.mqtt")
LOADS = ((1, "1min"), (5, "5min"), (15, "15min"))


def version() -> str:
    try:
        return "msg-gateway " + metadata.version("msg-gateway")
    except metadata.PackageNotFoundError:
        return "msg-gateway"


class SysTopics:
    """The `$SYS/broker/...` publisher of one MQTT adapter."""

    def __init__(self, broker: Broker, interval: float, limiter: Limiter | None = None) -> None:
        self.broker = broker
        self.interval = interval
        self.limiter = limiter
        self.started = time.monotonic()
        self.version = version()
        self.published: dict[str, str] = {}  # path -> the value last published
        self.max_connected = 0
        self._loads: dict[str, float] = {}
        self._last: tuple[float, dict[str, int]] | None = None  # (time, totals) of the previous tick
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Make `%SYS%` (one queue: a path's values arrive in order), then tick."""
        await self.broker.processor.send_internal(SYS_TOPIC, [], queues=1)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        t, self._task = self._task, None
        if t is not None:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.publish()
            except Exception as e:  # noqa: BLE001 - the next tick tries again
                log.warning("mqtt $SYS: publishing failed: %s", e)

    def totals(self) -> dict[str, int]:
        """Counters since start, from the processor's metrics (all protocols, and MQTT's own)."""
        m = self.broker.processor.metrics
        out = {
            "messages/received": sum(m.messages_in.values()),
            "messages/sent": sum(m.messages_out.values()),
            "bytes/received": sum(m.bytes_in.values()),
            "publish/messages/received": sum(v for (proto, _), v in m.messages_in.items() if proto == "mqtt"),
            "publish/messages/sent": sum(v for (proto, _), v in m.messages_out.items() if proto == "mqtt"),
        }
        if self.limiter is not None:
            out["connections"] = self.limiter.opens.get("mqtt", 0)
        return out

    def values(self, now: float | None = None, tick: bool = False) -> dict[str, str]:
        """Every `$SYS/broker/...` path and its value now (`tick`: also move the load averages on)."""
        now = time.monotonic() if now is None else now
        b = self.broker
        sessions = b.sessions
        connected = len(sessions)
        self.max_connected = max(self.max_connected, connected)
        states = b.states
        offline = sum(1 for cid in states if cid not in sessions)
        subs = sum(len(st.subs) for st in states.values()) + sum(
            len(s.subs) for s in sessions.values() if s.pstate is None
        )
        totals = self.totals()
        v = {
            "version": self.version,
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": connected,
            "clients/active": connected,
            "clients/disconnected": offline,
            "clients/inactive": offline,
            "clients/total": connected + offline,
            "clients/maximum": self.max_connected,
            "subscriptions/count": subs,
            "retained messages/count": len(b.retained.index),
        }
        for k, n in totals.items():
            if k != "connections":
                v[k] = n
        if tick:
            self._load(now, totals)
        for k, x in self._loads.items():
            v["load/" + k] = f"{x:.2f}"
        return {f"$SYS/broker/{k}": str(x) for k, x in v.items()}

    def _load(self, now: float, totals: dict[str, int]) -> None:
        """Mosquitto's load figures: per-minute rates, moving averages over 1, 5 and 15 minutes."""
        last, self._last = self._last, (now, totals)
        if last is None:
            return
        dt = now - last[0]
        if dt <= 0:
            return
        for key in (
            "messages/received",
            "messages/sent",
            "bytes/received",
            "publish/messages/received",
            "publish/messages/sent",
            "connections",
        ):
            if key not in totals:
                continue
            rate = (totals[key] - last[1].get(key, 0)) * 60.0 / dt
            for minutes, suffix in LOADS:
                name = f"{key}/{suffix}"
                e = math.exp(-dt / (minutes * 60.0))
                self._loads[name] = self._loads.get(name, 0.0) * e + rate * (1.0 - e)

    async def publish(self) -> int:
        """Publish the values that changed since the last tick; how many."""
        changed = {k: x for k, x in self.values(tick=True).items() if self.published.get(k) != x}
        if not changed:
            return 0
        msgs = [
            Message(SYS_TOPIC, x.encode(), "", (), {P_TOPIC: path, P_QOS: "0", P_RETAIN: "1"})
            for path, x in changed.items()
        ]
        routes = self.broker.routes
        copiers = [lambda ms: session_copies(routes, ms)] if routes is not None else []
        await send_with_copies(self.broker.processor, SYS_TOPIC, msgs, copiers)
        self.published.update(changed)
        return len(changed)

    def matching(self, filt: str) -> list[tuple[str, Message]]:
        """The current values as the retained messages of the paths `filt` matches."""
        return [
            (path, Message(SYS_TOPIC, x.encode(), "", (), {P_TOPIC: path, P_QOS: "0", P_RETAIN: "1"}))
            for path, x in sorted(self.values().items())
            if topic_matches(filt, path)
        ]


def session_copies(routes: Any, messages: list[Message]) -> list[Message]:
    """The copies of the gateway's own messages (`$SYS`, `$events`: `%` topics, which the processor's
    dispatch leaves out) for the queues of the persistent sessions whose filters match their paths
    (`routes`: session_routing.py `SessionRoutes`)."""
    out = []
    for m in messages:
        for queue in routes.dispatch_paths(m.properties[P_TOPIC]):
            props = {**m.properties, DISPATCHED_FROM: m.topic}
            out.append(Message(queue, m.body, m.tag, m.keys, props, born_timestamp=m.born_timestamp))
    return out


class SysRetained(Retained):
    """The retained messages, plus the `$SYS` values as retained ones (always the current values,
    computed when a filter of `$SYS/...` asks: nothing of `$SYS` is kept in the retained topic)."""

    sys: SysTopics | None = None

    async def matching(self, filt: str) -> list[tuple[str, Message]]:
        out = await super().matching(filt)
        if self.sys is not None and filt.startswith("$SYS"):
            out.extend(self.sys.matching(filt))
        return out
