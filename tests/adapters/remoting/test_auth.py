"""Authentication (ACL 1.0 signatures) and the ACL on the 4.x remoting adapter (issue 23): raw
signed requests, ali-ons with accessKey/secretKey and the C++ client with session credentials."""

from __future__ import annotations

import asyncio
import logging

import pytest

from messaging_processor.security import remoting_content, remoting_signature
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient
from tests.adapters.remoting.support import (
    ClientFailed,
    close_env,
    needs_alions,
    needs_cpp,
    open_env,
    received,
    run,
)

pytestmark = pytest.mark.timeout(240)
SECRET = "alice-secret-key"
RC = RequestCode
GROUPS = ("g-a", "g-js", "g-cpp", "g-x")


@pytest.fixture
async def aenv(tmp_path):
    e = await open_env(str(tmp_path / "data"), queues=2, auth=True)
    await e.processor.create_topic("RT", queues=2)
    sec = e.core.security
    await sec.add_user("alice", access_key="AK_ALICE", secret_key=SECRET)
    await sec.add_user("pubonly", access_key="AK_PUB", secret_key=SECRET)
    rule = sec.directory.add_rule
    await rule("user:alice", "topic", "RT/#", ("publish", "subscribe"), False)
    await rule("user:pubonly", "topic", "RT/#", ("publish",), False)
    for g in GROUPS:
        await rule("user:alice", "group", g, ("subscribe",), False)
        await rule("user:pubonly", "group", g, ("subscribe",), False)
    yield e
    await close_env(e)


def signed(ext: dict[str, str], body: bytes = b"", ak: str = "AK_ALICE", secret: str = SECRET) -> dict:
    """ext plus AccessKey and its ACL 1.0 Signature, as the 4.x clients send them."""
    fields = {**ext, "AccessKey": ak, "OnsChannel": "ALIYUN"}
    fields["Signature"] = remoting_signature(secret, remoting_content(fields, body))
    return fields


def send_ext(topic: str) -> dict[str, str]:
    return {
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0",
        "properties": "", "reconsumeTimes": "0", "unitMode": "false",
    }  # fmt: skip


def route(topic: str) -> dict[str, str]:
    return {"topic": topic}


# ---------------------------------------------------------------------------- raw requests


async def test_signed_request_passes_and_bad_ones_get_no_permission(aenv):
    c = await aenv.client()
    try:
        ok = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("RT"), b"hi"), b"hi")
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        bad = [
            signed(send_ext("RT"), b"hi", secret="wrong"),  # wrong secret
            signed(send_ext("RT"), b"hi", ak="AK_NOBODY"),  # unknown key
            send_ext("RT"),  # no credentials at all
            signed(send_ext("RT"), b"other body"),  # signed a different body than sent
        ]
        for ext in bad:
            r = await c.invoke(RC.SEND_MESSAGE, ext, b"hi")
            assert r.code == ResponseCode.NO_PERMISSION
            assert r.remark == "authentication failed"  # whatever was wrong
        again = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("RT"), b"hi"), b"hi")  # connection fine
        assert again.code == ResponseCode.SUCCESS
    finally:
        await c.close()
    fails = aenv.processor.metrics.auth_failures
    assert fails[("remoting", "bad_signature")] == 2
    assert fails[("remoting", "unknown_access_key")] == 1
    assert fails[("remoting", "missing_credentials")] == 1
    assert aenv.store.backlog("any", "RT") == 2


async def test_acl_on_routes_sends_pulls_and_offsets(aenv):
    c = await aenv.client()
    try:
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, signed(route("RT")))
        assert r.code == ResponseCode.SUCCESS
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, signed(route("SECRET")))
        assert r.code == ResponseCode.NO_PERMISSION
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, signed(route("RT"), ak="AK_PUB"))
        assert r.code == ResponseCode.SUCCESS  # publish alone gives the route
        r = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("SECRET"), b"x"), b"x")
        assert r.code == ResponseCode.NO_PERMISSION
        pull = {
            "consumerGroup": "g-a", "topic": "RT", "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
            "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0",
        }  # fmt: skip
        r = await c.invoke(RC.PULL_MESSAGE, signed(pull, ak="AK_PUB"))
        assert r.code == ResponseCode.NO_PERMISSION  # may not subscribe to the topic
        r = await c.invoke(RC.PULL_MESSAGE, signed({**pull, "consumerGroup": "other"}))
        assert r.code == ResponseCode.NO_PERMISSION  # may not use that group
        r = await c.invoke(RC.PULL_MESSAGE, signed(pull))
        assert r.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.SUCCESS)
        own_retry = {**pull, "topic": "%RETRY%g-a"}
        r = await c.invoke(RC.PULL_MESSAGE, signed(own_retry))  # its group's retry topic: the group suffices
        assert r.code != ResponseCode.NO_PERMISSION, r.remark
        off = {"consumerGroup": "g-a", "topic": "SECRET", "queueId": "0"}
        r = await c.invoke(RC.QUERY_CONSUMER_OFFSET, signed(off))
        assert r.code == ResponseCode.NO_PERMISSION
        r = await c.invoke(RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, signed({}))
        assert r.code == ResponseCode.NO_PERMISSION  # admins only
    finally:
        await c.close()
    assert aenv.processor.metrics.acl_denials[("remoting", "subscribe")] >= 3


