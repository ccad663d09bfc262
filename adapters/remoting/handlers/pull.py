"""Consuming by offset: PULL_MESSAGE / LITE_PULL_MESSAGE (long polling), consumer offsets, queue
offsets, VIEW_MESSAGE_BY_ID.

A pull is a replayable range read of one queue (`processor.read`); consumer offsets are the
group's committed offsets in the store (`commit_offset` / `committed_offset`), the same progress
pop consumers of the group advance. Pull results follow the Java broker: SUCCESS with records in
the stored-message layout, PULL_NOT_FOUND at the end of the queue (after holding the request up
to suspendTimeoutMillis), PULL_RETRY_IMMEDIATELY when a tag filter skipped everything read,
PULL_OFFSET_MOVED for offsets outside the queue; every answer carries nextBeginOffset, minOffset,
maxOffset and suggestWhichBrokerId."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from adapters.remoting.clients import tag_filter
from adapters.remoting.errors import RemotingError
from adapters.remoting.mapping import to_wire
from adapters.remoting.message_codec import encode_message
from messaging_processor import ALL, Action, ErrorKind, Filter, ProcessorError, Resource
from remoting import RemotingCommand, RequestCode, ResponseCode
from remoting.codes import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service

SCAN_WINDOW = 4096  # queue entries one pull may skip over when a tag filter matches nothing
R = ResponseCode


def _filter(svc: Service, req: Request, group: str, topic: str, sys_flag: int) -> Filter:
    e = req.ext
    if sys_flag & PULL_SUBSCRIPTION and "subscription" in e:
        f = tag_filter(e.str("subscription"), e.str("expressionType", "TAG"))
    else:
        sub = svc.clients.subscription(group, topic)
        f = sub.filter if sub is not None else ALL
    if f is None:
        raise RemotingError(R.SUBSCRIPTION_PARSE_FAILED, "only TAG subscriptions are supported (no SQL92)")
    return f


async def pull_message(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    p = svc.processor
    group, topic = e.str("consumerGroup"), e.str("topic")
    qid, offset = e.int("queueId"), e.int("queueOffset")
    max_n = min(max(e.int("maxMsgNums", 32), 1), p.limits.max_batch)
    max_bytes = min(e.int("maxMsgBytes", svc.max_pull_bytes), svc.max_pull_bytes)
    sys_flag = e.int("sysFlag", 0)
    filt = _filter(svc, req, group, topic, sys_flag)
    if sys_flag & PULL_COMMIT_OFFSET:
        commit = e.int("commitOffset", -1)
        if commit >= 0:
            await p.commit_offset(req.ctx, group, topic, qid, commit)
    suspend_ms = e.int("suspendTimeoutMillis", 0) if sys_flag & PULL_SUSPEND else 0
    deadline = time.monotonic() + min(suspend_ms, p.limits.max_long_poll_ms) / 1000
    while True:
        try:
            lo, hi = await p.queue_offsets(topic, qid)
        except ProcessorError as err:
            if err.kind is ErrorKind.BAD_REQUEST:  # no such queue
                return _result(req, R.PULL_NOT_FOUND, 0, 0, 0)
            raise
        if offset < lo or (offset > hi and hi > 0):
            return _result(req, R.PULL_OFFSET_MOVED, lo if offset < lo else hi, lo, hi)
        if offset > hi:  # empty queue, offset beyond it
            return _result(req, R.PULL_OFFSET_MOVED if offset else R.PULL_NOT_FOUND, 0, lo, hi)
        if offset == hi:
            remaining = deadline - time.monotonic()
            if remaining > 0.001:
                await svc.hold.wait(topic, qid, offset, remaining)
                deadline = 0.0  # one wait: answer what the next look finds
                continue
            return _result(req, R.PULL_NOT_FOUND, offset, lo, hi)
        end = min(offset + SCAN_WINDOW, hi)
        msgs = await p.read(req.ctx, topic, qid, offset, end, max_n, filt, group=group)
        if not msgs:
            return _result(req, R.PULL_RETRY_IMMEDIATELY, end, lo, hi)
        parts: list[bytes] = []
        size = 0
        for m in msgs:
            rec = encode_message(to_wire(m, svc.store_host))
            if parts and size + len(rec) > max_bytes:
                break
            parts.append(rec)
            size += len(rec)
        last = msgs[len(parts) - 1].queue_offset
        nxt = last + 1 if len(parts) < len(msgs) or len(msgs) >= max_n else end
        return _result(req, R.SUCCESS, nxt, lo, hi, b"".join(parts))


def _result(req: Request, code: int, nxt: int, lo: int, hi: int, body: bytes = b"") -> RemotingCommand:
    ext = {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(nxt),
        "minOffset": str(lo),
        "maxOffset": str(hi),
    }
    return req.reply(code, None, ext, body)


async def query_consumer_offset(svc: Service, req: Request) -> RemotingCommand:
    """The group's committed offset. Never committed: 0 while the queue still starts at offset 0 (a
    Java broker answers so while message 0 is in memory), else QUERY_NOT_FOUND and the client's
    consumeFromWhere decides."""
    e = req.ext
    group, topic, qid = e.str("consumerGroup"), e.str("topic"), e.int("queueId")
    p = svc.processor
    try:
        off = await p.committed_offset(group, topic, qid)
        if off < 0:
            lo, _hi = await p.queue_offsets(topic, qid)
            if lo <= 0:
                off = 0
    except ProcessorError as err:
        if err.kind not in (ErrorKind.TOPIC_NOT_FOUND, ErrorKind.BAD_REQUEST):
            raise
        off = -1
    if off < 0:
        return req.reply(R.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
    return req.ok({"offset": str(off)})


async def update_consumer_offset(svc: Service, req: Request) -> RemotingCommand:
    """Commit a group's offset (every message below it is consumed). Negative offsets (what a
    client sends for a queue it has no offset for) are ignored."""
    e = req.ext
    off = e.int("commitOffset")
    if off >= 0:
        await svc.processor.commit_offset(
            req.ctx, e.str("consumerGroup"), e.str("topic"), e.int("queueId"), off
        )
    return req.ok()


async def _offsets(svc: Service, req: Request) -> tuple[int, int]:
    """(min, max) of a queue; (0, 0) for an unknown topic or queue, as the Java broker answers."""
    e = req.ext
    try:
        return await svc.processor.queue_offsets(e.str("topic"), e.int("queueId"))
    except ProcessorError as err:
        if err.kind in (ErrorKind.TOPIC_NOT_FOUND, ErrorKind.BAD_REQUEST):
            return 0, 0
        raise


async def get_max_offset(svc: Service, req: Request) -> RemotingCommand:
    return req.ok({"offset": str((await _offsets(svc, req))[1])})


async def get_min_offset(svc: Service, req: Request) -> RemotingCommand:
    return req.ok({"offset": str((await _offsets(svc, req))[0])})


async def search_offset(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    try:
        off = await svc.processor.search_offset(e.str("topic"), e.int("queueId"), e.int("timestamp"))
    except ProcessorError as err:
        if err.kind not in (ErrorKind.TOPIC_NOT_FOUND, ErrorKind.BAD_REQUEST):
            raise
        off = 0
    return req.ok({"offset": str(off)})


async def earliest_store_time(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    topic, qid = e.str("topic"), e.int("queueId")
    lo, hi = await _offsets(svc, req)
    ts = -1
    if hi > lo:
        msgs = await svc.processor.read(req.ctx, topic, qid, lo, hi, 1)
        if msgs:
            ts = msgs[0].store_timestamp
    return req.ok({"timestamp": str(ts)})


async def view_message(svc: Service, req: Request) -> RemotingCommand:
    """The message at a commit log offset (what a Java admin's viewMessage(offsetMsgId) asks)."""
    try:
        msg = await svc.processor.get_message_at(req.ext.int("offset"))
    except ProcessorError:
        return req.reply(R.SYSTEM_ERROR, f"can not find message by the offset, {req.ext.str('offset')}")
    if not svc.processor.permits(req.ctx.identity, Action.SUBSCRIBE, Resource("topic", msg.topic)):
        return req.reply(R.NO_PERMISSION, f"no permission to subscribe topic:{msg.topic}")
    return req.ok(body=encode_message(to_wire(msg, svc.store_host)))


HANDLERS = {
    RequestCode.PULL_MESSAGE: pull_message,
    RequestCode.LITE_PULL_MESSAGE: pull_message,
    RequestCode.QUERY_CONSUMER_OFFSET: query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: get_max_offset,
    RequestCode.GET_MIN_OFFSET: get_min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_store_time,
    RequestCode.VIEW_MESSAGE_BY_ID: view_message,
}
