"""Pydantic models of the CloudEvents HTTP API (request and response bodies, for validation and the
OpenAPI document)."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .filters import DIALECTS, FilterError, compile_filters

MAX_INVISIBLE_MS = 12 * 3600 * 1000
_DURATION = re.compile(
    r"^P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:\.[0-9]+)?)S)?)?\Z", re.ASCII
)


def duration_ms(text: str) -> int:
    """ISO 8601 duration (`PT0.2S`, `PT1M30S`, `P1D`) -> milliseconds; ValueError otherwise."""
    m = _DURATION.match(text)
    if m is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as PT0.5S")
    d, h, mi, s = m.groups()
    total = int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)
    return round(total * 1000)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` inlined, for use inside an OpenAPI document (where
    `#/$defs/...` references would not resolve). Not for recursive models."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


# ----------------------------------------------------------------------------- events (documentation)
class CloudEventJSON(BaseModel):
    """A CloudEvent in the JSON format (structured mode; a batch is a JSON array of these)."""

    model_config = ConfigDict(extra="allow", title="CloudEvent")
    specversion: Literal["1.0"]
    id: str = Field(min_length=1)
    source: str = Field(min_length=1, description="URI-reference")
    type: str = Field(min_length=1)
    datacontenttype: str | None = Field(None, description="RFC 2046 media type of data")
    dataschema: str | None = Field(None, description="absolute URI")
    subject: str | None = None
    time: str | None = Field(None, description="RFC 3339 timestamp")
    data: Any = Field(None, description="JSON value, or a string for non-JSON media types")
    data_base64: str | None = Field(None, description="binary data, base64; excludes data")
    receipthandle: str | None = Field(
        None, description="pop responses only: the receipt handle to ack / nack this delivery with"
    )


class ProblemItem(BaseModel):
    detail: str
    attribute: str | None = None
    index: int | None = Field(None, description="position of the event in a batch")


class Problem(BaseModel):
    """RFC 9457 problem details (`application/problem+json`)."""

    type: str = "about:blank"
    title: str
    status: int
    kind: str
    detail: str
    errors: list[ProblemItem] = Field(default_factory=list, description="every invalid attribute found")


# ----------------------------------------------------------------------------- pull
class PopRequest(BaseModel):
    max_events: int = Field(16, ge=1, le=1024, description="most events returned (1 with structured Accept)")
    invisible_time_ms: int = Field(
        30_000, ge=0, le=MAX_INVISIBLE_MS, description="events stay invisible this long unless acked"
    )
    wait_ms: int = Field(0, ge=0, le=30_000, description="long polling: wait this long for an event")


class HandlesRequest(BaseModel):
    receipt_handles: list[str] = Field(min_length=1, max_length=1024)


class NackRequest(HandlesRequest):
    invisible_time_ms: int | None = Field(
        None,
        ge=0,
        le=MAX_INVISIBLE_MS,
        description="visible again after this long (0: now); absent: after the group's retry back-off",
    )


class HandleFailure(BaseModel):
    receipt_handle: str
    kind: str
    detail: str


class AckResult(BaseModel):
    acked: int
    failed: list[HandleFailure] = Field(default_factory=list)


class NackResult(BaseModel):
    receipt_handles: list[str | None] = Field(
        description="the new handle of each input handle (its old one stops working), null where it failed"
    )
    failed: list[HandleFailure] = Field(default_factory=list)


# ----------------------------------------------------------------------------- push subscriptions
class FilterSpec(BaseModel):
    """One Knative `filters` entry: exactly one dialect."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    exact: dict[str, str] | None = Field(None, description="attribute: value, equal")
    prefix: dict[str, str] | None = Field(None, description="attribute: non-empty prefix")
    suffix: dict[str, str] | None = Field(None, description="attribute: non-empty suffix")
    all: list[FilterSpec] | None = Field(None, description="every nested filter matches")
    any: list[FilterSpec] | None = Field(None, description="at least one nested filter matches")
    not_: FilterSpec | None = Field(None, alias="not", description="the nested filter does not match")
    cesql: str | None = Field(None, description="CESQL, e.g. type IN ('a','b') AND source LIKE '%x%'")

    @model_validator(mode="after")
    def _one_dialect(self) -> FilterSpec:
        set_ = [k for k in DIALECTS if self.as_spec().get(k) is not None]
        if len(set_) != 1:
            raise ValueError(f"a filter must have exactly one of {', '.join(DIALECTS)}")
        return self

    def as_spec(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class DeliverySpec(BaseModel):
    """Knative `spec.delivery` plus the gateway's own delivery options."""

    model_config = ConfigDict(extra="forbid")
    retry: int = Field(3, ge=0, le=1000, description="retries after the first attempt (Knative retry)")
    backoff_policy: Literal["exponential", "linear"] = Field(
        "exponential", description="before retry n: exponential delay*2^(n-1), linear delay*n"
    )
    backoff_delay: str = Field("PT0.2S", description="ISO 8601 duration (Knative backoffDelay)")
    retry_after_max: str | None = Field(
        "PT5M", description="longest Retry-After honoured (ISO 8601); null ignores Retry-After"
    )
    timeout: str = Field("PT10S", description="per-request timeout (ISO 8601)")
    dead_letter_sink: str | None = Field(None, description="http(s) URL; absent: the store DLQ %DLQ%<group>")
    max_inflight: int = Field(16, ge=1, le=1024, description="deliveries in flight at once")
    content_mode: Literal["binary", "structured"] = "binary"
    handshake: bool = Field(True, description="webhook OPTIONS handshake before the first delivery")
    origin: str | None = Field(None, description="WebHook-Request-Origin sent (default: this host's name)")

    @field_validator("backoff_delay", "timeout", "retry_after_max")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            ms = duration_ms(v)
            if ms > MAX_INVISIBLE_MS:
                raise ValueError(f"{v} is longer than 12 hours")
        return v

    @field_validator("dead_letter_sink")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)


class SubscriptionIn(BaseModel):
    """A push subscription: events of `topic` matching the filters go to `sink`."""

    model_config = ConfigDict(extra="forbid")
    topic: str = Field(min_length=1, max_length=127)
    sink: str = Field(description="http(s) URL the events are POSTed to")
    group: str | None = Field(None, description="consumer group (default ce-sub-<id>); shares load if reused")
    filter: dict[str, str] | None = Field(
        None, description="Knative filter.attributes: exact match, empty value = any value"
    )
    filters: list[FilterSpec] = Field(default_factory=list, description="Knative filters, ANDed")
    delivery: DeliverySpec = Field(default_factory=DeliverySpec)
    start: Literal["latest", "earliest"] = Field(
        "latest", description="a new group starts at the end of the topic (latest) or its beginning"
    )

    @field_validator("sink")
    @classmethod
    def _sink(cls, v: str) -> str:
        return _http_url(v)

    @model_validator(mode="after")
    def _filters_compile(self) -> SubscriptionIn:
        try:
            compile_filters(self.filter, [f.as_spec() for f in self.filters])
        except FilterError as e:
            raise ValueError(str(e)) from None
        return self


class SubscriptionRecord(SubscriptionIn):
    """What is stored in the processor's kv table under ce.subscriptions/<id>."""

    id: str
    group: str  # type: ignore[assignment]  # always set once created
    created_at: float


class SubscriptionStatus(BaseModel):
    state: Literal["starting", "active", "handshake_refused", "topic_not_found", "failed", "stopped"]
    detail: str = ""
    delivered: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    replies: int = 0
    inflight: int = 0


class Subscription(SubscriptionRecord):
    status: SubscriptionStatus