async def test_deny_rule_wins_over_allow(aenv):
    await aenv.core.security.directory.add_rule("user:alice", "topic", "RT/secret", ("publish",), True)
    c = await aenv.client()
    try:
        ok = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("RT"), b"x"), b"x")
        assert ok.code == ResponseCode.SUCCESS
        denied = await c.invoke(
            RC.SEND_MESSAGE, signed({**send_ext("RT"), "properties": "TAGS\x01secret\x02"}, b"x"), b"x"
        )
        assert denied.code == ResponseCode.NO_PERMISSION
    finally:
        await c.close()


async def test_refused_login_never_logs_the_secret(aenv, caplog):
    caplog.set_level(logging.DEBUG)
    c = await aenv.client()
    try:
        r = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("RT"), b"x", secret="wrong-" + SECRET), b"x")
        assert r.code == ResponseCode.NO_PERMISSION
    finally:
        await c.close()
    assert "login refused" in caplog.text and "AK_ALICE" in caplog.text
    assert SECRET not in caplog.text


async def test_auth_off_ignores_credentials(tmp_path):
    e = await open_env(str(tmp_path / "off"), queues=2)
    try:
        c: RemotingClient = await e.client()
        r = await c.invoke(RC.SEND_MESSAGE, signed(send_ext("RT"), b"x", secret="whatever"), b"x")
        assert r.code == ResponseCode.SUCCESS
        await c.close()
    finally:
        await close_env(e)


# ---------------------------------------------------------------------------- real clients


def keys(ak: str = "AK_ALICE", sk: str = SECRET) -> list[str]:
    return ["--access-key", ak, "--secret-key", sk]


@needs_alions
@needs_cpp
async def test_real_clients_with_right_keys_produce_and_consume(aenv, tmp_path):
    home, ns = tmp_path / "home", ["--namesrv", aenv.addr]
    a_sent, c_sent = await asyncio.gather(
        run("alions", "produce", *ns, "--topic", "RT", "--count", "2", "--prefix", "js", *keys(), home=home),
        run("cpp", "produce", *ns, "--topic", "RT", "--count", "2", "--prefix", "cpp", *keys(), home=home),
    )
    assert [e["status"] for e in a_sent] == ["SEND_OK"] * 2 and [e["status"] for e in c_sent] == [0] * 2
    bodies = {e["body"] for e in a_sent + c_sent}
    a_got, c_got = await asyncio.gather(
        run(
            "alions", "consume", *ns, "--topic", "RT", "--group", "g-js", "--expect", "4", *keys(), home=home
        ),
        run("cpp", "consume", *ns, "--topic", "RT", "--group", "g-cpp", "--expect", "4", *keys(), home=home),
    )
    assert {e["body"] for e in received(a_got)} == bodies
    assert {e["body"] for e in received(c_got)} == bodies
    assert not aenv.processor.metrics.auth_failures  # every request of both clients was signed right


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_real_client_with_wrong_secret_is_refused(aenv, tmp_path, client):
    with pytest.raises(ClientFailed):
        await run(
            client, "produce", "--namesrv", aenv.addr, "--topic", "RT", *keys(sk="wrong"),
            home=tmp_path / "home", timeout=60,
        )  # fmt: skip
    assert aenv.processor.metrics.auth_failures[("remoting", "bad_signature")] >= 1
    assert aenv.store.backlog("any", "RT") == 0


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_real_client_denied_topic_is_refused(aenv, tmp_path, client):
    await aenv.processor.create_topic("SECRET")
    with pytest.raises(ClientFailed):
        await run(
            client, "produce", "--namesrv", aenv.addr, "--topic", "SECRET", *keys(),
            home=tmp_path / "home", timeout=60,
        )  # fmt: skip
    assert aenv.store.backlog("any", "SECRET") == 0
    assert not aenv.processor.metrics.auth_failures  # signed right: refused by the ACL
    assert sum(aenv.processor.metrics.acl_denials.values()) >= 1


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_real_client_allowed_publish_only_cannot_consume(aenv, tmp_path, client):
    home, ns = tmp_path / "home", ["--namesrv", aenv.addr]
    sent = await run(client, "produce", *ns, "--topic", "RT", *keys("AK_PUB"), home=home)
    assert len(sent) == 1
    with pytest.raises(ClientFailed):
        await run(
            client, "consume", *ns, "--topic", "RT", "--group", "g-x", "--expect", "1", "--timeout", "8",
            *keys("AK_PUB"), home=home,
        )  # fmt: skip
    assert aenv.store.backlog("g-x", "RT") == 1  # sent, never delivered
    assert aenv.processor.metrics.acl_denials[("remoting", "subscribe")] >= 1
