"""Prometheus text (format 0.0.4) of the links: appended to the gateway's `/metrics` when bridges
run inside it, served alone by `gateway bridge --metrics-port`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import Link

# (name, type, help, value of a LinkState snapshot key)
FAMILIES = (
    ("gateway_bridge_up", "gauge", "1 while the link is connected to both sides.", "up"),
    (
        "gateway_bridge_received_total",
        "counter",
        "Messages read from the source (redeliveries included).",
        "received",
    ),
    (
        "gateway_bridge_redelivered_total",
        "counter",
        "Messages the source flagged as redelivered (AMQP).",
        "redelivered",
    ),
    (
        "gateway_bridge_forwarded_total",
        "counter",
        "Messages confirmed by the destination and acked to the source.",
        "forwarded",
    ),
    (
        "gateway_bridge_dropped_total",
        "counter",
        "Messages that matched no topic rule (acked, not forwarded).",
        "dropped",
    ),
    (
        "gateway_bridge_inflight_messages",
        "gauge",
        "Messages read and not yet confirmed by the destination.",
        "inflight",
    ),
    (
        "gateway_bridge_lag_messages",
        "gauge",
        "In flight plus the source queue's depth (AMQP sources).",
        "lag_messages",
    ),
    (
        "gateway_bridge_lag_seconds",
        "gauge",
        "Age of the oldest message not yet confirmed (0: none).",
        "lag_seconds",
    ),
    (
        "gateway_bridge_connects_total",
        "counter",
        "Connections of the link that reached both sides.",
        "connects",
    ),
    (
        "gateway_bridge_connect_failures_total",
        "counter",
        "Failed or lost connections of the link.",
        "connect_failures",
    ),
)


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(links: Iterable[Link]) -> str:
    now = time.monotonic()
    snaps = [link.state.snapshot(now) for link in links]
    if not snaps:
        return ""
    lines: list[str] = []
    for name, kind, help_text, key in FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for s in snaps:
            v = s[key]
            value = int(v) if isinstance(v, bool) else v
            lines.append(f'{name}{{bridge="{_label(str(s["name"]))}"}} {value}')
    return "\n".join(lines) + "\n"
