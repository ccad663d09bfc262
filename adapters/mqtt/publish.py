"""Storing PUBLISHes (and wills): `processor.send` with the message's queue chosen by its full
path (CRC32 modulo the store topic's queue count, so one path's messages keep their order), the
retained value written before the answer, a store refusal mapped to an MQTT reason code.

Consecutive plain QoS 0/1 PUBLISHes of one read go out as one send (`publish_many`, the hot path).
A PUBLISH to `T/K/shadow/update` or `T/K/shadow/get` of a compacted topic T is a device shadow
request (messaging_processor/shadows.py): served, not stored as such, before the PUBACK.

While a root-wildcard subscription exists, a publish to a store topic without a fan-out loop starts
one first (reading from the topic's start), so the subscription sees the new topic at once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from messaging_processor import ClientContext, ErrorKind, Message, MessagingProcessor, ProcessorError
from messaging_processor.shadows import InvalidShadowRequest, ShadowError, ShadowService

from .caps import DEFAULT_CAPS, MqttCaps
from .codec import ReasonCode
from .mapping import P_TOPIC

if TYPE_CHECKING:
    from .fanout import Fanout
    from .retained import Retained

log = logging.getLogger("adapters.mqtt")

_ERROR_REASON = {
    ErrorKind.FORBIDDEN: ReasonCode.NOT_AUTHORIZED,
    ErrorKind.UNAUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    ErrorKind.ILLEGAL_TOPIC: ReasonCode.TOPIC_NAME_INVALID,
    ErrorKind.BODY_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    ErrorKind.PROPERTIES_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    ErrorKind.STORE_FULL: ReasonCode.QUOTA_EXCEEDED,
    ErrorKind.TOO_MANY_REQUESTS: ReasonCode.QUOTA_EXCEEDED,
}
# PUBLISHes to `T/K/shadow/update` and `T/K/shadow/get` of a compacted topic T are shadow requests
# (messaging_processor/shadows.py), served before the PUBACK instead of being stored.
_SHADOW_OPS = ("/shadow/update", "/shadow/get")


class Publisher:
    """Stores MQTT messages through the processor; answers are MQTT reason codes (0 = stored)."""

    def __init__(
        self, processor: MessagingProcessor, fanout: Fanout, retained: Retained, caps: MqttCaps = DEFAULT_CAPS
    ) -> None:
        self.processor = processor
        self.caps = caps
        # the caps' fast test, inlined on the publish path: a topic passing it is within the caps
        self._short_topic = caps.max_topic_length // 4  # characters (at most 4 bytes each)
        self._max_slashes = caps.max_topic_levels - 1
        self.fanout = fanout
        self.retained = retained
        self.shadows = ShadowService.for_processor(processor)

    async def publish(self, ctx: ClientContext, msg: Message, retain: bool) -> int:
        """Store one message (and the retained value); the MQTT reason code (0 = stored)."""
        topic = msg.topic
        path = msg.properties[P_TOPIC]
        if (len(path) > self._short_topic or path.count("/") > self._max_slashes) and not self.caps.topic_ok(
            path
        ):
            log.info("mqtt %s: publish to a topic over the length or level caps refused", ctx.client_id)
            return ReasonCode.TOPIC_NAME_INVALID
        if path.endswith(_SHADOW_OPS):
            rc = await self._shadow_request(ctx, msg, path)
            if rc is not None:
                return rc
        if retain and not self.retained.admits(msg):
            log.info("mqtt %s: retained message for %s refused: retained caps reached", ctx.client_id, topic)
            return ReasonCode.QUOTA_EXCEEDED
        fanout = self.fanout
        if fanout.wild_refs and topic not in fanout.loops:
            await fanout.ensure(topic, from_now=False)
        try:
            await self.processor.send(ctx, [msg], auto_create=True, receipts=False)
            if retain:
                await self.retained.keep(msg)
        except ProcessorError as e:
            if e.kind is ErrorKind.FORBIDDEN:  # the processor's audit log has it (once per path)
                log.debug("mqtt %s: publish to %s refused: %s", ctx.client_id, topic, e)
            else:
                log.info("mqtt %s: publish to %s refused: %s", ctx.client_id, topic, e)
            return _ERROR_REASON.get(e.kind, ReasonCode.UNSPECIFIED_ERROR)
        except Exception:  # noqa: BLE001
            log.exception("mqtt %s: publish to %s failed", ctx.client_id, topic)
            return ReasonCode.UNSPECIFIED_ERROR
        return 0

    def publish_nowait(self, ctx: ClientContext, msg: Message, on_done: Callable[[int], None]) -> bool:
        """`publish` of a non-retained message without a task when nothing but the store has to be
        awaited (MessagingProcessor.send_nowait); `on_done(reason code)` once stored. False: use
        `publish` (nothing done)."""
        path = msg.properties[P_TOPIC]
        if len(path) > self._short_topic or path.count("/") > self._max_slashes or path.endswith(_SHADOW_OPS):
            return False
        fanout = self.fanout
        if fanout.wild_refs and msg.topic not in fanout.loops:
            return False

        def done(e: ProcessorError | None) -> None:
            if e is None:
                on_done(0)
                return
            if e.kind is ErrorKind.FORBIDDEN:
                log.debug("mqtt %s: publish to %s refused: %s", ctx.client_id, msg.topic, e)
            else:
                log.info("mqtt %s: publish to %s refused: %s", ctx.client_id, msg.topic, e)
            on_done(_ERROR_REASON.get(e.kind, ReasonCode.UNSPECIFIED_ERROR))

        return self.processor.send_nowait(ctx, msg, done)

    async def _shadow_request(self, ctx: ClientContext, msg: Message, path: str) -> int | None:
        """Serve a shadow request; its reason code, or None when `path` is no shadow request."""
        try:
            if not await self.shadows.device_request(ctx, msg.topic, path, msg.body):
                return None
        except ShadowError as e:  # the device got the reason on `.../rejected` too
            log.info("mqtt %s: shadow request %s refused: %s", ctx.client_id, path, e.message)
            if isinstance(e, InvalidShadowRequest):
                return ReasonCode.PAYLOAD_FORMAT_INVALID
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        except ProcessorError as e:
            log.info("mqtt %s: shadow request %s refused: %s", ctx.client_id, path, e)
            return _ERROR_REASON.get(e.kind, ReasonCode.UNSPECIFIED_ERROR)
        except Exception:  # noqa: BLE001
            log.exception("mqtt %s: shadow request %s failed", ctx.client_id, path)
            return ReasonCode.UNSPECIFIED_ERROR
        return 0

    async def publish_many(self, ctx: ClientContext, msgs: list[Message]) -> list[int]:
        """Store non-retained messages with as few processor sends as possible; a reason code per
        message (a refused batch is retried one by one to find which message was refused)."""
        p = self.processor
        fanout = self.fanout
        topic_ok, short, slashes = self.caps.topic_ok, self._short_topic, self._max_slashes
        try:
            for m in msgs:
                path = m.properties[P_TOPIC]
                if (len(path) > short or path.count("/") > slashes) and not topic_ok(path):
                    raise ValueError("topic over the caps")  # answered per message below
                if path.endswith(_SHADOW_OPS):
                    raise ValueError("a shadow request")  # served one by one below, in order
                topic = m.topic
                if fanout.wild_refs and topic not in fanout.loops:
                    await fanout.ensure(topic, from_now=False)
            step = p.limits.max_batch
            for i in range(0, len(msgs), step):
                await p.send(ctx, msgs[i : i + step], auto_create=True, receipts=False)
        except ProcessorError as e:
            if e.kind is not ErrorKind.NOT_REPLICATED:
                return [await self.publish(ctx, m, False) for m in msgs]
            # stored, not yet replicated: refused (the client may resend), never stored again here
            return [_ERROR_REASON.get(e.kind, ReasonCode.UNSPECIFIED_ERROR)] * len(msgs)
        except Exception:  # noqa: BLE001 - answered per message below
            return [await self.publish(ctx, m, False) for m in msgs]
        return [0] * len(msgs)
