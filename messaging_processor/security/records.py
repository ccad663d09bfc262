"""What the security directory stores: users, API tokens and ACL rules, and their JSON form in the
store's key-value data (so every proxy of a cluster reads the same)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

ROLES = ("admin", "user")
ACTIONS = ("publish", "subscribe", "admin")
KINDS = ("topic", "group")
ANONYMOUS = "anonymous"  # the subject of rules for clients admitted without credentials
NAME = re.compile(r"^[A-Za-z0-9_.@\-]{1,128}$")  # no MQTT wildcards or '/': safe inside %u
ACCESS_KEY = re.compile(r"^[A-Za-z0-9_.@\-]{1,128}$")


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: str = "user"
    password_hash: str | None = None  # argon2id PHC string; None: no password login
    access_key: str | None = None
    secret_key: str | None = None  # RocketMQ signatures need the secret itself (docs/security.md)
    vhosts: tuple[str, ...] = ("/",)  # AMQP virtual hosts the user may open (admins: all)
    created_ms: int = 0

    def public(self) -> dict[str, object]:
        """What the admin API shows: never a hash or a secret."""
        return {
            "name": self.name,
            "role": self.role,
            "password": self.password_hash is not None,
            "access_key": self.access_key,
            "vhosts": list(self.vhosts),
            "created_ms": self.created_ms,
        }


@dataclass(frozen=True, slots=True)
class Token:
    id: str  # public part of the token (`gwt_<id>_<secret>`)
    name: str
    user: str
    digest: str  # SHA-256 hex of the whole token
    created_ms: int = 0

    def public(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "user": self.user, "created_ms": self.created_ms}


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    subject: str  # "user:NAME", "role:admin|user", "anyone" (authenticated) or "anonymous"
    kind: str  # "topic" or "group"
    pattern: str  # MQTT filter syntax, with %u / %c / %d
    actions: tuple[str, ...]
    deny: bool = False

    def public(self) -> dict[str, object]:
        return {
            "id": self.id,
            "subject": self.subject,
            "kind": self.kind,
            "pattern": self.pattern,
            "actions": list(self.actions),
            "effect": "deny" if self.deny else "allow",
        }


def check_rule(subject: str, kind: str, pattern: str, actions: tuple[str, ...]) -> None:
    """ValueError naming what is wrong with a rule's parts."""
    if subject not in ("anyone", ANONYMOUS):
        what, _, name = subject.partition(":")
        if what == "user":
            if not NAME.match(name):
                raise ValueError(f"illegal user name {name!r}")
        elif what == "role":
            if name not in ROLES:
                raise ValueError(f"role must be one of {', '.join(ROLES)}, got {name!r}")
        else:
            raise ValueError(f"subject must be user:NAME, role:ROLE, anyone or anonymous, got {subject!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be topic or group, got {kind!r}")
    if not pattern or len(pattern) > 1024:
        raise ValueError("a pattern must be 1 to 1024 characters")
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"'#' must be a whole last level in {pattern!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must be a whole level in {pattern!r}")
    if not actions or any(a not in ACTIONS for a in actions):
        raise ValueError(f"actions must be some of {', '.join(ACTIONS)}, got {','.join(actions)!r}")


def dump(record: User | Token | Rule) -> bytes:
    return json.dumps(asdict(record), separators=(",", ":")).encode()


def load_user(data: bytes) -> User:
    d = json.loads(data)
    d["vhosts"] = tuple(d.get("vhosts") or ("/",))
    return User(**d)


def load_token(data: bytes) -> Token:
    return Token(**json.loads(data))


def load_rule(data: bytes) -> Rule:
    d = json.loads(data)
    d["actions"] = tuple(d["actions"])
    return Rule(**d)
