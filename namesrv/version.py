"""The version and features of the name server protocol (docs/cluster.md, "Upgrading node by
node"). A client sends HELLO (7004, a gateway extension) once per connection, with its own version
and features in the extFields `version` and `features`; the name server answers the same fields
plus `uptimeMillis`, how long it has been running. A name server that predates HELLO answers
REQUEST_CODE_NOT_SUPPORTED: the client takes that as version 0 with `BASE_FEATURES`, and never asks
it for what it does not offer.

| version | features |
| --- | --- |
| 0 (before HELLO) | `routes` (RocketMQ's registration and route requests), `proxies` (7001-7003) |
| 1 | those, `hello`, `uptime` (a restarted name server says so: its listing may not be refilled yet) |
"""

from __future__ import annotations

from dataclasses import dataclass

from remoting import RemotingCommand, ResponseCode

HELLO = 7004
VERSION = 1
BASE_FEATURES = frozenset({"routes", "proxies"})  # what a version 0 name server serves
FEATURES = BASE_FEATURES | {"hello", "uptime"}


@dataclass(frozen=True)
class PeerInfo:
    """What the other side of a name server connection said at HELLO (version 0: nothing)."""

    version: int
    features: frozenset[str]
    uptime_s: float | None = None  # the name server's, when it says

    def supports(self, feature: str) -> bool:
        return feature in self.features


BASE = PeerInfo(0, BASE_FEATURES)


def hello_fields(version: int = VERSION, features: frozenset[str] = FEATURES) -> dict[str, str]:
    return {"version": str(version), "features": ",".join(sorted(features))}


def parse_hello(r: RemotingCommand) -> PeerInfo:
    """The name server's answer to HELLO; BASE for one that does not know the request
    (REQUEST_CODE_NOT_SUPPORTED) or refuses it."""
    if r.code != ResponseCode.SUCCESS:
        return BASE
    e = r.ext_fields
    up = e.get("uptimeMillis")
    return PeerInfo(
        int(e.get("version", "0")),
        frozenset(f for f in str(e.get("features", "")).split(",") if f),
        int(up) / 1000 if up not in (None, "") else None,
    )
