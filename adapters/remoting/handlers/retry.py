"""Consumer retries: CONSUMER_SEND_MSG_BACK, and sends to `%RETRY%<group>`.

4.x push consumers read by offset, so a failed message cannot be "un-acked": the consumer hands it
back by commit log offset and moves on. The gateway then stores a copy in the group's retry topic
`%RETRY%<group>` (which every clustering consumer subscribes to), delayed by

- the RocketMQ delay level the client asked for (`delayLevel` > 0: 1s 5s 10s 30s 1m ... 2h), or
- the consumer group's retry back-off (`delayLevel` 0, what ali-ons and the C++ client send):
  initial x multiplier^(attempt-1) capped at max, the same policy pop consumers get
  (`gateway group create NAME --retry-initial-ms ...`),

with RETRY_TOPIC = the original topic, ORIGIN_MESSAGE_ID, the same UNIQ_KEY and RECONSUME_TIME =
attempts so far (delivered as the record's reconsumeTimes). Once a message has been reconsumed
`maxReconsumeTimes` times (the request's, else the message's MAX_RECONSUME_TIMES, else the
group's max attempts - 1), or when `delayLevel` < 0, the copy goes to `%DLQ%<group>` instead."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from adapters.remoting import message_codec as wm
from adapters.remoting.errors import RemotingError
from adapters.remoting.mapping import delay_level_ms, to_store
from messaging_processor import ErrorKind, Message, MessageType, ProcessorError, RetryPolicy, SendReceipt
from remoting import DLQ_PREFIX, RETRY_PREFIX, Ext, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service

_POLICY_TTL_S = 10.0


async def _group_policy(svc: Service, group: str) -> tuple[int, RetryPolicy]:
    """(max attempts, retry back-off) of a consumer group, cached briefly."""
    hit = svc.group_policies.get(group)
    now = time.monotonic()
    if hit is not None and hit[1] > now:
        return hit[0]
    try:
        g = await svc.processor.get_group(group)
        value = (g.max_attempts, RetryPolicy(g.retry_initial_ms, g.retry_multiplier, g.retry_max_ms))
    except ProcessorError:
        value = (16, RetryPolicy())
    if len(svc.group_policies) > 10_000:
        svc.group_policies.clear()
    svc.group_policies[group] = (value, now + _POLICY_TTL_S)
    return value


def _reconsume_times(msg: Message) -> int:
    try:
        return int(msg.properties.get(wm.PROPERTY_RECONSUME_TIME, "0"))
    except ValueError:
        return 0


async def _find(svc: Service, offset: int | None, origin_msg_id: str) -> Message:
    if offset is not None and offset >= 0:
        try:
            return await svc.processor.get_message_at(offset)
        except ProcessorError:
            pass
    if origin_msg_id:
        try:
            return await svc.processor.get_message_at(wm.decode_offset_msg_id(origin_msg_id)[2])
        except (ValueError, ProcessorError):
            pass
        found = await svc.processor.get_message_by_id(origin_msg_id)
        if found:
            return found[-1]
    raise RemotingError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")


async def redeliver(
    svc: Service,
    req: Request,
    group: str,
    msg: Message,
    *,
    reconsume_times: int,
    delay_level: int = 0,
    max_reconsume: int | None = None,
    reason: str = "max reconsume times reached",
) -> SendReceipt:
    """Store the copy of `msg` that redelivers it to `group` (or dead-letters it); returns where."""
    max_attempts, policy = await _group_policy(svc, group)
    if max_reconsume is None or max_reconsume < 0:
        prop = msg.properties.get(wm.PROPERTY_MAX_RECONSUME_TIMES)
        max_reconsume = int(prop) if prop and prop.isdigit() else max_attempts - 1
    props = dict(msg.properties)
    origin_topic = props.get(wm.PROPERTY_RETRY_TOPIC) or msg.topic
    props.setdefault(wm.PROPERTY_RETRY_TOPIC, origin_topic)
    props.setdefault(wm.PROPERTY_ORIGIN_MESSAGE_ID, msg.message_id)
    dead = delay_level < 0 or reconsume_times >= max_reconsume
    now = int(time.time() * 1000)
    if dead:
        props.pop(wm.PROPERTY_RECONSUME_TIME, None)
        props.update(
            {"ORIGIN_TOPIC": origin_topic, "RECONSUME_TIMES": str(reconsume_times), "DLQ_REASON": reason}
        )
        topic, deliver_at = DLQ_PREFIX + group, 0
    else:
        props[wm.PROPERTY_RECONSUME_TIME] = str(reconsume_times + 1)
        delay = delay_level_ms(delay_level) if delay_level > 0 else policy.delay_ms(reconsume_times + 1)
        topic, deliver_at = RETRY_PREFIX + group, now + delay
    copy = Message(
        topic,
        msg.body,
        msg.tag,
        msg.keys,
        props,
        "",
        deliver_at,
        msg.message_id,
        msg.born_timestamp,
        msg.born_host,
        -1,
        MessageType.DELAY if deliver_at else MessageType.NORMAL,
    )
    r = await svc.processor.send_to_system_topic(req.ctx, copy)
    if not deliver_at:
        svc.hold.notify(r.topic, r.queue_id)
    return r


async def send_back(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    group = e.str("group")
    msg = await _find(svc, e.opt_int("offset"), e.str("originMsgId", ""))
    await redeliver(
        svc,
        req,
        group,
        msg,
        reconsume_times=_reconsume_times(msg),
        delay_level=e.int("delayLevel", 0),
        max_reconsume=e.opt_int("maxReconsumeTimes"),
    )
    return req.ok()


async def send_to_retry_topic(
    svc: Service, req: Request, h: Ext, topic: str, body: bytes, sys_flag: int
) -> RemotingCommand | None:
    """A producer sends to `%RETRY%<group>` itself (a consumer whose send-back failed)."""
    group = topic[len(RETRY_PREFIX) :]
    if not group:
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"illegal retry topic {topic!r}")
    msg = to_store(
        topic,
        body,
        wm.decode_properties(h.str("properties", "")),
        sys_flag=sys_flag,
        born_timestamp=h.int("bornTimestamp", 0),
        born_host=req.conn.remote,
    )
    reconsume = h.int("reconsumeTimes", 0) or _reconsume_times(msg)
    try:
        r = await redeliver(
            svc,
            req,
            group,
            msg,
            reconsume_times=max(reconsume - 1, 0),
            max_reconsume=h.opt_int("maxReconsumeTimes"),
        )
    except ProcessorError as err:
        if err.kind is ErrorKind.ILLEGAL_TOPIC:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, err.message) from None
        raise
    if req.cmd.is_oneway:
        return None
    host, port = svc.store_host
    return req.ok(
        {
            "msgId": wm.offset_msg_id(host, port, r.commitlog_offset),
            "queueId": str(r.queue_id),
            "queueOffset": str(r.queue_offset),
        }
    )


HANDLERS = {RequestCode.CONSUMER_SEND_MSG_BACK: send_back}
