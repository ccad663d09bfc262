"""Producing: SEND_MESSAGE (long header names), SEND_MESSAGE_V2 (short names), SEND_BATCH_MESSAGE
(and code 10/310 with `batch` true/1), END_TRANSACTION.

A single message goes through the send batcher (concurrent sends share one store append); a batch
goes to `processor.send` as one list. The reply's `msgId` is the offset message id (store host +
commit log offset), as a Java broker answers; the message's own id is its UNIQ_KEY (or the id the
store assigned, which consumers see as UNIQ_KEY). Sends to `%RETRY%<group>` (what clients do when
CONSUMER_SEND_MSG_BACK fails) are stored as retry copies, or in `%DLQ%<group>` once the message
used up its reconsume times, like the broker's handleRetryAndDLQ."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from adapters.remoting import message_codec as wm
from adapters.remoting.errors import RemotingError
from adapters.remoting.handlers import retry
from adapters.remoting.mapping import to_store
from adapters.remoting.message_codec import MessageCodecError, decode_batch, decode_properties, offset_msg_id
from messaging_processor import ErrorKind, Message, MessageType, ProcessorError, SendReceipt
from remoting import RETRY_PREFIX, HeaderError, RemotingCommand, RequestCode, ResponseCode, send_header
from remoting.codes import (
    COMPRESSION_ZLIB,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_TYPE_MASK,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
)

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service


def _inflate(body: bytes, sys_flag: int, limit: int) -> bytes:
    ctype = (sys_flag & SYSFLAG_COMPRESSION_TYPE_MASK) >> 8
    if ctype not in (0, COMPRESSION_ZLIB):
        name = {1: "LZ4", 2: "ZSTD"}.get(ctype, str(ctype))
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"compression type {name} is not supported")
    try:
        z = zlib.decompressobj()
        out = z.decompress(body, limit + 1)
    except zlib.error as e:
        raise RemotingError(
            ResponseCode.MESSAGE_ILLEGAL, f"compressed body cannot be inflated: {e}"
        ) from None
    if len(out) > limit or z.unconsumed_tail:
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"inflated body exceeds {limit} bytes")
    return out


async def send_message(svc: Service, req: Request) -> RemotingCommand | None:
    cmd = req.cmd
    h = send_header(cmd.ext_fields)
    topic = h.str("topic")
    sys_flag = h.int("sysFlag", 0)
    queue_id = h.int("queueId", -1)
    batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or h.bool("batch")
    body = cmd.body
    if sys_flag & SYSFLAG_COMPRESSED:
        body = _inflate(body, sys_flag, svc.processor.limits.max_body_size * (64 if batch else 1))
        sys_flag &= ~(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_TYPE_MASK)
    if topic.startswith(RETRY_PREFIX) and not batch:
        return await retry.send_to_retry_topic(svc, req, h, topic, body, sys_flag)
    if queue_id >= 0:
        n = (await svc.queue_counts(req.ctx, topic))[0]  # (a sealed queue's id: the store maps it)
        queue_id = queue_id % n if n else -1
    common = {
        "sys_flag": sys_flag,
        "queue_id": queue_id,
        "born_timestamp": h.int("bornTimestamp", 0),
        "born_host": req.conn.remote,
    }
    if batch:
        try:
            items = decode_batch(body)
        except MessageCodecError as e:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"batch body does not decode: {e}") from None
        if not items:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        msgs = [to_store(topic, it.body, it.properties, flag=it.flag, **common) for it in items]
        for m in msgs:
            if m.msg_type in (MessageType.TRANSACTION, MessageType.DELAY):
                raise RemotingError(
                    ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be delayed or transactional"
                )
        _within_rate(svc, req, len(msgs), sum(len(m.body) for m in msgs))
        receipts = await _send(svc, req, msgs)
    else:
        msg = to_store(
            topic, body, decode_properties(h.str("properties", "")), flag=h.int("flag", 0), **common
        )
        _within_rate(svc, req, 1, len(msg.body))
        receipts = [await _send_one(svc, req, msg)]
    if cmd.is_oneway:
        return None
    first = receipts[0]
    host, port = svc.store_host
    ext = {
        "msgId": ",".join(offset_msg_id(host, port, r.commitlog_offset) for r in receipts),
        "queueId": str(first.queue_id),
        "queueOffset": str(first.queue_offset),
        wm.PROPERTY_MSG_REGION: "DefaultRegion",
        wm.PROPERTY_TRACE_SWITCH: "true",
    }
    if first.transaction_id:
        ext["transactionId"] = first.message_id
    return req.ok(ext)


def _within_rate(svc: Service, req: Request, msgs: int, nbytes: int) -> None:
    """Charge a send to its connection's and user's publish rates; RemotingError(SYSTEM_BUSY) when
    over them (adapters/remoting/limits.py). Free when publish rates are off."""
    limits = svc.limits
    if limits is None or not limits.limiter.settings.publish_limited:
        return
    conn = req.conn
    if conn.meter is None:
        conn.meter = limits.meter(req.ctx.identity.username or None)
    if conn.meter is not None and (busy := limits.over_rate(conn.meter, msgs, nbytes)) is not None:
        raise RemotingError(*busy)


async def _send_one(svc: Service, req: Request, msg: Message) -> SendReceipt:
    try:
        r = await svc.batcher.send(req.ctx, msg)
    except ProcessorError as e:
        if e.kind is ErrorKind.TOPIC_NOT_FOUND:
            svc.forget_topic(msg.topic)
        raise
    svc.hold.notify(r.topic, r.queue_id)
    return r


async def _send(svc: Service, req: Request, msgs: list[Message]) -> list[SendReceipt]:
    try:
        receipts = await svc.processor.send(req.ctx, msgs)
    except ProcessorError as e:
        if e.kind is ErrorKind.TOPIC_NOT_FOUND:
            svc.forget_topic(msgs[0].topic)
        raise
    for r in receipts:
        svc.hold.notify(r.topic, r.queue_id)
    return receipts


async def end_transaction(svc: Service, req: Request) -> RemotingCommand | None:
    """Commit (0x8) or roll back (0xC) a half message; NOT_TYPE (0, "unknown") leaves it for the check."""
    e = req.ext
    kind = e.int("commitOrRollback")
    if kind not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
        return req.ok()
    if "commitLogOffset" in e:
        tid = str(e.int("commitLogOffset"))
    else:
        try:
            tid = str(wm.decode_offset_msg_id(e.str("msgId"))[2])
        except ValueError:
            raise HeaderError("END_TRANSACTION needs commitLogOffset or an offset msgId") from None
    r = await svc.processor.end_transaction(
        req.ctx, tid, kind == SYSFLAG_TRANSACTION_COMMIT, message_id=e.str("msgId", "")
    )
    if r is not None:
        svc.hold.notify(r.topic, r.queue_id)
    return req.ok()


HANDLERS = {
    RequestCode.SEND_MESSAGE: send_message,
    RequestCode.SEND_MESSAGE_V2: send_message,
    RequestCode.SEND_BATCH_MESSAGE: send_message,
    RequestCode.END_TRANSACTION: end_transaction,
}
