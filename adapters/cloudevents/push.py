"""Push delivery of one subscription: a DeliveryLoop pops the topic for the subscription's group and
POSTs each matching event to the sink, Knative-style.

- Handshake: before the first delivery (each start), `OPTIONS <sink>` with `WebHook-Request-Origin`;
  only a `WebHook-Allowed-Origin` of `*` or our origin grants (the status alone does not). A numeric
  `WebHook-Allowed-Rate` (requests per minute) is then respected. Refused: retried with back-off
  (1 s doubling to 60 s) while the events wait in the store. The dead-letter sink is asked too.
- Delivery: binary mode (or structured), `Prefer: reply`, keep-alive client. 2xx is delivered; a
  200 carrying a CloudEvent is a reply, stored back to the topic with `knativebrokerttl` set to the
  delivered event's (default 255) minus one, and dropped at 0 (so reply loops end); a reply that
  cannot be stored fails the delivery.
- Retry: on 404, 408, 409, 429, 5xx, 1xx/3xx, timeouts and connection errors, up to `retry` times;
  before retry n the event stays invisible for delay*2^(n-1) (exponential) or delay*n (linear), or
  for `Retry-After` when longer (capped by `retry_after_max`). The wait is the store's invisible time,
  so it frees the in-flight slot and survives a restart. Other 4xx: no retry.
- Dead letter: after the budget (or a non-retryable status) the original event goes to
  `dead_letter_sink` with `knativeerrordest`, `knativeerrorcode` (last status) and `knativeerrordata`
  (base64 of the first 1 KiB of the last response body); that delivery is retried likewise. Without
  a sink, or when it fails too, the message goes to the store's `%DLQ%<group>`.
- At most `max_inflight` deliveries at once (the DeliveryLoop's bound)."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from messaging_processor import (
    ClientContext,
    Delivery,
    DeliveryLoop,
    ErrorKind,
    Filter,
    Identity,
    Message,
    MessagingProcessor,
    Outcome,
    ProcessorError,
)
from runtime.tasks import cancel_and_wait

from . import codec
from .event import Event, canonical
from .filters import compile_filters
from .mapping import attributes_of, from_message
from .models import MAX_INVISIBLE_MS, SubscriptionRecord, SubscriptionStatus, duration_ms
from .webhook import WebhookClient, WebhookError, WebhookTimeout

log = logging.getLogger("adapters.cloudevents.push")

TTL_ATTR = "knativebrokerttl"
DEFAULT_TTL = 255
ERROR_DATA_MAX = 1024
MAX_ATTEMPTS = 1_000_000  # the group's store budget: this module decides when to dead-letter
PUSH_IDENTITY = Identity("$cloudevents-push", mechanism="internal")


@dataclass(slots=True)
class Attempt:
    """How one POST went."""

    ok: bool
    status: int | None = None
    retryable: bool = False
    retry_after_s: float | None = None
    body: bytes = b""
    error: str = ""
    reply: Event | None = None


@dataclass(slots=True)
class _Failed:
    """A message being dead-lettered: the sink's last answer and the dead-letter attempts so far."""

    last: Attempt
    dl_attempts: int = 0


@dataclass(slots=True)
class Counters:
    delivered: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    replies: int = 0
    state: str = "starting"
    detail: str = ""
    failing: dict[str, _Failed] = field(default_factory=dict)


def is_retryable(status: int) -> bool:
    return status in (404, 408, 409, 429) or status >= 500 or status < 200 or 300 <= status < 400


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now (delta-seconds or an HTTP date); None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_ms(policy: str, delay_ms: int, retry_number: int) -> int:
    """The wait before retry `retry_number` (1-based)."""
    n = max(retry_number, 1)
    ms = delay_ms * (2 ** (n - 1)) if policy == "exponential" else delay_ms * n
    return min(ms, MAX_INVISIBLE_MS)


class PushDeps(Protocol):
    """What a push subscription uses of its service (`service.CloudEvents` is one)."""

    processor: MessagingProcessor

    @property
    def client(self) -> WebhookClient:
        """The keep-alive webhook client every subscription shares."""
        ...

    async def store(self, ctx: ClientContext, topic: str, events: Sequence[Event]) -> None:
        """Store events (a subscriber's replies) as the ingest does."""
        ...


