"""Counters the processor keeps per protocol, topic and group; gateway/http/metrics.py renders them.

Plain dict counters: an increment on the send path costs one dict update, no locks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Metrics:
    messages_in: Counter = field(default_factory=Counter)  # (protocol, topic) -> messages stored
    bytes_in: Counter = field(default_factory=Counter)  # (protocol, topic) -> body bytes stored
    messages_out: Counter = field(default_factory=Counter)  # (protocol, topic) -> messages delivered
    deliveries: Counter = field(default_factory=Counter)  # (group, topic, protocol) -> messages popped
    group_redeliveries: Counter = field(default_factory=Counter)  # (group, topic, protocol) -> attempt > 1
    pops: Counter = field(default_factory=Counter)  # protocol -> pop calls that returned messages
    acks: Counter = field(default_factory=Counter)  # protocol -> acks
    nacks: Counter = field(default_factory=Counter)  # protocol -> nacks / invisible-time changes
    redeliveries: Counter = field(default_factory=Counter)  # (protocol, topic) -> deliveries with attempt > 1
    dlq: Counter = field(default_factory=Counter)  # (protocol, topic) -> messages forwarded to a DLQ
    errors: Counter = field(default_factory=Counter)  # (protocol, operation, error kind) -> failures
    auth_failures: Counter = field(default_factory=Counter)  # (protocol, reason) -> refused logins
    acl_denials: Counter = field(default_factory=Counter)  # (protocol, action) -> refused actions

    def snapshot(self) -> dict[str, dict]:
        return {
            name: dict(getattr(self, name))
            for name in (
                "messages_in",
                "bytes_in",
                "messages_out",
                "deliveries",
                "group_redeliveries",
                "pops",
                "acks",
                "nacks",
                "redeliveries",
                "dlq",
                "errors",
                "auth_failures",
                "acl_denials",
            )
        }
