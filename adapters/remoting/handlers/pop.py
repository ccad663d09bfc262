"""Pop consumption of 5.x remoting clients: POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME
(under both their 2000xx codes and the 16-bit values later clients send).

Each popped message carries POP_CK in RocketMQ's extraInfo layout
`ckOffset popTime invisibleTime reviveQid topicType brokerName queueId queueOffset`, plus a ninth
field with the processor's receipt handle (base64url), so that an ACK finds the handle even after
a proxy restart. Java clients rebuild extraInfo themselves after CHANGE_MESSAGE_INVISIBLETIME (8
fields, no handle): the latest handle of each popped (group, topic, queue, offset) is therefore
also remembered (`pop_handles.PopHandles`) until it is acked or its invisible time has long passed."""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING

from adapters.remoting import message_codec as wm
from adapters.remoting.clients import tag_filter
from adapters.remoting.errors import RemotingError
from adapters.remoting.mapping import to_wire
from adapters.remoting.message_codec import encode_message
from adapters.remoting.pop_handles import HandleKey
from remoting import RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service

R = ResponseCode


def _b64(handle: str) -> str:
    return base64.urlsafe_b64encode(handle.encode()).decode().rstrip("=")


def _unb64(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, ValueError):
        return None


def extra_info(offset: int, pop_time: int, invisible: int, broker: str, qid: int, handle: str) -> str:
    return f"{offset} {pop_time} {invisible} 0 0 {broker} {qid} {offset} {_b64(handle)}"


async def pop_message(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    group, topic = e.str("consumerGroup"), e.str("topic")
    invisible = e.int("invisibleTime", 60_000)
    poll = e.int("pollTime", 0)
    filt = tag_filter(e.str("exp", "*"), e.str("expType", "TAG"))
    if filt is None:
        raise RemotingError(R.SUBSCRIPTION_PARSE_FAILED, "only TAG expressions are supported (no SQL92)")
    max_n = min(max(e.int("maxMsgNums", 32), 1), svc.processor.limits.max_batch)
    pop_time = int(time.time() * 1000)
    ds = await svc.processor.pop(
        req.ctx, group, topic, filter=filt, max_messages=max_n, invisible_time_ms=invisible, long_poll_ms=poll
    )
    ext = {"popTime": str(pop_time), "invisibleTime": str(invisible), "reviveQid": "0", "restNum": "0"}
    if not ds:
        return req.reply(R.POLLING_TIMEOUT if poll > 0 else R.PULL_NOT_FOUND, "no new message", ext)
    parts, starts, offsets = [], {}, {}
    for d in ds:
        m = d.message
        qid, off = m.queue_id, m.queue_offset
        svc.pop_handles.put((group, topic, qid, off), d.receipt_handle, invisible)
        ck = extra_info(off, pop_time, invisible, svc.broker_name, qid, d.receipt_handle)
        extra = {wm.PROPERTY_POP_CK: ck, wm.PROPERTY_FIRST_POP_TIME: str(pop_time)}
        rec = to_wire(m, svc.store_host, extra=extra, reconsume_times=d.delivery_attempt - 1)
        parts.append(encode_message(rec))
        starts.setdefault(qid, off)
        offsets.setdefault(qid, []).append(off)
    ext["startOffsetInfo"] = ";".join(f"0 {q} {o}" for q, o in starts.items())
    ext["msgOffsetInfo"] = ";".join(f"0 {q} {','.join(map(str, os_))}" for q, os_ in offsets.items())
    ext["orderCountInfo"] = ""
    return req.ok(ext, b"".join(parts))


def _handle(svc: Service, req: Request) -> tuple[HandleKey, str]:
    e = req.ext
    info = e.str("extraInfo").split(" ")
    qid = e.int("queueId", int(info[6]) if len(info) > 6 and info[6].lstrip("-").isdigit() else -1)
    key = (e.str("consumerGroup"), e.str("topic"), qid, e.int("offset"))
    handle = svc.pop_handles.get(key)
    if handle is None and len(info) > 8:
        handle = _unb64(info[8])
    if handle is None:
        raise RemotingError(R.NO_MESSAGE, "receipt handle expired or not from this gateway")
    return key, handle


async def ack_message(svc: Service, req: Request) -> RemotingCommand:
    key, handle = _handle(svc, req)
    await svc.processor.ack(req.ctx, handle)
    svc.pop_handles.pop(key)
    return req.ok()


async def change_invisible_time(svc: Service, req: Request) -> RemotingCommand:
    key, handle = _handle(svc, req)
    invisible = req.ext.int("invisibleTime")
    new = await svc.processor.change_invisible_time(req.ctx, handle, invisible)
    svc.pop_handles.put(key, new, invisible)
    now = int(time.time() * 1000)
    return req.ok({"popTime": str(now), "invisibleTime": str(invisible), "reviveQid": "0"})


HANDLERS = {
    RequestCode.POP_MESSAGE: pop_message,
    RequestCode.POP_MESSAGE_SHORT: pop_message,
    RequestCode.ACK_MESSAGE: ack_message,
    RequestCode.ACK_MESSAGE_SHORT: ack_message,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: change_invisible_time,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME_SHORT: change_invisible_time,
}