class Dispatcher:
    """Runs one push subscription until `stop()`."""

    def __init__(self, service: PushDeps, sub: SubscriptionRecord) -> None:
        self.service = service
        self.sub = sub
        d = sub.delivery
        self.timeout_s = duration_ms(d.timeout) / 1000
        self.delay_ms = duration_ms(d.backoff_delay)
        self.retry_after_max_s = None if d.retry_after_max is None else duration_ms(d.retry_after_max) / 1000
        self.origin = d.origin or socket.gethostname() or "msg-gateway"
        self.ctx = ClientContext("http", client_id=f"ce-push-{sub.id}", identity=PUSH_IDENTITY)
        self.counters = Counters()
        self._pred = compile_filters(sub.filter, [f.as_spec() for f in sub.filters])
        self._loop: DeliveryLoop | None = None
        self._task: asyncio.Task | None = None
        self._interval_s = 0.0  # from WebHook-Allowed-Rate
        self._next_send = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=f"ce push {self.sub.id}")

    async def stop(self, grace: float = 5.0) -> None:
        """Stop popping, let running deliveries finish for up to `grace` s, then cancel them."""
        if self._loop is not None:
            await self._loop.stop(grace)
        await cancel_and_wait(self._task)
        self._task = None
        self.counters.state = "stopped"

    def status(self) -> SubscriptionStatus:
        c = self.counters
        return SubscriptionStatus(
            state=c.state,  # type: ignore[arg-type]
            detail=c.detail,
            delivered=c.delivered,
            failed_attempts=c.failed_attempts,
            dead_lettered=c.dead_lettered,
            replies=c.replies,
            inflight=self._loop.inflight if self._loop is not None else 0,
        )

    def _set(self, state: str, detail: str = "") -> None:
        if (state, detail) != (self.counters.state, self.counters.detail):
            log.info("subscription %s: %s %s", self.sub.id, state, detail)
        self.counters.state, self.counters.detail = state, detail

    async def _supervise(self) -> None:
        backoff = 1.0
        p = self.service.processor
        while True:
            try:
                await p.query_route(self.ctx, self.sub.topic, auto_create=False)
            except ProcessorError as e:
                self._set("topic_not_found" if e.kind is ErrorKind.TOPIC_NOT_FOUND else "failed", e.message)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            refused = await self._handshakes() if self.sub.delivery.handshake else None
            if refused:
                self._set("handshake_refused", refused)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                continue
            backoff = 1.0
            e = await self._deliver_until_error()
            self._set("topic_not_found" if e.kind is ErrorKind.TOPIC_NOT_FOUND else "failed", e.message)
            await asyncio.sleep(backoff)

    async def _deliver_until_error(self) -> ProcessorError:
        """Run the delivery loop until it ends with a fatal error (topic deleted, forbidden)."""
        ended: asyncio.Future[ProcessorError] = asyncio.get_running_loop().create_future()

        def on_error(e: ProcessorError) -> None:
            if not ended.done():
                ended.set_result(e)

        d = self.sub.delivery
        self._loop = DeliveryLoop(
            self.service.processor,
            self.ctx,
            self.sub.group,
            self.sub.topic,
            self._handle,
            filter=Filter(predicate=self._matches) if self._pred is not None else Filter(),
            max_inflight=d.max_inflight,
            invisible_time_ms=min(int(self.timeout_s * 2000) + 5000, MAX_INVISIBLE_MS),
            long_poll_ms=20_000,
            batch=min(32, d.max_inflight),
            on_error=on_error,
        ).start()
        self._set("active")
        try:
            return await ended
        finally:
            loop, self._loop = self._loop, None
            if loop is not None:
                await loop.stop(0)

    def _matches(self, msg: Message) -> bool:
        try:
            return self._pred is None or self._pred(attributes_of(msg))
        except Exception:  # noqa: BLE001 - a filter must never break the store's pop
            log.exception("filter of subscription %s failed", self.sub.id)
            return False

    # ------------------------------------------------------------------ handshake
    async def _handshakes(self) -> str | None:
        """None when every target granted, else why not."""
        self._interval_s = 0.0
        dls = self.sub.delivery.dead_letter_sink
        for url in [self.sub.sink] + ([dls] if dls else []):
            why = await self._handshake(url)
            if why:
                return why
        return None

    async def _handshake(self, url: str) -> str | None:
        try:
            r = await self.service.client.request(
                "OPTIONS", url, [("webhook-request-origin", self.origin)], timeout=self.timeout_s
            )
        except WebhookError as e:
            return f"handshake with {url} failed: {e}"
        allowed = r.header("webhook-allowed-origin")
        if allowed is None or (allowed.strip() != "*" and allowed.strip() != self.origin):
            return (
                f"{url} did not grant origin {self.origin} "
                f"(status {r.status}, WebHook-Allowed-Origin {allowed!r})"
            )
        rate = (r.header("webhook-allowed-rate") or "").strip()
        if rate.isdigit() and int(rate) > 0:
            self._interval_s = max(self._interval_s, 60.0 / int(rate))
        return None

    # ------------------------------------------------------------------ delivery
    async def _handle(self, d: Delivery) -> Outcome:
        c = self.counters
        p = self.service.processor
        ev = from_message(d.message)
        budget = self.sub.delivery.retry + 1
        failing = c.failing.get(d.message.message_id)
        if failing is None and d.delivery_attempt > budget:
            failing = _Failed(Attempt(False, error="retry budget used up before a restart"))
        if failing is not None:
            return await self._dead_letter(d, ev, failing)
        result = await self._post(self.sub.sink, ev, expect_reply=True)
        if result.ok and result.reply is not None:
            try:
                await self._store_reply(ev, result.reply)
            except ProcessorError as e:
                result = Attempt(False, result.status, True, error=f"storing the reply failed: {e.message}")
        if result.ok:
            c.delivered += 1
            return Outcome.ACK
        c.failed_attempts += 1
        if result.retryable and d.delivery_attempt < budget:
            wait = self._wait_ms(result, d.delivery_attempt)
            await p.change_invisible_time(self.ctx, d.receipt_handle, wait)
            return Outcome.SETTLED
        failing = c.failing[d.message.message_id] = _Failed(result)
        return await self._dead_letter(d, ev, failing)

    def _wait_ms(self, result: Attempt, retry_number: int) -> int:
        d = self.sub.delivery
        ms = backoff_ms(d.backoff_policy, self.delay_ms, retry_number)
        if result.retry_after_s is not None and self.retry_after_max_s is not None:
            ms = max(ms, int(min(result.retry_after_s, self.retry_after_max_s) * 1000))
        return min(ms, MAX_INVISIBLE_MS)

    async def _dead_letter(self, d: Delivery, ev: Event, failing: _Failed) -> Outcome:
        c = self.counters
        p = self.service.processor
        mid = d.message.message_id
        dls = self.sub.delivery.dead_letter_sink
        last = failing.last
        if dls is not None:
            attrs = dict(ev.attributes)
            attrs["knativeerrordest"] = self.sub.sink
            if last.status is not None:
                attrs["knativeerrorcode"] = str(last.status)
            data = last.body[:ERROR_DATA_MAX] if last.body else last.error.encode()[:ERROR_DATA_MAX]
            if data:
                attrs["knativeerrordata"] = base64.b64encode(data).decode("ascii")
            failing.dl_attempts += 1
            r = await self._post(dls, Event(attrs, ev.data, ev.data_form), expect_reply=False)
            if r.ok:
                c.dead_lettered += 1
                c.failing.pop(mid, None)
                return Outcome.ACK
            if r.retryable and failing.dl_attempts < self.sub.delivery.retry + 1:
                wait = self._wait_ms(r, failing.dl_attempts)
                await p.change_invisible_time(self.ctx, d.receipt_handle, wait)
                return Outcome.SETTLED
            why = r.status or r.error
            log.warning("subscription %s: dead-letter sink refused %s: %s", self.sub.id, mid, why)
        reason = f"webhook {self.sub.sink}: {last.status or last.error}"
        await p.forward_to_dlq(self.ctx, d.receipt_handle, reason)
        c.failing.pop(mid, None)
        c.dead_lettered += 1
        return Outcome.SETTLED

    async def _post(self, url: str, ev: Event, *, expect_reply: bool) -> Attempt:
        if self.sub.delivery.content_mode == "structured":
            headers: list[tuple[str, str]] = [("content-type", codec.STRUCTURED)]
            body = codec.encode_structured(ev)
        else:
            headers, body = codec.encode_binary(ev)
        if self.sub.delivery.handshake:
            headers.append(("webhook-request-origin", self.origin))
        if expect_reply:
            headers.append(("prefer", "reply"))
        await self._pace()
        try:
            r = await self.service.client.request("POST", url, headers, body, timeout=self.timeout_s)
        except WebhookTimeout as e:
            return Attempt(False, retryable=True, error=f"timeout: {e}")
        except WebhookError as e:
            return Attempt(False, retryable=True, error=str(e))
        status = r.status
        if 200 <= status < 300:
            reply = None
            if expect_reply and status == 200 and r.content:
                try:
                    reply = codec.decode_reply(r.headers, r.content)
                except codec.CodecError as e:
                    log.info("subscription %s: ignoring an invalid reply: %s", self.sub.id, e)
            return Attempt(True, status, reply=reply)
        return Attempt(
            False,
            status,
            retryable=is_retryable(status),
            retry_after_s=parse_retry_after(r.header("retry-after")),
            body=r.content,
        )

    async def _pace(self) -> None:
        if self._interval_s <= 0:
            return
        now = time.monotonic()
        slot = max(now, self._next_send)
        self._next_send = slot + self._interval_s
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _store_reply(self, delivered: Event, reply: Event) -> None:
        try:
            ttl = int(canonical(delivered.attributes.get(TTL_ATTR, DEFAULT_TTL)))
        except ValueError:
            ttl = DEFAULT_TTL
        if ttl - 1 <= 0:
            log.info("subscription %s: reply %s dropped (%s exhausted)", self.sub.id, reply.id, TTL_ATTR)
            return
        reply.attributes[TTL_ATTR] = ttl - 1
        await self.service.store(self.ctx, self.sub.topic, [reply])
        self.counters.replies += 1
