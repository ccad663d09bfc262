"""The security core: topic-filter algebra, ACL decisions, the KV directory, logins, and the
processor's authenticate / permits seam over a real store."""

from __future__ import annotations

import subprocess
import sys

import pytest

from messaging_processor import (
    Action,
    ClientContext,
    ErrorKind,
    Identity,
    LocalStoreClient,
    Message,
    MessagingProcessor,
    ProcessorError,
    Resource,
)
from messaging_processor.security import Grant, Security, grpc_signature, remoting_content, remoting_signature
from messaging_processor.security.paths import covers, matches, overlaps, split
from store import Store, StoreConfig


def test_matches_covers_overlaps() -> None:
    s = split
    assert matches(s("devices/+/telemetry"), s("devices/7/telemetry"))
    assert not matches(s("devices/+/telemetry"), s("devices/7/x"))
    assert matches(s("devices/#"), s("devices")) and matches(s("devices/#"), s("devices/a/b"))
    assert not matches(s("devices"), s("devices/a"))
    assert covers(s("devices/#"), s("devices/+/t")) and covers(s("devices/+/#"), s("devices/7/#"))
    assert not covers(s("devices/7/#"), s("devices/#"))
    assert not covers(s("devices/+"), s("devices/#"))
    assert overlaps(s("devices/7/#"), s("devices/#")) and overlaps(s("a/+/c"), s("a/b/+"))
    assert not overlaps(s("devices/7/#"), s("devices/8/#"))
    assert overlaps(s("a/#"), s("a")) and not overlaps(s("a/b"), s("a"))


@pytest.fixture
async def core(tmp_path):
    store = await Store.open(StoreConfig(data_dir=str(tmp_path), auto_create_topics=True))
    sec = Security(LocalStoreClient(store), poll_s=60)
    p = MessagingProcessor(LocalStoreClient(store), security=sec, auto_create_topics=True)
    await p.start()
    yield p, sec
    await p.close()
    await store.close()


async def _login(p: MessagingProcessor, user: str, password: str, cid: str = "c1") -> ClientContext:
    ctx = ClientContext("mqtt", cid, Identity(user, password, "mqtt-password"), "127.0.0.1:1")
    await p.authenticate(ctx)
    return ctx


async def test_password_login_and_refusals_say_nothing(core) -> None:
    p, sec = core
    await sec.add_user("dev7", password="pw7")
    ctx = await _login(p, "dev7", "pw7")
    assert ctx.identity.principal is not None and ctx.identity.secret is None
    for user, pw in (("dev7", "wrong"), ("nobody", "pw7")):
        with pytest.raises(ProcessorError) as e:
            await _login(p, user, pw)
        assert e.value.kind is ErrorKind.UNAUTHORIZED and str(e.value) == "authentication failed"
    with pytest.raises(ProcessorError):
        await p.authenticate(ClientContext("mqtt", "x", Identity()))
    assert p.metrics.auth_failures[("mqtt", "bad_password")] == 1
    assert p.metrics.auth_failures[("mqtt", "unknown_user")] == 1
    assert p.metrics.auth_failures[("mqtt", "missing_credentials")] == 1
    stored = await p.store.kv_get("security.users", "dev7")
    assert stored is not None and b"pw7" not in stored and b"argon2id" in stored


async def test_own_device_path_deny_wins_and_admin(core) -> None:
    p, sec = core
    await sec.add_user("dev7", password="pw")
    await sec.add_user("ops", password="pw", role="admin")
    d = sec.directory
    await d.add_rule("role:user", "topic", "devices/%u/#", ("publish",), False)
    await d.add_rule("anyone", "topic", "orders/#", ("publish", "subscribe"), False)
    await d.add_rule("user:dev7", "topic", "orders/secret/#", ("subscribe",), True)
    ctx = await _login(p, "dev7", "pw")
    ident = ctx.identity
    assert p.permits(ident, Action.PUBLISH, Resource("topic", "devices/dev7/telemetry"))
    assert not p.permits(ident, Action.PUBLISH, Resource("topic", "devices/dev8/telemetry"))
    assert not p.permits(ident, Action.SUBSCRIBE, Resource("topic", "devices/dev7/telemetry"))
    assert p.permits(ident, Action.SUBSCRIBE, Resource("topic", "orders/a"))
    assert not p.permits(ident, Action.SUBSCRIBE, Resource("topic", "orders/secret/x"))
    assert p.grant_subscription(ident, "orders/secret/#") is Grant.DENY
    assert p.grant_subscription(ident, "orders/#") is Grant.CHECK
    assert p.grant_subscription(ident, "orders/public/+") is Grant.ALLOW
    assert p.grant_subscription(ident, "devices/dev8/#") is Grant.DENY
    admin = (await _login(p, "ops", "pw", "c2")).identity
    assert p.permits(admin, Action.ADMIN, Resource("topic", "anything"))
    # a rule added later applies to the connection already open; deleting the user revokes it
    rule = await d.add_rule("user:dev7", "topic", "devices/dev7/#", ("publish",), True)
    assert not p.permits(ident, Action.PUBLISH, Resource("topic", "devices/dev7/telemetry"))
    await d.delete_rule(rule.id)
    assert p.permits(ident, Action.PUBLISH, Resource("topic", "devices/dev7/telemetry"))
    await d.delete_user("dev7")
    assert not p.permits(ident, Action.PUBLISH, Resource("topic", "devices/dev7/telemetry"))


