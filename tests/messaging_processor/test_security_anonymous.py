"""The anonymous principal of the security core (`allow_anonymous`): who it is, which rules apply to
it (those of subject `anonymous` only), that it is off by default, that credentials which do not
verify are never taken as anonymous, and that its rules go through the policy file like any other."""

from __future__ import annotations

import pytest

from messaging_processor import (
    Action,
    ClientContext,
    ErrorKind,
    Identity,
    LocalStoreClient,
    MessagingProcessor,
    ProcessorError,
    Resource,
)
from messaging_processor.security import Grant, Security, check_rule
from messaging_processor.security.policy_file import export_policy, parse_policy
from store import Store, StoreConfig


@pytest.fixture
async def core(tmp_path):
    store = await Store.open(StoreConfig(data_dir=str(tmp_path), auto_create_topics=True))
    sec = Security(LocalStoreClient(store), poll_s=60, allow_anonymous=True)
    p = MessagingProcessor(LocalStoreClient(store), security=sec, auto_create_topics=True)
    await p.start()
    yield p, sec
    await p.close()
    await store.close()


async def _anonymous(p: MessagingProcessor, cid: str = "dev-1", protocol: str = "mqtt") -> Identity:
    ctx = ClientContext(protocol, cid, Identity(), "127.0.0.1:1")
    await p.authenticate(ctx)
    return ctx.identity


def _topic(name: str) -> Resource:
    return Resource("topic", name)


async def test_no_credentials_is_the_anonymous_principal_with_no_rights_by_default(core) -> None:
    p, sec = core
    await sec.add_user("alice", password="pw")
    await sec.directory.add_rule("anyone", "topic", "#", ("publish", "subscribe"), False)
    ident = await _anonymous(p)
    assert ident.principal is not None and ident.principal.anonymous
    assert ident.username is None and ident.secret is None  # no user name: not counted per user
    await p.authorize(ident, Action.CONNECT, Resource("cluster", "mqtt"))  # admitted
    # `anyone` is every authenticated user, not the anonymous principal: nothing is allowed
    assert not p.permits(ident, Action.PUBLISH, _topic("a/b"))
    assert not p.permits(ident, Action.SUBSCRIBE, _topic("a/b"))
    assert p.grant_subscription(ident, "#") is Grant.DENY
    assert p.metrics.acl_denials[("mqtt", "publish")] == 1


async def test_rules_of_anonymous_decide_and_deny_wins(core) -> None:
    p, sec = core
    d = sec.directory
    await d.add_rule("anonymous", "topic", "test/#", ("publish", "subscribe"), False)
    await d.add_rule("anonymous", "topic", "test/nosubscribe", ("subscribe",), True)
    await d.add_rule("anonymous", "topic", "own/%c/#", ("publish",), False)
    await d.add_rule("anonymous", "topic", "home/%u/#", ("publish",), False)  # no user name: never
    ident = await _anonymous(p, "dev-7")
    assert p.permits(ident, Action.PUBLISH, _topic("test/x"))
    assert p.permits(ident, Action.SUBSCRIBE, _topic("test/x"))
    assert not p.permits(ident, Action.SUBSCRIBE, _topic("test/nosubscribe"))
    assert p.permits(ident, Action.PUBLISH, _topic("test/nosubscribe"))
    assert p.grant_subscription(ident, "test/nosubscribe") is Grant.DENY
    assert p.grant_subscription(ident, "test/#") is Grant.CHECK
    assert p.permits(ident, Action.PUBLISH, _topic("own/dev-7/t"))
    assert not p.permits(ident, Action.PUBLISH, _topic("own/dev-8/t"))
    for name in ("home/$anonymous/t", "home/%u/t", "home/x/t"):
        assert not p.permits(ident, Action.PUBLISH, _topic(name))
    assert not p.permits(ident, Action.ADMIN, Resource("cluster", "admin-api"))
    assert p.may_open_vhost(ident, "/") and not p.may_open_vhost(ident, "other")
    # a rule for anonymous applies to no authenticated user
    await sec.add_user("bob", password="pw")
    ctx = ClientContext("mqtt", "b", Identity("bob", "pw", "mqtt-password"))
    await p.authenticate(ctx)
    assert not p.permits(ctx.identity, Action.PUBLISH, _topic("test/x"))


async def test_a_rule_change_reaches_a_connected_anonymous_client(core) -> None:
    p, sec = core
    ident = await _anonymous(p)
    assert not p.permits(ident, Action.PUBLISH, _topic("t"))
    rule = await sec.directory.add_rule("anonymous", "topic", "t", ("publish",), False)
    assert p.permits(ident, Action.PUBLISH, _topic("t"))
    await sec.directory.delete_rule(rule.id)
    assert not p.permits(ident, Action.PUBLISH, _topic("t"))


async def test_bad_credentials_are_never_taken_as_anonymous(core) -> None:
    p, sec = core
    await sec.add_user("alice", password="pw")
    await sec.directory.add_rule("anonymous", "topic", "#", ("publish",), False)
    bad = (
        Identity("alice", "wrong", "mqtt-password"),
        Identity("nobody", "pw", "plain"),
        Identity("alice", None, "mqtt-password"),  # a user name without a password
        Identity(None, None, "plain"),  # malformed PLAIN
        Identity(None, "x", "bearer"),
        Identity(mechanism="http-empty"),
        Identity("AK", None, "mqv2-hmac-sha1", (("signature", "00"),)),
    )
    for ident in bad:
        ctx = ClientContext("http", "c", ident)
        with pytest.raises(ProcessorError) as e:
            await p.authenticate(ctx)
        assert e.value.kind is ErrorKind.UNAUTHORIZED
        assert ctx.identity.principal is None


async def test_off_by_default_no_credentials_are_refused(tmp_path) -> None:
    store = await Store.open(StoreConfig(data_dir=str(tmp_path)))
    sec = Security(LocalStoreClient(store), poll_s=60)
    assert sec.allow_anonymous is False
    p = MessagingProcessor(LocalStoreClient(store), security=sec)
    await p.start()
    try:
        await sec.directory.add_rule("anonymous", "topic", "#", ("publish",), False)
        with pytest.raises(ProcessorError) as e:
            await _anonymous(p)
        assert e.value.kind is ErrorKind.UNAUTHORIZED
        assert p.metrics.auth_failures[("mqtt", "missing_credentials")] == 1
    finally:
        await p.close()
        await store.close()


async def test_anonymous_rules_are_validated_exported_and_imported(core) -> None:
    p, sec = core
    check_rule("anonymous", "topic", "test/#", ("subscribe",))
    with pytest.raises(ValueError, match="anonymous"):
        check_rule("anon", "topic", "test/#", ("subscribe",))
    await sec.add_user("admin", password="pw", role="admin")
    rule = await sec.directory.add_rule("anonymous", "topic", "test/nosubscribe", ("subscribe",), True)
    text = export_policy(sec.directory)
    assert 'subject = "anonymous"' in text
    users, rules = parse_policy(text)
    assert [(r.id, r.subject, r.pattern, r.actions, r.deny) for r in rules] == [
        (rule.id, "anonymous", "test/nosubscribe", ("subscribe",), True)
    ]
    await sec.directory.delete_rule(rule.id)
    assert not sec.directory.rules
    await sec.directory.replace_policy(users, rules, replace_rules=True)
    assert sec.directory.rules[rule.id].subject == "anonymous"
    ident = await _anonymous(p)
    assert p.grant_subscription(ident, "test/nosubscribe") is Grant.DENY
