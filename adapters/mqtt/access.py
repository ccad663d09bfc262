"""The ACL as MQTT sessions apply it (docs/security.md), over the processor's one ACL model.

With `processor.security` None every check here allows (and costs one attribute test). Otherwise:

- A SUBSCRIBE filter (`$share/<group>/` stripped) gets `processor.grant_subscription`: DENY refuses
  it in the SUBACK; ALLOW and CHECK are granted, and the Sub remembers whether each delivered path
  must be checked (`Sub.check`) and the directory version of that decision (`Sub.acl_version`).
- Every delivery (fan-out, persistent session, shared subscription, retained) of a Sub that needs a
  check, or whose decision is of an older directory version (rules changed since), asks
  `processor.permits(identity, SUBSCRIBE, topic <path>)` of the receiving session's identity, a
  cached dict lookup per (connection, path).
- A persistent session's subscriptions are decided again for each connection that resumes it: a
  different user may present the same client id.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from messaging_processor import Action, Identity, MessagingProcessor, Resource
from messaging_processor.security import Grant

if TYPE_CHECKING:
    from .subscription import Sub


def acl_version(processor: MessagingProcessor) -> int:
    """The version of the rules decisions are made on (0 with security off)."""
    sec = processor.security
    return 0 if sec is None else sec.directory.version


def decide(processor: MessagingProcessor, identity: Identity, inner_filter: str) -> Grant:
    """The grant of a subscription filter (without `$share/<group>/`) for `identity`."""
    if processor.security is None:
        return Grant.ALLOW
    return processor.grant_subscription(identity, inner_filter)


def apply(processor: MessagingProcessor, sub: Sub, grant: Grant) -> None:
    """Record on `sub` whether its deliveries must be checked path by path."""
    sub.check = grant is not Grant.ALLOW
    sub.acl_version = acl_version(processor)


def regrant(processor: MessagingProcessor, identity: Identity, subs: Iterable[Sub]) -> None:
    """Decide a resumed persistent session's subscriptions for the connection's identity (a denied
    one stays in the session but delivers nothing: each of its paths is then refused)."""
    for sub in subs:
        apply(processor, sub, decide(processor, identity, sub.filter))


def may_read(processor: MessagingProcessor, identity: Identity, path: str) -> bool:
    """Whether `identity` may receive a message on topic path `path`."""
    return processor.security is None or processor.permits(
        identity, Action.SUBSCRIBE, Resource("topic", path)
    )


def delivers(processor: MessagingProcessor, sub: Sub, identity: Identity, path: str, version: int) -> bool:
    """Whether `sub` may deliver a message on `path` to `identity`; `version`: `acl_version()` now."""
    if not sub.check and sub.acl_version == version:
        return True
    return may_read(processor, identity, path)
