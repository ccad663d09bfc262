"""GET /metrics: Prometheus text exposition (format 0.0.4) of the processor's and the store's counters.

Rendered by hand from `processor.metrics` and `processor.store_stats()` at scrape time: nothing on
the message path touches Prometheus objects."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from fastapi import APIRouter, Request
from fastapi.responses import Response

from adapters.base import Adapter
from adapters.limits import Limiter
from messaging_processor import MessagingProcessor

from .deps import get_listeners, get_processor

router = APIRouter(tags=["metrics"])

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FLUSH_QUANTILES = (0.5, 0.9, 0.99, 1.0)

# (metric name, Metrics attribute, label names, help)
_PROCESSOR_COUNTERS = (
    ("gateway_messages_in_total", "messages_in", ("protocol", "topic"), "Messages stored."),
    ("gateway_messages_out_total", "messages_out", ("protocol", "topic"), "Messages delivered."),
    ("gateway_pops_total", "pops", ("protocol",), "Pop calls that returned messages."),
    ("gateway_acks_total", "acks", ("protocol",), "Acknowledged deliveries."),
    ("gateway_nacks_total", "nacks", ("protocol",), "Negative acks and invisible-time changes."),
    ("gateway_redeliveries_total", "redeliveries", ("protocol", "topic"), "Deliveries with attempt > 1."),
    ("gateway_dlq_total", "dlq", ("protocol", "topic"), "Messages forwarded to a dead-letter topic."),
    ("gateway_errors_total", "errors", ("protocol", "operation", "kind"), "Failed requests by error kind."),
    ("gateway_auth_failures_total", "auth_failures", ("protocol", "reason"), "Refused logins by reason."),
    ("gateway_acl_denials_total", "acl_denials", ("protocol", "action"), "Actions the ACL refused."),
)
_STORE_COUNTERS = (
    ("appends", "Records appended to the commit log."),
    ("flushes", "Commit log flushes (group commits)."),
    ("pops", "Messages popped from the store."),
    ("acks", "Acks applied by the store."),
    ("redeliveries", "Messages the store handed out again after their invisible time."),
    ("dlq", "Messages the store moved to a dead-letter topic."),
)


def escape_label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _labels(names: Iterable[str], values: Iterable[object]) -> str:
    pairs = [f'{n}="{escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(
        self, name: str, value: float, names: Iterable[str] = (), values: Iterable[object] = ()
    ) -> None:
        self.lines.append(f"{name}{_labels(names, values)} {format_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted list (q=1 is the maximum)."""
    if not sorted_values:
        return math.nan
    rank = max(math.ceil(q * len(sorted_values)), 1)
    return sorted_values[min(rank, len(sorted_values)) - 1]


def render(
    processor: MessagingProcessor, listeners: Iterable[Adapter] = (), limiter: Limiter | None = None
) -> str:
    """The exposition text; `limiter` adds the connection gauge and the limit refusal counter."""
    w = _Writer()
    m = processor.metrics
    for name, attr, label_names, help_text in _PROCESSOR_COUNTERS:
        w.family(name, "counter", help_text)
        counter: Mapping = getattr(m, attr)
        for key, value in sorted(counter.items(), key=lambda kv: str(kv[0])):
            values = key if isinstance(key, tuple) else (key,)
            w.sample(name, value, label_names, values)

    clients: Counter = Counter((c.protocol, c.kind.value) for c in processor.clients)
    w.family("gateway_clients", "gauge", "Registered clients by protocol and kind.")
    for (protocol, kind), n in sorted(clients.items()):
        w.sample("gateway_clients", n, ("protocol", "kind"), (protocol, kind))

    w.family("gateway_listener_up", "gauge", "1 when the protocol listener accepts connections.")
    for a in listeners:
        w.sample("gateway_listener_up", 1 if a.listening else 0, ("protocol",), (a.name,))

    if limiter is not None:
        _render_limits(w, limiter)

    stats = processor.store_stats()
    for key, help_text in _STORE_COUNTERS:
        name = f"gateway_store_{key}_total"
        w.family(name, "counter", help_text)
        w.sample(name, int(stats.get(key, 0)))  # type: ignore[arg-type]

    latencies = sorted(float(x) / 1000.0 for x in stats.get("flush_latency_ms", ()))  # type: ignore[union-attr]
    name = "gateway_store_flush_latency_seconds"
    w.family(
        name, "summary", "Commit log flush latency; quantiles over the most recent flushes (up to 1024)."
    )
    if latencies:
        for q in FLUSH_QUANTILES:
            w.sample(name, quantile(latencies, q), ("quantile",), (format_value(q),))
    w.sample(name + "_count", int(stats.get("flushes", 0)))  # type: ignore[arg-type]
    _render_disk(w, stats)
    return w.text()


def _render_disk(w: _Writer, stats: Mapping[str, object]) -> None:
    """The disk alarm (--disk-free-limit, docs/limits.md "Disk"). In CLUSTER mode the store stats are
    summed over the live store nodes: the alarm is 1 when any node refuses appends, the bytes are
    totals. Nothing is written when the store does not report them."""
    alarm, free, limit = (stats.get(k) for k in ("disk_alarm", "disk_free_bytes", "disk_free_limit_bytes"))
    if isinstance(alarm, int | float):
        name = "gateway_disk_alarm"
        w.family(name, "gauge", "1 while publishes are refused: free disk space below --disk-free-limit.")
        w.sample(name, 1 if alarm > 0 else 0)
    for name, value, help_text in (
        ("gateway_disk_free_bytes", free, "Free space of the data volume (at the last reading)."),
        ("gateway_disk_free_limit_bytes", limit, "The effective --disk-free-limit in bytes (0: off)."),
    ):
        if isinstance(value, int | float):
            w.family(name, "gauge", help_text)
            w.sample(name, int(value))


def _render_limits(w: _Writer, limiter: Limiter) -> None:
    name = "gateway_limit_refusals_total"
    w.family(name, "counter", "Connections refused and publishers throttled, by protocol and limit.")
    for (protocol, limit), n in sorted(limiter.refusals.items()):
        w.sample(name, n, ("protocol", "limit"), (protocol, limit))
    w.family("gateway_connections", "gauge", "Open connections counted against --max-connections.")
    for protocol, n in sorted(limiter.connections.items()):
        w.sample("gateway_connections", n, ("protocol",), (protocol,))


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(request: Request) -> Response:
    limiter = getattr(request.app.state, "limiter", None)
    return Response(render(get_processor(request), get_listeners(request), limiter), media_type=CONTENT_TYPE)
