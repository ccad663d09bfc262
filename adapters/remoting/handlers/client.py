"""Client bookkeeping requests: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP,
CHECK_CLIENT_CONFIG, LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (orderly consumers)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from adapters.remoting.errors import RemotingError
from remoting import RemotingCommand, RequestCode, ResponseCode, dumps_bytes, loads

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service

log = logging.getLogger("adapters.remoting")


def _body_json(req: Request) -> dict[str, Any]:
    if not req.cmd.body:
        return {}
    try:
        data = loads(req.cmd.body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise RemotingError(ResponseCode.SYSTEM_ERROR, "request body is not a JSON object")
    return data


async def heart_beat(svc: Service, req: Request) -> RemotingCommand:
    data = _body_json(req)
    client_id = str(data.get("clientID") or "")
    if client_id:
        req.conn.client_id = client_id
    svc.clients.heartbeat(req.conn, data, req.cmd.language, str(req.cmd.version))
    return req.ok()


async def unregister_client(svc: Service, req: Request) -> RemotingCommand:
    e = req.ext
    svc.clients.unregister(
        e.str("clientID", req.conn.client_id), e.str("producerGroup", ""), e.str("consumerGroup", "")
    )
    return req.ok()


async def consumer_list(svc: Service, req: Request) -> RemotingCommand:
    group = req.ext.str("consumerGroup")
    ids = svc.clients.consumer_ids(group)
    if not ids:
        return req.reply(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return req.ok(body=dumps_bytes({"consumerIdList": ids}))


async def check_client_config(svc: Service, req: Request) -> RemotingCommand:
    sub = _body_json(req).get("subscriptionData") or {}
    etype = str(sub.get("expressionType") or "TAG").upper()
    if etype not in ("TAG", ""):
        return req.reply(
            ResponseCode.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {etype}"
        )
    return req.ok()


def _queues(data: dict[str, Any]) -> list[tuple[str, str, int]]:
    out = []
    for mq in data.get("mqSet") or ():
        try:
            out.append((str(mq["topic"]), str(mq.get("brokerName", "")), int(mq["queueId"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


async def lock_batch(svc: Service, req: Request) -> RemotingCommand:
    data = _body_json(req)
    group = str(data.get("consumerGroup") or "")
    client = str(data.get("clientId") or req.conn.client_id)
    held = svc.clients.lock(group, client, _queues(data))
    body = {"lockOKMQSet": [{"brokerName": b, "queueId": q, "topic": t} for t, b, q in held]}
    return req.ok(body=dumps_bytes(body))


async def unlock_batch(svc: Service, req: Request) -> RemotingCommand:
    data = _body_json(req)
    svc.clients.unlock(
        str(data.get("consumerGroup") or ""), str(data.get("clientId") or req.conn.client_id), _queues(data)
    )
    return req.ok()


HANDLERS = {
    RequestCode.HEART_BEAT: heart_beat,
    RequestCode.UNREGISTER_CLIENT: unregister_client,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
    RequestCode.CHECK_CLIENT_CONFIG: check_client_config,
    RequestCode.LOCK_BATCH_MQ: lock_batch,
    RequestCode.UNLOCK_BATCH_MQ: unlock_batch,
}
