"""What each 4.x request needs from the ACL (security on), after RocketMQ ACL 2.0's
`DefaultAuthorizationContextBuilder` for remoting requests:

- GET_ROUTEINFO_BY_TOPIC: publish or subscribe on the topic (the producers' template topic TBW102:
  nothing more than a valid signature);
- sends: publish on each message's path, checked by `MessagingProcessor.send`; a send to
  `%RETRY%<group>` (a consumer's failed send-back) and CONSUMER_SEND_MSG_BACK: subscribe on the group;
- PULL_MESSAGE, consumer offsets, LOCK/UNLOCK_BATCH_MQ, CHECK_CLIENT_CONFIG, HEART_BEAT (consumer
  data), ACK / CHANGE_INVISIBLE: subscribe on the consumer group and the topic; a group's own retry
  topic needs only the group (pop checks its topic and group itself);
- queue offsets (GET_MAX/MIN_OFFSET, SEARCH_OFFSET, GET_EARLIEST_MSG_STORETIME): subscribe on the
  topic (on the group for its retry topic); VIEW_MESSAGE_BY_ID: subscribe on the message's topic
  (checked by the handler once it knows it);
- GET_ALL_TOPIC_LIST_FROM_NAMESERVER: admin on every topic (`#`);
- the rest (cluster info, KV config, unregistering, END_TRANSACTION): a valid signature.

`needs(cmd)` returns the checks and whether the request concerns only a group's own retry topic, for
which the handler reads with the adapter's internal identity once the group check passed (the store
calls it makes would otherwise ask for the `%RETRY%<group>` topic as well)."""

from __future__ import annotations

import json
from typing import Any

from messaging_processor import Action, Identity, MessagingProcessor, Resource
from remoting import RETRY_PREFIX, RemotingCommand, RequestCode, loads, send_header

Check = tuple[Action, Resource]
SUB = Action.SUBSCRIBE
DEFAULT_TOPIC = "TBW102"

_SENDS = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})
_GROUP_TOPIC = frozenset(
    {
        RequestCode.PULL_MESSAGE,
        RequestCode.LITE_PULL_MESSAGE,
        RequestCode.QUERY_CONSUMER_OFFSET,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        RequestCode.ACK_MESSAGE,
        RequestCode.ACK_MESSAGE_SHORT,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME_SHORT,
    }
)
_TOPIC_ONLY = frozenset(
    {
        RequestCode.GET_MAX_OFFSET,
        RequestCode.GET_MIN_OFFSET,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        RequestCode.GET_EARLIEST_MSG_STORETIME,
    }
)
ANY_TOPIC = Resource("topic", "#")


def topic(name: str) -> Resource:
    return Resource("topic", name)


def group(name: str) -> Resource:
    return Resource("group", name)


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        data = loads(cmd.body) if cmd.body else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}  # the handler answers the malformed body
    return data if isinstance(data, dict) else {}


def _dicts(v: object) -> list[dict]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _topic_checks(t: str, g: str) -> list[Check]:
    """Subscribe on topic `t` (a retry topic: on its group) for consumer group `g`."""
    if t.startswith(RETRY_PREFIX):
        return [(SUB, group(t[len(RETRY_PREFIX) :]))]
    return [(SUB, topic(t))]


def needs(cmd: RemotingCommand) -> tuple[list[Check], bool]:
    """(the ACL checks `cmd` needs, whether it concerns only a group's own retry topic)."""
    code = cmd.code
    ext = cmd.ext_fields
    if code in _SENDS:
        t = send_header(ext).str("topic")
        return ([(SUB, group(t[len(RETRY_PREFIX) :]))], True) if t.startswith(RETRY_PREFIX) else ([], False)
    if code in _GROUP_TOPIC:
        t, g = ext.get("topic", ""), ext.get("consumerGroup", "")
        if t.startswith(RETRY_PREFIX):
            # only the group's own retry topic; another group's needs that group too
            return [(SUB, group(g)), *_topic_checks(t, g)], t == RETRY_PREFIX + g
        return [(SUB, group(g)), (SUB, topic(t))], False
    if code in _TOPIC_ONLY:
        t = ext.get("topic", "")
        return _topic_checks(t, ""), t.startswith(RETRY_PREFIX)
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return [(SUB, group(ext.get("group", "")))], True
    if code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
        return [(SUB, group(ext.get("consumerGroup", "")))], False
    if code == RequestCode.HEART_BEAT:
        checks: list[Check] = []
        for c in _dicts(_body(cmd).get("consumerDataSet")):
            g = str(c.get("groupName") or "")
            checks.append((SUB, group(g)))
            for s in _dicts(c.get("subscriptionDataSet")):
                t = str(s.get("topic") or "")
                if not t.startswith(RETRY_PREFIX):
                    checks.append((SUB, topic(t)))
        return checks, False
    if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        data = _body(cmd)
        checks = [(SUB, group(str(data.get("consumerGroup") or "")))]
        for mq in _dicts(data.get("mqSet")):
            t = str(mq.get("topic") or "")
            if not t.startswith(RETRY_PREFIX):
                checks.append((SUB, topic(t)))
        return checks, False
    if code == RequestCode.CHECK_CLIENT_CONFIG:
        data = _body(cmd)
        sub = data.get("subscriptionData")
        t = str(sub.get("topic") or "") if isinstance(sub, dict) else ""
        return [(SUB, group(str(data.get("group") or ""))), *_topic_checks(t, "")], False
    if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
        return [(Action.ADMIN, ANY_TOPIC)], False
    return [], False


def may_route(processor: MessagingProcessor, identity: Identity, name: str) -> bool:
    """GET_ROUTEINFO_BY_TOPIC: publish or subscribe on the topic (ACL 2.0's [PUB, SUB, GET]); a retry
    topic: subscribe on its group; the template topic TBW102: anyone signed in."""
    if name == DEFAULT_TOPIC:
        return True
    if name.startswith(RETRY_PREFIX):
        return processor.permits(identity, SUB, group(name[len(RETRY_PREFIX) :]))
    sec, p = processor.security, identity.principal
    if sec is not None and p is not None and sec.permits(p, Action.PUBLISH.value, "topic", name)[0]:
        return True  # (asked quietly: only a refusal of both is counted and logged)
    return processor.permits(identity, SUB, topic(name))
