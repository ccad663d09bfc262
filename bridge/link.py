"""A link's state and numbers, sans-IO: the asyncio glue (`bridge/runner.py`) reports what
happened, this decides the reconnect delay and keeps what `/metrics` and the console show.

States: `connecting` -> `up` -> (a failure) `backoff` -> `connecting` ...; `stopped` at the end.
The delay after a failure is exponential (min * 2^(failures-1), capped at max) with full jitter
(uniform in [delay/2, delay]); a connection that stayed up for `healthy_s` resets the count."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

STATES = ("connecting", "up", "backoff", "stopped")


@dataclass
class LinkState:
    name: str
    source: str  # addresses, for display
    sink: str
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 30.0
    healthy_s: float = 10.0
    state: str = "connecting"
    failures: int = 0  # consecutive
    connects: int = 0
    connect_failures: int = 0
    received: int = 0  # read from the source (redeliveries included)
    redelivered: int = 0  # of those, flagged as redelivered by the source (DUP / redelivered)
    forwarded: int = 0  # confirmed by the sink and acknowledged to the source
    dropped: int = 0  # matched no topic rule: acknowledged without forwarding
    source_backlog: int | None = None  # messages waiting at the source, when it can tell (AMQP)
    last_error: str = ""
    last_forward_at: float = 0.0
    up_since: float = 0.0
    _pending: deque[float] = field(default_factory=deque)  # receive times of unconfirmed messages

    def connected(self, now: float) -> None:
        self.state, self.up_since = "up", now
        self.connects += 1

    def failed(self, error: str, now: float, rng: random.Random | None = None) -> float:
        """A connection attempt or an up link failed; the seconds to wait before the next one.
        What was in flight is forgotten: the source sends it again (at least once)."""
        if self.state == "up" and now - self.up_since >= self.healthy_s:
            self.failures = 0
        self.failures += 1
        self.connect_failures += 1
        self.last_error = error
        self.state = "backoff"
        self._pending.clear()
        delay = min(self.reconnect_max_s, self.reconnect_min_s * 2 ** min(self.failures - 1, 30))
        return (rng or random).uniform(delay / 2, delay)

    def connecting(self) -> None:
        self.state = "connecting"

    def stopped(self) -> None:
        self.state = "stopped"
        self._pending.clear()

    def on_received(self, now: float, redelivered: bool) -> None:
        self.received += 1
        self.redelivered += redelivered
        self._pending.append(now)

    def on_forwarded(self, now: float, dropped: bool = False) -> None:
        """The oldest pending message was confirmed and acknowledged (acks go in receive order)."""
        if self._pending:
            self._pending.popleft()
        if dropped:
            self.dropped += 1
        else:
            self.forwarded += 1
            self.last_forward_at = now

    @property
    def inflight(self) -> int:
        return len(self._pending)

    @property
    def lag_messages(self) -> int:
        """Messages not yet at the destination that the bridge knows of: in flight, plus the
        source's backlog when it reports one."""
        return self.inflight + (self.source_backlog or 0)

    def lag_seconds(self, now: float) -> float:
        """Age of the oldest message read and not yet confirmed (0 when none)."""
        return max(0.0, now - self._pending[0]) if self._pending else 0.0

    def snapshot(self, now: float) -> dict[str, object]:
        return {
            "name": self.name,
            "from": self.source,
            "to": self.sink,
            "state": self.state,
            "up": self.state == "up",
            "received": self.received,
            "redelivered": self.redelivered,
            "forwarded": self.forwarded,
            "dropped": self.dropped,
            "inflight": self.inflight,
            "lag_messages": self.lag_messages,
            "lag_seconds": round(self.lag_seconds(now), 3),
            "connects": self.connects,
            "connect_failures": self.connect_failures,
            "last_error": self.last_error,
        }