async def test_send_checks_each_message_path(core) -> None:
    p, sec = core
    await sec.add_user("dev7", password="pw")
    await sec.directory.add_rule("anyone", "topic", "devices/%u/#", ("publish",), False)
    await sec.directory.add_rule("anyone", "topic", "orders/tagA", ("publish",), False)
    ctx = await _login(p, "dev7", "pw")
    own = Message("devices", b"x", properties={"mqtt.topic": "devices/dev7/t"})
    other = Message("devices", b"x", properties={"mqtt.topic": "devices/dev8/t"})
    assert len(await p.send(ctx, [own])) == 1
    with pytest.raises(ProcessorError) as e:
        await p.send(ctx, [own, other])
    assert e.value.kind is ErrorKind.FORBIDDEN
    assert len(await p.send(ctx, [Message("orders", b"x", tag="tagA")])) == 1
    with pytest.raises(ProcessorError):
        await p.send(ctx, [Message("orders", b"x")])
    assert p.metrics.acl_denials[("mqtt", "publish")] == 2


async def test_signatures_and_tokens(core) -> None:
    p, sec = core
    await sec.add_user("svc", access_key="AK1", secret_key="SK1")
    dt = "20261126T120000Z"
    good = Identity(
        "AK1", None, "mqv2-hmac-sha1", (("signature", grpc_signature("SK1", dt)), ("x-mq-date-time", dt))
    )
    ctx = ClientContext("grpc", "g1", good)
    await p.authenticate(ctx)
    assert ctx.identity.principal is not None and ctx.identity.principal.user == "svc"
    bad = Identity(
        "AK1", None, "mqv2-hmac-sha1", (("signature", grpc_signature("SK2", dt)), ("x-mq-date-time", dt))
    )
    with pytest.raises(ProcessorError):
        await p.authenticate(ClientContext("grpc", "g1", bad))
    ext = {"AccessKey": "AK1", "topic": "t", "b": "2"}
    content = remoting_content(ext, b"body")
    assert content == b"AK12tbody"
    ok = Identity("AK1", None, "remoting-acl", (("signature", remoting_signature("SK1", content)),))
    await p.authenticate(ClientContext("remoting", "r", ok), content)
    with pytest.raises(ProcessorError):
        await p.authenticate(ClientContext("remoting", "r", ok), content + b"!")
    token, text = await sec.directory.create_token("ci", "svc")
    tctx = ClientContext("http", "h", Identity(None, text, "bearer"))
    await p.authenticate(tctx)
    assert tctx.identity.principal is not None and tctx.identity.principal.token_id == token.id
    assert await sec.directory.revoke_token(token.id)
    assert not p.permits(tctx.identity, Action.ADMIN, Resource("topic", "x"))
    with pytest.raises(ProcessorError):
        await p.authenticate(ClientContext("http", "h", Identity(None, text, "bearer")))


async def test_directory_is_shared_through_the_store(core, tmp_path) -> None:
    p, sec = core
    other = Security(p.store, poll_s=60)
    await other.start()
    try:
        await sec.add_user("late", password="pw")
        # the other proxy re-reads on an unknown user instead of waiting for its poll
        principal = await other.login_password("late", "pw", "amqp")
        assert principal.user == "late"
        await sec.directory.add_rule("user:late", "topic", "a/#", ("publish",), False)
        assert await other.directory.refresh()
        assert other.permits(principal, "publish", "topic", "a/b") == (True, True)
    finally:
        await other.close()


def test_the_product_hashes_passwords_at_rfc_9106_low_memory_cost() -> None:
    """tests/conftest.py lowers the cost for in-process tests; a fresh interpreter (as a gateway
    runs) hashes with argon2id t=3, m=64 MiB, p=4, and so does its dummy hash for unknown users."""
    code = (
        "from messaging_processor.security import passwords as p; "
        "print(p.hash_password('x')); print(p.DUMMY_HASH)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    hashes = out.stdout.split()
    assert len(hashes) == 2 and all(h.startswith("$argon2id$v=19$m=65536,t=3,p=4$") for h in hashes), hashes
