"""Name-server requests answered by the gateway itself: GET_ROUTEINFO_BY_TOPIC (this listener is
the one broker of every topic), GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER and
GET_KV_CONFIG (no key-value config: QUERY_NOT_FOUND)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapters.remoting.errors import RemotingError
from messaging_processor import ErrorKind, ProcessorError
from remoting import (
    DEFAULT_TOPIC,
    RETRY_PREFIX,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    dumps_bytes,
    wants_standard_json,
)
from remoting import routes as rd

if TYPE_CHECKING:
    from adapters.remoting.requests import Request, Service


def _no_route(topic: str) -> RemotingError:
    return RemotingError(
        ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}"
    )


def _broker(svc: Service, req: Request) -> rd.BrokerData:
    return rd.BrokerData(svc.broker_name, svc.cluster_name, {0: svc.broker_address(req.conn)})


async def get_route(svc: Service, req: Request) -> RemotingCommand:
    topic = req.ext.str("topic")
    if topic == DEFAULT_TOPIC:
        # The producers' auto-create template: answered only when this gateway auto-creates topics.
        if not svc.processor.auto_create_topics:
            raise _no_route(topic)
        read = write = svc.default_queues
    else:
        try:
            # Retry topics of 4.x consumer groups are created when their consumers first ask.
            auto = True if topic.startswith(RETRY_PREFIX) else None
            read, write = await svc.queue_counts(req.ctx, topic, auto_create=auto)
        except ProcessorError as e:
            if e.kind in (ErrorKind.TOPIC_NOT_FOUND, ErrorKind.ILLEGAL_TOPIC):
                raise _no_route(topic) from None
            raise
    data = rd.route_data([_broker(svc, req)], [rd.QueueData(svc.broker_name, read, write)])
    return req.ok(body=rd.encode(data, wants_standard_json(req.cmd.version, req.cmd.ext_fields)))


async def get_cluster_info(svc: Service, req: Request) -> RemotingCommand:
    data = rd.cluster_info([_broker(svc, req)])
    return req.ok(body=rd.encode(data, wants_standard_json(req.cmd.version, req.cmd.ext_fields)))


async def get_topic_list(svc: Service, req: Request) -> RemotingCommand:
    topics = sorted(t.name for t in await svc.processor.list_topics())
    return req.ok(body=dumps_bytes({"topicList": topics}))


async def get_kv_config(svc: Service, req: Request) -> RemotingCommand:
    ns, key = req.ext.str("namespace", ""), req.ext.str("key", "")
    return req.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}")


HANDLERS = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: get_route,
    RequestCode.GET_BROKER_CLUSTER_INFO: get_cluster_info,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: get_topic_list,
    RequestCode.GET_KV_CONFIG: get_kv_config,
}
