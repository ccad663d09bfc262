"""The access policy as a TOML file (`gateway acl export` / `gateway acl import`), so it can live in
version control: users without passwords, hashes or secrets, and the ACL rules.

    [[users]]
    name = "dev42"
    role = "user"                # admin | user
    access_key = "AKdev42"       # optional; its secret key is never exported
    vhosts = ["/"]

    [[rules]]
    id = "3f2a9c01"              # optional on import (a new id is given)
    subject = "role:user"        # user:NAME | role:ROLE | anyone (authenticated) | anonymous
    kind = "topic"               # topic | group
    pattern = "devices/%u/#"
    actions = ["publish"]        # publish, subscribe, admin
    effect = "allow"             # allow | deny

Read with tomllib; written by hand (basic strings escaped as TOML requires)."""

from __future__ import annotations

import re
import secrets
import time
import tomllib
from typing import Any

from .directory import Directory
from .records import ACCESS_KEY, NAME, ROLES, Rule, User, check_rule

_RULE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
_USER_KEYS = {"name", "role", "access_key", "vhosts"}
_RULE_KEYS = {"id", "subject", "kind", "pattern", "actions", "effect"}
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """`text` as a TOML basic string."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _array(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(toml_string(i) for i in items) + "]"


def export_policy(directory: Directory) -> str:
    """The directory's users (no secrets) and rules as TOML text, sorted by name and id."""
    lines = ["# msg-gateway access policy: users (without passwords or secret keys) and ACL rules", ""]
    for u in sorted(directory.users.values(), key=lambda u: u.name):
        lines += ["[[users]]", f"name = {toml_string(u.name)}", f"role = {toml_string(u.role)}"]
        if u.access_key:
            lines.append(f"access_key = {toml_string(u.access_key)}")
        lines += [f"vhosts = {_array(u.vhosts)}", ""]
    for r in sorted(directory.rules.values(), key=lambda r: r.id):
        lines += [
            "[[rules]]",
            f"id = {toml_string(r.id)}",
            f"subject = {toml_string(r.subject)}",
            f"kind = {toml_string(r.kind)}",
            f"pattern = {toml_string(r.pattern)}",
            f"actions = {_array(r.actions)}",
            f"effect = {toml_string('deny' if r.deny else 'allow')}",
            "",
        ]
    return "\n".join(lines)


def _str(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{where}: {key} must be a string")
    return v


def _strings(d: dict[str, Any], key: str, where: str, default: list[str]) -> tuple[str, ...]:
    v = d.get(key, default)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{where}: {key} must be a list of strings")
    return tuple(v)


def _tables(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    v = data.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise ValueError(f"{key} must be an array of tables ([[{key}]])")
    return v


def parse_policy(text: str) -> tuple[list[User], list[Rule]]:
    """Users (no password or secret) and rules of a policy file; ValueError naming what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"invalid TOML: {e}") from None
    unknown = sorted(set(data) - {"users", "rules"})
    if unknown:
        raise ValueError(f"unknown key(s): {', '.join(unknown)} (expected [[users]] and [[rules]])")
    now = int(time.time() * 1000)
    users: list[User] = []
    names: set[str] = set()
    keys: set[str] = set()
    for i, d in enumerate(_tables(data, "users"), 1):
        where = f"users #{i}"
        extra = sorted(set(d) - _USER_KEYS)
        if extra:
            raise ValueError(f"{where}: unknown key(s) {', '.join(extra)} (secrets are never imported)")
        name = _str(d, "name", where)
        if not name or not NAME.match(name):
            raise ValueError(f"{where}: a user name is 1 to 128 letters, digits, '_', '.', '@', '-'")
        role = _str(d, "role", where, "user")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}")
        ak = _str(d, "access_key", where) or None
        if ak is not None and not ACCESS_KEY.match(ak):
            raise ValueError(f"{where}: illegal access key")
        if name in names or (ak is not None and ak in keys):
            raise ValueError(f"{where}: user {name} or its access key appears twice")
        names.add(name)
        if ak is not None:
            keys.add(ak)
        users.append(User(name, role, None, ak, None, _strings(d, "vhosts", where, ["/"]), now))
    rules: list[Rule] = []
    ids: set[str] = set()
    for i, d in enumerate(_tables(data, "rules"), 1):
        where = f"rules #{i}"
        extra = sorted(set(d) - _RULE_KEYS)
        if extra:
            raise ValueError(f"{where}: unknown key(s) {', '.join(extra)}")
        rid = _str(d, "id", where) or secrets.token_hex(4)
        if not _RULE_ID.match(rid) or rid in ids:
            raise ValueError(f"{where}: illegal or repeated id {rid!r}")
        ids.add(rid)
        subject = _str(d, "subject", where) or ""
        kind = _str(d, "kind", where, "topic") or ""
        pattern = _str(d, "pattern", where) or ""
        actions = tuple(dict.fromkeys(_strings(d, "actions", where, [])))
        effect = _str(d, "effect", where, "allow")
        if effect not in ("allow", "deny"):
            raise ValueError(f"{where}: effect must be allow or deny")
        try:
            check_rule(subject, kind, pattern, actions)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        rules.append(Rule(rid, subject, kind, pattern, actions, effect == "deny"))
    return users, rules
