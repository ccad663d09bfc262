"""ACL decisions for one principal: which rules apply (its user, its role, anyone), with `%u`, `%c`
and `%d` (a device token's device id) filled in, compiled once per directory version; each
(action, resource) decision is then cached on the principal, so a connection pays for a decision
once and a dict lookup afterwards.

A matching deny wins over an allow; nothing is allowed that no rule allows; admins may do everything.
The anonymous principal (a client admitted without credentials, `allow_anonymous`) gets the rules of
subject `anonymous` only: not `anyone`'s (every authenticated user), and none with `%u` (it has no
user name), so with no such rule it may do nothing."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .paths import covers, matches, overlaps, split
from .records import ANONYMOUS, Rule

_MAX_DECISIONS = 4096  # per principal: paths are many for MQTT devices; the cache stays bounded


class Grant(enum.Enum):
    """A subscription filter's decision: refused, granted, or granted with each path checked."""

    DENY = "deny"
    ALLOW = "allow"
    CHECK = "check"


@dataclass(eq=False, slots=True)
class Principal:
    """An authenticated client: a user (by name), its role, the client id `%c` stands for; or, with
    `anonymous`, a client admitted without credentials (`user` is then ANONYMOUS_USER, no role)."""

    user: str
    role: str
    client_id: str = ""
    protocol: str = ""
    token_id: str | None = None
    anonymous: bool = False
    # a device token's principal (jwt_tokens.py): its user need not exist, never an admin; `device`
    # is what `%d` stands for, `expires_at` the token's `exp` (Unix seconds)
    external: bool = False
    device: str | None = None
    expires_at: float | None = None
    version: int = -1  # directory version the compiled rules are of
    revoked: bool = False
    allow: dict[tuple[str, str], list[tuple[str, ...]]] = field(default_factory=dict)
    deny: dict[tuple[str, str], list[tuple[str, ...]]] = field(default_factory=dict)
    decisions: dict[tuple[str, str, str], bool] = field(default_factory=dict)

    @property
    def admin(self) -> bool:
        return self.role == "admin"


ANONYMOUS_USER = "$anonymous"  # the anonymous principal's name in logs: no user name can be it ('$')


def _fill(pattern: str, user: str | None, client_id: str, device: str | None = None) -> str | None:
    if "%u" in pattern and user is None:
        return None  # the anonymous principal has no user name
    if "%d" in pattern:
        if not device or any(ch in device for ch in "/+#"):
            return None  # no device id (not a device token, or no such claim), or one with wildcards
        pattern = pattern.replace("%d", device)
    if "%c" in pattern:
        if not client_id or any(ch in client_id for ch in "/+#"):
            return None  # a client id with wildcard characters never widens a rule
        pattern = pattern.replace("%c", client_id)
    return pattern if user is None else pattern.replace("%u", user)


def compile_rules(p: Principal, rules: list[Rule], version: int) -> None:
    """Fill `p.allow` / `p.deny` by (kind, action) from the rules that apply to it."""
    p.allow.clear()
    p.deny.clear()
    p.decisions.clear()
    p.version = version
    subjects = (ANONYMOUS,) if p.anonymous else ("anyone", f"user:{p.user}", f"role:{p.role}")
    user = None if p.anonymous else p.user
    for r in rules:
        if r.subject not in subjects:
            continue
        filled = _fill(r.pattern, user, p.client_id, p.device)
        if filled is None:
            continue
        levels = split(filled)
        target = p.deny if r.deny else p.allow
        for action in r.actions:
            target.setdefault((r.kind, action), []).append(levels)


def decide(p: Principal, action: str, kind: str, name: str) -> bool:
    """Whether `p` may `action` the resource `kind`:`name` (uncached: callers cache)."""
    if p.revoked:
        return False
    if p.admin:
        return True
    path = split(name)
    for pat in p.deny.get((kind, action), ()):
        if matches(pat, path):
            return False
    return any(matches(pat, path) for pat in p.allow.get((kind, action), ()))


def remember(p: Principal, key: tuple[str, str, str], ok: bool) -> None:
    if len(p.decisions) >= _MAX_DECISIONS:
        p.decisions.clear()
    p.decisions[key] = ok


def grant(p: Principal, flt: str) -> Grant:
    """The decision on an MQTT subscription filter: DENY when a deny covers it or no allow may match
    any of its paths; ALLOW when an allow covers it and no deny may match; else CHECK each path."""
    if p.revoked:
        return Grant.DENY
    if p.admin:
        return Grant.ALLOW
    f = split(flt)
    denies = p.deny.get(("topic", "subscribe"), ())
    allows = p.allow.get(("topic", "subscribe"), ())
    if any(covers(d, f) for d in denies) or not any(overlaps(a, f) for a in allows):
        return Grant.DENY
    if any(covers(a, f) for a in allows) and not any(overlaps(d, f) for d in denies):
        return Grant.ALLOW
    return Grant.CHECK
