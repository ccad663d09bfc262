"""One MQTT subscription as the broker keeps it (`Sub`), and how a saved filter becomes one.

Plain data shared by the subscription index (clean sessions, fanout.py), persistent session state
(persistence.py) and shared subscriptions (shared.py); it imports nothing else of the adapter at
run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .codec import parse_shared

if TYPE_CHECKING:
    from .roles import Connection, Stoppable


class Sub:
    """One subscription (hashable by identity, the TopicTrie item). `session` is the connection for
    clean sessions; persistent sessions' subscriptions are routed through their SessionState."""

    __slots__ = (
        "session",
        "filter",
        "qos",
        "rap",
        "nl",
        "rh",
        "sub_id",
        "first",
        "wild",
        "share",
        "loop",
        "check",
        "acl_version",
    )

    def __init__(
        self,
        session: Connection | None,
        filt: str,
        qos: int,
        rap: bool,
        share: str | None,
        nl: bool = False,
        rh: int = 0,
        sub_id: int = 0,
    ) -> None:
        self.session = session
        self.filter = filt  # the inner filter for a shared subscription
        self.qos = qos
        self.rap = rap  # retain as published
        self.nl = nl  # no local
        self.rh = rh  # retain handling
        self.sub_id = sub_id  # 5.0 subscription identifier (0 = none)
        self.share = share
        first = filt.split("/", 1)[0]
        self.wild = first in ("+", "#")
        self.first = first
        self.loop: Stoppable | None = None  # a shared subscription's membership
        self.check = False  # ACL: each delivered path must be checked (access.py)
        self.acl_version = 0  # ... and the rules version it was made on (0: none yet, with auth on)


def make_sub(
    session: Connection | None, filt: str, qos: int, rap: bool, nl: bool = False, rh: int = 0, sub_id: int = 0
) -> Sub | None:
    """A Sub for a filter as subscribed (`$share/<name>/<filter>` included); None if invalid."""
    try:
        shared = parse_shared(filt)
    except ValueError:
        return None
    if shared:
        return Sub(session, shared[1], qos, False, shared[0], nl, rh, sub_id)
    return Sub(session, filt, qos, rap, None, nl, rh, sub_id)
