"""The security directory: users, tokens and rules in the store's key-value data, mirrored in memory.

Every check reads the memory copy (no store call per request). Each change writes its record and a
new random `generation`; every proxy polls that one key (`refresh`, every `poll_s`) and reloads when
it changed, so users and rules created through one proxy are enforced by the others within a poll."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Iterable

from runtime.tasks import cancel_and_wait

from ..store_client import StoreClient
from . import records
from .records import Rule, Token, User

log = logging.getLogger("messaging_processor.security")

NS_USERS = "security.users"
NS_TOKENS = "security.tokens"
NS_RULES = "security.rules"
NS_META = "security.meta"
TOKEN_PREFIX = "gwt_"


class Directory:
    def __init__(self, store: StoreClient, poll_s: float = 1.0) -> None:
        self.store = store
        self.poll_s = poll_s
        self.users: dict[str, User] = {}
        self.by_access_key: dict[str, User] = {}
        self.tokens: dict[str, Token] = {}
        self.rules: dict[str, Rule] = {}
        self.version = 0  # local counter, bumped on every reload: compiled decisions key on it
        self._generation: bytes | None = None
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.last_refresh = 0.0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.refresh(force=True)
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 - keep the last good copy; try again next poll
                log.warning("security directory refresh failed: %s", e)

    async def refresh(self, *, force: bool = False) -> bool:
        """Reload everything when the stored generation changed (or `force`); True if reloaded."""
        async with self._lock:
            self.last_refresh = time.monotonic()
            gen = await self.store.kv_get(NS_META, "generation")
            if not force and gen == self._generation:
                return False
            users = [records.load_user(v) for _, v in await self.store.kv_scan(NS_USERS, "")]
            tokens = [records.load_token(v) for _, v in await self.store.kv_scan(NS_TOKENS, "")]
            rules = [records.load_rule(v) for _, v in await self.store.kv_scan(NS_RULES, "")]
            self._install(users, tokens, rules)
            self._generation = gen
            return True

    def _install(self, users: Iterable[User], tokens: Iterable[Token], rules: Iterable[Rule]) -> None:
        self.users = {u.name: u for u in users}
        self.by_access_key = {u.access_key: u for u in self.users.values() if u.access_key}
        self.tokens = {t.id: t for t in tokens}
        self.rules = {r.id: r for r in rules}
        self.version += 1

    async def _changed(self, ns: str, items: dict[str, bytes | None]) -> None:
        """Write records (None deletes) and a new generation, then reload the memory copy."""
        await self.store.kv_put_many(ns, items)
        await self.store.kv_put(NS_META, "generation", secrets.token_bytes(12))
        await self.refresh(force=True)

    # ------------------------------------------------------------------ users
    async def put_user(self, user: User) -> None:
        if not records.NAME.match(user.name):
            raise ValueError("a user name is 1 to 128 letters, digits, '_', '.', '@', '-'")
        if user.role not in records.ROLES:
            raise ValueError(f"role must be one of {', '.join(records.ROLES)}")
        if user.access_key:
            if not records.ACCESS_KEY.match(user.access_key):
                raise ValueError("an access key is 1 to 128 letters, digits, '_', '.', '@', '-'")
            other = self.by_access_key.get(user.access_key)
            if other is not None and other.name != user.name:
                raise ValueError("that access key belongs to another user")
        await self._changed(NS_USERS, {user.name: records.dump(user)})

    async def delete_user(self, name: str) -> bool:
        if name not in self.users:
            return False
        gone: dict[str, bytes | None] = {t.id: None for t in self.tokens.values() if t.user == name}
        if gone:
            await self.store.kv_put_many(NS_TOKENS, gone)
        await self._changed(NS_USERS, {name: None})
        return True

    # ------------------------------------------------------------------ tokens
    async def create_token(self, name: str, user: str) -> tuple[Token, str]:
        """A new token for `user`: (its record, the token text, shown once and never stored)."""
        tid = secrets.token_hex(6)
        text = f"{TOKEN_PREFIX}{tid}_{secrets.token_urlsafe(32)}"
        token = Token(tid, name, user, hashlib.sha256(text.encode()).hexdigest(), int(time.time() * 1000))
        await self._changed(NS_TOKENS, {tid: records.dump(token)})
        return token, text

    async def revoke_token(self, token_id: str) -> bool:
        if token_id not in self.tokens:
            return False
        await self._changed(NS_TOKENS, {token_id: None})
        return True

    def token_of(self, text: str) -> Token | None:
        """The token record `text` is, or None (constant-time digest comparison)."""
        if not text.startswith(TOKEN_PREFIX):
            return None
        tid, sep, _ = text[len(TOKEN_PREFIX) :].partition("_")
        token = self.tokens.get(tid) if sep else None
        digest = hashlib.sha256(text.encode()).hexdigest()
        expected = token.digest if token is not None else "0" * 64
        return token if secrets.compare_digest(digest, expected) and token is not None else None

    # ------------------------------------------------------------------ rules
    async def add_rule(
        self, subject: str, kind: str, pattern: str, actions: tuple[str, ...], deny: bool
    ) -> Rule:
        records.check_rule(subject, kind, pattern, actions)
        rule = Rule(secrets.token_hex(4), subject, kind, pattern, tuple(dict.fromkeys(actions)), deny)
        await self._changed(NS_RULES, {rule.id: records.dump(rule)})
        return rule

    async def delete_rule(self, rule_id: str) -> bool:
        if rule_id not in self.rules:
            return False
        await self._changed(NS_RULES, {rule_id: None})
        return True

    async def replace_policy(self, users: list[User], rules: list[Rule], *, replace_rules: bool) -> None:
        """Import: upsert `users` (keeping stored hashes and secrets of users that exist) and add
        `rules`; with `replace_rules` the stored rules not in `rules` are removed."""
        items: dict[str, bytes | None] = {}
        for u in users:
            old = self.users.get(u.name)
            if old is not None:
                u = User(
                    u.name,
                    u.role,
                    old.password_hash,
                    u.access_key or old.access_key,
                    old.secret_key if (u.access_key or old.access_key) == old.access_key else None,
                    u.vhosts,
                    old.created_ms,
                )
            items[u.name] = records.dump(u)
        for r in rules:
            records.check_rule(r.subject, r.kind, r.pattern, r.actions)
        if items:
            await self.store.kv_put_many(NS_USERS, items)
        rule_items: dict[str, bytes | None] = {r.id: records.dump(r) for r in rules}
        if replace_rules:
            for rid in self.rules:
                rule_items.setdefault(rid, None)
        await self._changed(NS_RULES, rule_items)
