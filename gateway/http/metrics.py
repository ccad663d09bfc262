"""GET /metrics and GET /metrics/per-object: Prometheus text exposition (format 0.0.4) of the
processor's, the listeners' and the store's numbers (docs/observability.md lists every metric).

Rendered by hand from `processor.metrics`, `processor.store_stats()` and the limiter at scrape time:
nothing on the message path touches Prometheus objects (an increment there is one dict update), and
the per-object gauges (consumer lag, in flight) are asked of the store only when scraped.

Per-object series (`gateway_topic_*`, `gateway_group_*`) are bounded: internal `%` topics and groups
are left out, and at most `max_objects` topics and groups are exported, the busiest first (messages
in + out for a topic, deliveries for a group; ties by name). `per_object=False` leaves them out of
/metrics; /metrics/per-object always serves them (as RabbitMQ's /metrics/per-object)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from adapters.base import Adapter
from adapters.limits import Limiter
from messaging_processor import MessagingProcessor, ProcessorError
from runtime.oslimits import ProcessLimits, open_fds

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
# per-object counters: (metric name, Metrics attribute, help); keys (protocol, topic)
_TOPIC_COUNTERS = (
    ("gateway_topic_messages_in_total", "messages_in", "Messages stored in the topic, by protocol."),
    ("gateway_topic_bytes_in_total", "bytes_in", "Body bytes stored in the topic, by protocol."),
    ("gateway_topic_messages_out_total", "messages_out", "Messages of the topic delivered, by protocol."),
)
# keys (group, topic, protocol)
_GROUP_COUNTERS = (
    ("gateway_group_deliveries_total", "deliveries", "Messages delivered to the group, by protocol."),
    (
        "gateway_group_redeliveries_total",
        "group_redeliveries",
        "Deliveries to the group with attempt > 1, by protocol.",
    ),
)
DEAD_LETTERS_PREFIX = "dead_letters:"  # Store.observed: dead_letters:<group>\t<topic> -> n
FSYNC_BUCKET_PREFIX = "fsync_seconds_bucket:"  # Store.observed (Histogram.flat): cumulative counts


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """--metrics-per-object (per-object series in /metrics) and --metrics-max-objects (the cap on
    topics and on groups exported, each)."""

    per_object: bool = True
    max_objects: int = 1000


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

    w.family(
        "gateway_connections_by_transport",
        "gauge",
        "Open connections by transport (MQTT: tcp, tls, ws, wss).",
    )
    for a in listeners:
        by_transport = getattr(a, "connections_by_transport", None)
        for transport, n in sorted(by_transport().items()) if by_transport is not None else ():
            w.sample("gateway_connections_by_transport", n, ("protocol", "transport"), (a.name, transport))

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
    _render_fsync(w, stats)
    _render_disk(w, stats)
    return w.text()


def _render_fsync(w: _Writer, stats: Mapping[str, object]) -> None:
    """The fsync latency histogram and the commit log's size (absent when the store does not report them)."""
    buckets = sorted(
        (float(k[len(FSYNC_BUCKET_PREFIX) :]), k[len(FSYNC_BUCKET_PREFIX) :], v)
        for k, v in stats.items()
        if k.startswith(FSYNC_BUCKET_PREFIX) and isinstance(v, int | float)
    )
    if buckets:
        name = "gateway_store_fsync_duration_seconds"
        w.family(name, "histogram", "Commit log fdatasync latency, request to completion (flush sync).")
        for _, le, n in buckets:
            w.sample(name + "_bucket", int(n), ("le",), (le,))
        w.sample(name + "_sum", float(stats.get("fsync_seconds_sum", 0.0)))  # type: ignore[arg-type]
        w.sample(name + "_count", int(stats.get("fsync_seconds_count", 0)))  # type: ignore[arg-type]
    size = stats.get("commitlog_bytes")
    if isinstance(size, int | float):
        name = "gateway_store_commitlog_bytes"
        w.family(name, "gauge", "Bytes retained in the commit log (tiered segments included).")
        w.sample(name, int(size))


def busiest(activity: Mapping[str, int], names: Iterable[str], limit: int) -> list[str]:
    """Up to `limit` of `names` without the internal `%` ones: the highest `activity` first, then by name."""
    unique = {n for n in names if not n.startswith("%")}
    return sorted(unique, key=lambda n: (-activity.get(n, 0), n))[: max(limit, 0)]


def dead_letters(stats: Mapping[str, object]) -> Counter:
    """(group, topic) -> messages the store moved to the group's dead-letter topic, from its stats."""
    out: Counter = Counter()
    for k, v in stats.items():
        if k.startswith(DEAD_LETTERS_PREFIX) and isinstance(v, int | float):
            group, _, topic = k[len(DEAD_LETTERS_PREFIX) :].partition("\t")
            out[(group, topic)] += int(v)
    return out


