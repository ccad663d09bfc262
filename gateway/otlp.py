"""OpenTelemetry export of message trace events as spans (`--otlp-endpoint`).

The TraceRecorder (messaging_processor/tracing.py) hands every flushed batch of events to
`OtlpExport.export`; each event becomes one span in the message's own trace (trace id and parent
span id from its trace context: the `traceparent` its client sent, else the one derived from its id
or made by the gateway, which no consumer is given), so a Jaeger or Tempo that already has the
producer's and the consumer's spans shows the gateway hop between them. The OpenTelemetry SDK's
BatchSpanProcessor sends them over OTLP/HTTP (protobuf) from its own thread: the event loop only
builds spans.

The SDK rather than hand-written OTLP: it is the reference encoder and exporter (batching, retries,
the protobuf schema), and a user's collector expects exactly what it sends."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from messaging_processor.tracing import valid_traceparent

log = logging.getLogger("gateway.otlp")

_KINDS = {"received": SpanKind.SERVER, "delivered": SpanKind.PRODUCER}


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint given with or without its `/v1/traces` path."""
    url = endpoint.rstrip("/")
    return url if url.endswith("/v1/traces") else url + "/v1/traces"


class OtlpExport:
    """Spans of trace events, exported to `endpoint` (or to `exporter`, synchronously: tests)."""

    def __init__(self, endpoint: str, *, exporter: SpanExporter | None = None) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "msg-gateway"}))
        if exporter is None:
            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)))
            )
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("msg-gateway.message-trace")
        self.skipped = 0  # events without a trace context (a message gone before its event was exported)

    def export(self, rows: Sequence[list[Any]]) -> None:
        """One span per event row (messaging_processor/tracing.py `Row`)."""
        tracer = self.tracer
        for r in rows:
            event, ms, protocol, client, user, group, qid, offset, attempt, detail, mid, tp, topic = r[:13]
            if not valid_traceparent(tp):
                self.skipped += 1
                continue
            parent = SpanContext(
                trace_id=int(tp[3:35], 16),
                span_id=int(tp[36:52], 16),
                is_remote=True,
                trace_flags=TraceFlags(int(tp[53:55], 16)),
            )
            attrs: dict[str, Any] = {
                "messaging.system": "msg-gateway",
                "messaging.operation.name": event,
                "messaging.destination.name": topic or "",
                "network.protocol.name": protocol,
                "messaging.client.id": client or "",
            }
            for key, value in (
                ("messaging.message.id", mid),
                ("messaging.consumer.group.name", group),
                ("messaging.destination.partition.id", None if qid is None else str(qid)),
                ("messaging.gateway.offset", offset),
                ("messaging.gateway.attempt", attempt),
                ("messaging.gateway.detail", detail),
                ("enduser.id", user),
            ):
                if value is not None:
                    attrs[key] = value
            t = ms * 1_000_000
            span = tracer.start_span(
                f"{event} {topic or ''}".rstrip(),
                context=trace.set_span_in_context(NonRecordingSpan(parent)),
                kind=_KINDS.get(event, SpanKind.INTERNAL),
                attributes=attrs,
                start_time=t,
            )
            span.end(end_time=t)

    def force_flush(self) -> bool:
        return self.provider.force_flush()

    def shutdown(self) -> None:
        """Send what is batched and stop the exporter thread."""
        try:
            self.provider.shutdown()
        except Exception as e:  # noqa: BLE001 - at shutdown a collector that is gone is no error
            log.warning("OTLP exporter shutdown: %s", e)
