"""The CloudEvents ingest's publish-rate limit (adapters/limits.py, docs/limits.md): a POST over its
client's or its user's rate is answered `429 Too Many Requests` with `Retry-After` and nothing is
stored. HTTP has no lasting connection to meter, so the client is the request's source address;
the user is the verified one (authentication on), else none."""

from __future__ import annotations

import math

from starlette.types import Scope

from ..limits import PUBLISH_RATE, ClientMeter, Limiter, PublishMeter
from .problems import IDENTITY_KEY

PROTOCOL = "http"
MAX_CLIENTS = 65_536  # address meters kept; beyond it the table starts over (buckets refill in a burst)


class IngestLimits:
    __slots__ = ("limiter", "clients")

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.clients: dict[str, PublishMeter] = {}

    def retry_after(self, scope: Scope, events: int, nbytes: int) -> int:
        """0 and charged when the request fits its client's and user's rates, else the seconds
        (at least 1) to put in Retry-After (nothing charged; counted in the limiter's refusals)."""
        client = scope.get("client")
        address = client[0] if client else ""
        own = self.clients.get(address)
        if own is None:
            if len(self.clients) >= MAX_CLIENTS:
                self.clients.clear()
            own = self.clients[address] = PublishMeter(self.limiter.settings)
        identity = scope.get(IDENTITY_KEY)
        user = identity.username if identity is not None else None
        wait = ClientMeter(own, self.limiter.user_meter(user)).try_take(events, nbytes)
        if wait <= 0.0:
            return 0
        self.limiter.refusals[(PROTOCOL, PUBLISH_RATE)] += 1
        return max(1, math.ceil(wait))