async def render_per_object(processor: MessagingProcessor, max_objects: int) -> str:
    """The per-topic and per-group series of at most `max_objects` topics and groups (module docstring)."""
    m = processor.metrics
    try:
        subscriptions = await processor.store.subscriptions()
    except Exception:  # noqa: BLE001 - a store node down: counters still render, gauges are skipped
        subscriptions = []
    dlq = dead_letters(processor.store_stats())
    topic_activity: Counter = Counter()
    for counter in (m.messages_in, m.messages_out):
        for (_, topic), n in counter.items():
            topic_activity[topic] += n
    group_activity: Counter = Counter()
    for (group, _, _), n in m.deliveries.items():
        group_activity[group] += n
    pairs = [*subscriptions, *dlq, *((g, t) for g, t, _ in m.deliveries)]
    topics = set(busiest(topic_activity, [*topic_activity, *(t for _, t in pairs)], max_objects))
    groups = set(busiest(group_activity, [*group_activity, *(g for g, _ in pairs)], max_objects))

    w = _Writer()
    for name, attr, help_text in _TOPIC_COUNTERS:
        w.family(name, "counter", help_text)
        for (protocol, topic), n in sorted(getattr(m, attr).items()):
            if topic in topics:
                w.sample(name, n, ("topic", "protocol"), (topic, protocol))

    lags: list[tuple[str, str, int, int]] = []
    for group, topic in sorted({(g, t) for g, t in subscriptions if g in groups and t in topics}):
        try:
            backlog, inflight = await processor.backlog(group, topic)
        except ProcessorError:  # deleted meanwhile
            continue
        lags.append((group, topic, max(backlog - inflight, 0), inflight))
    for name, index, help_text in (
        ("gateway_group_messages_ready", 2, "Consumer lag: messages the group has yet to receive."),
        ("gateway_group_messages_in_flight", 3, "Delivered to the group, not yet acked (invisible)."),
    ):
        w.family(name, "gauge", help_text)
        for lag in lags:
            w.sample(name, lag[index], ("group", "topic"), lag[:2])
    for name, attr, help_text in _GROUP_COUNTERS:
        w.family(name, "counter", help_text)
        for (group, topic, protocol), n in sorted(getattr(m, attr).items()):
            if group in groups and topic in topics:
                w.sample(name, n, ("group", "topic", "protocol"), (group, topic, protocol))
    name = "gateway_group_dead_letters_total"
    w.family(name, "counter", "Messages moved to the group's dead-letter topic %DLQ%<group>.")
    for (group, topic), n in sorted(dlq.items()):
        if group in groups and topic in topics:
            w.sample(name, n, ("group", "topic"), (group, topic))
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
    for name, counter, help_text in (
        ("gateway_connection_opens_total", limiter.opens, "Connections accepted, by protocol."),
        ("gateway_connection_closes_total", limiter.closes, "Connections ended, by protocol."),
    ):
        w.family(name, "counter", help_text)
        for protocol, n in sorted(counter.items()):
            w.sample(name, n, ("protocol",), (protocol,))


def _options(request: Request) -> MetricsOptions:
    return getattr(request.app.state, "metrics_options", None) or MetricsOptions()


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(request: Request) -> Response:
    """Every metric; the per-object ones unless --no-metrics-per-object."""
    processor, options = get_processor(request), _options(request)
    limiter = getattr(request.app.state, "limiter", None)
    text = render(processor, get_listeners(request), limiter)
    os_limits = getattr(request.app.state, "os_limits", None)
    if os_limits is not None:
        text += render_process_limits(os_limits)
    bridges = getattr(request.app.state, "bridges", lambda: None)()  # `[[bridge]]` links (bridge/)
    if bridges is not None:
        text += bridges.metrics()
    if options.per_object:
        text += await render_per_object(processor, options.max_objects)
    return Response(text, media_type=CONTENT_TYPE)


@router.get("/metrics/per-object", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics_per_object(request: Request) -> Response:
    """Only the per-topic and per-group series (whatever --metrics-per-object says)."""
    text = await render_per_object(get_processor(request), _options(request).max_objects)
    return Response(text, media_type=CONTENT_TYPE)


def render_process_limits(limits: ProcessLimits) -> str:
    """The descriptor and memory limits and how often they were the bound (runtime/oslimits.py)."""
    w = _Writer()
    w.family("gateway_fd_limit", "gauge", "The process's file descriptor limit (soft, after raising it).")
    w.sample("gateway_fd_limit", limits.fd_limit)
    w.family("gateway_open_fds", "gauge", "File descriptors the process holds open.")
    w.sample("gateway_open_fds", open_fds())
    name = "gateway_accept_errors_total"
    w.family(name, "counter", "Connections refused because accept() failed (asyncio loop), by errno.")
    for reason, n in sorted(limits.accept_errors.items()):
        w.sample(name, n, ("reason",), (reason,))
    name = "gateway_fd_limit_reached_total"
    w.family(name, "counter", "Seconds in which the process found no file descriptor free.")
    w.sample(name, limits.fd_limit_reached)
    if limits.memory_limit:
        w.family(
            "gateway_memory_limit_bytes",
            "gauge",
            "The smallest of RLIMIT_AS, RLIMIT_DATA, cgroup memory.max.",
        )
        w.sample("gateway_memory_limit_bytes", limits.memory_limit)
        name = "gateway_memory_limit_near_total"
        w.family(name, "counter", "Seconds in which resident memory was over 90 % of the memory limit.")
        w.sample(name, limits.memory_limit_near)
    return w.text()
