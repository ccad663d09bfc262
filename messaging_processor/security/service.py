"""Security: authentication (passwords, API tokens, RocketMQ signatures) and ACL decisions over the
directory, for the MessagingProcessor's `authenticate` / `authorize` seam.

Passwords are verified with argon2id in a worker thread; a success is remembered (keyed by an HMAC of
user and password under a per-process random key, never the password) until the user's hash changes,
so a reconnecting device does not pay 0.1 s of CPU each time. An unknown user costs the same verify
as a wrong password.

With `allow_anonymous`, a client that presents no credentials at all is admitted as the one anonymous
principal (per client id and protocol, for its decision cache), which gets only what rules of subject
`anonymous` grant; credentials that do not verify are refused as before, never taken as anonymous.

With a device token verifier (`jwt`, jwt_tokens.py), a password or Bearer token that looks like a JWT
is verified as one instead; its principal is the token's user (who need not exist, and is never an
admin), with the device id and expiry the adapters use."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time

from ..store_client import StoreClient
from . import passwords, signatures
from .acl import ANONYMOUS_USER, Grant, Principal, compile_rules, decide, grant, remember
from .directory import Directory
from .jwt_tokens import JwtError, JwtVerifier, looks_like_jwt
from .records import User

_MAX_VERIFIED = 10_000
_MAX_PRINCIPALS = 10_000


class AuthFailure(Exception):
    """A refused login; `reason` is for logs and metrics only, never for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Security:
    def __init__(
        self,
        store: StoreClient,
        *,
        poll_s: float = 1.0,
        allow_anonymous: bool = False,
        jwt: JwtVerifier | None = None,
    ) -> None:
        self.directory = Directory(store, poll_s)
        self.allow_anonymous = allow_anonymous
        self.jwt = jwt  # device tokens: None unless a JWT key is configured
        self._key = secrets.token_bytes(32)
        self._verified: dict[bytes, str] = {}  # HMAC(user, password) -> the hash it was checked against
        # One principal per (user, client id, protocol, token): a client that authenticates per
        # request (HTTP, gRPC) or reconnects keeps its compiled rules and cached decisions.
        self._principals: dict[tuple[str, str, str, str | None], Principal] = {}

    def _principal(self, user: User, client_id: str, protocol: str, token_id: str | None = None) -> Principal:
        key = (user.name, client_id, protocol, token_id)
        p = self._principals.get(key)
        if p is None:
            if len(self._principals) >= _MAX_PRINCIPALS:
                self._principals.clear()
            p = self._principals[key] = Principal(user.name, user.role, client_id, protocol, token_id)
        return p

    async def start(self) -> None:
        await self.directory.start()

    async def close(self) -> None:
        await self.directory.close()

    # ------------------------------------------------------------------ bootstrap
    def has_admin(self) -> bool:
        return any(u.role == "admin" for u in self.directory.users.values())

    async def add_user(
        self,
        name: str,
        *,
        password: str | None = None,
        role: str = "user",
        access_key: str | None = None,
        secret_key: str | None = None,
        vhosts: tuple[str, ...] = ("/",),
    ) -> User:
        if name in self.directory.users:
            raise ValueError(f"user {name} exists")
        if (access_key is None) != (secret_key is None):
            raise ValueError("an access key needs a secret key, and a secret key an access key")
        h = await asyncio.to_thread(passwords.hash_password, password) if password else None
        user = User(name, role, h, access_key, secret_key, vhosts, int(time.time() * 1000))
        await self.directory.put_user(user)
        return user

    async def set_password(self, name: str, password: str) -> None:
        old = self.directory.users.get(name)
        if old is None:
            raise KeyError(name)
        h = await asyncio.to_thread(passwords.hash_password, password)
        await self.directory.put_user(
            User(old.name, old.role, h, old.access_key, old.secret_key, old.vhosts, old.created_ms)
        )

    # ------------------------------------------------------------------ logins
    async def _user(self, name: str) -> User | None:
        d = self.directory
        user = d.users.get(name)
        if user is None:
            await d.refresh()  # created through another proxy since the last poll?
            user = d.users.get(name)
        return user

    async def login_password(self, name: str, password: str, protocol: str, client_id: str = "") -> Principal:
        if self.jwt is not None and looks_like_jwt(password):
            return self.login_jwt(password, protocol, client_id)  # the user name may be anything
        user = await self._user(name) if name else None
        if user is None or user.password_hash is None:
            await asyncio.to_thread(passwords.verify, passwords.DUMMY_HASH, password)
            raise AuthFailure("unknown_user" if user is None else "no_password")
        key = hmac.new(self._key, f"{name}\0{password}".encode(), hashlib.sha256).digest()
        if self._verified.get(key) != user.password_hash:
            if not await asyncio.to_thread(passwords.verify, user.password_hash, password):
                raise AuthFailure("bad_password")
            if len(self._verified) >= _MAX_VERIFIED:
                self._verified.clear()
            self._verified[key] = user.password_hash
        return self._principal(user, client_id, protocol)

    async def login_certificate(self, name: str, protocol: str, client_id: str = "") -> Principal:
        """A user named by a client certificate the adapter's TLS layer verified (its CN): the user
        must exist; no password is asked."""
        user = await self._user(name) if name else None
        if user is None:
            raise AuthFailure("unknown_user")
        return self._principal(user, client_id, protocol)

    def login_anonymous(self, protocol: str, client_id: str = "") -> Principal:
        """The anonymous principal for a client that presented no credentials; AuthFailure
        ("missing_credentials") unless `allow_anonymous`."""
        if not self.allow_anonymous:
            raise AuthFailure("missing_credentials")
        key = (ANONYMOUS_USER, client_id, protocol, None)
        p = self._principals.get(key)
        if p is None:
            if len(self._principals) >= _MAX_PRINCIPALS:
                self._principals.clear()
            p = self._principals[key] = Principal(ANONYMOUS_USER, "", client_id, protocol, anonymous=True)
        return p

    def login_jwt(self, text: str, protocol: str, client_id: str = "") -> Principal:
        """A device token's principal: AuthFailure (reason `jwt_*`) unless it verifies."""
        assert self.jwt is not None
        try:
            c = self.jwt.verify(text)
        except JwtError as e:
            raise AuthFailure(e.reason) from None
        # per token identity (user, device, expiry): a reconnect with the same token keeps its cache
        key = (c.user, client_id, protocol, f"jwt\0{c.device or ''}\0{c.expires_at}")
        p = self._principals.get(key)
        if p is None:
            if len(self._principals) >= _MAX_PRINCIPALS:
                self._principals.clear()
            p = self._principals[key] = Principal(
                c.user, "user", client_id, protocol, external=True, device=c.device, expires_at=c.expires_at
            )
        return p

    def login_token(self, text: str, protocol: str, client_id: str = "") -> Principal:
        if self.jwt is not None and looks_like_jwt(text):
            return self.login_jwt(text, protocol, client_id)
        token = self.directory.token_of(text)
        user = self.directory.users.get(token.user) if token is not None else None
        if token is None or user is None:
            raise AuthFailure("bad_token")
        return self._principal(user, client_id, protocol, token.id)

    async def _by_access_key(self, access_key: str) -> User:
        d = self.directory
        user = d.by_access_key.get(access_key)
        if user is None:
            await d.refresh()
            user = d.by_access_key.get(access_key)
        if user is None or not user.secret_key:
            raise AuthFailure("unknown_access_key")
        return user

    async def login_grpc(
        self, access_key: str, signature: str, date_time: str, protocol: str, client_id: str = ""
    ) -> Principal:
        user = await self._by_access_key(access_key)
        assert user.secret_key is not None
        if not signatures.same(signature.lower(), signatures.grpc_signature(user.secret_key, date_time)):
            raise AuthFailure("bad_signature")
        return self._principal(user, client_id, protocol)

    async def login_remoting(
        self, access_key: str, signature: str, content: bytes, protocol: str, client_id: str = ""
    ) -> Principal:
        user = await self._by_access_key(access_key)
        assert user.secret_key is not None
        if not signatures.same(signature, signatures.remoting_signature(user.secret_key, content)):
            raise AuthFailure("bad_signature")
        return self._principal(user, client_id, protocol)

    # ------------------------------------------------------------------ decisions
    def _current(self, p: Principal) -> None:
        d = self.directory
        if p.version == d.version:
            return
        if p.anonymous or p.external:  # no user record to follow (a device token's role stays "user")
            compile_rules(p, list(d.rules.values()), d.version)
            return
        user = d.users.get(p.user)
        p.revoked = user is None or (p.token_id is not None and p.token_id not in d.tokens)
        if user is not None:
            p.role = user.role
        compile_rules(p, list(d.rules.values()), d.version)

    def permits(self, p: Principal, action: str, kind: str, name: str) -> tuple[bool, bool]:
        """(allowed, first): `first` when this decision was not cached yet (log refusals once)."""
        if p.version != self.directory.version:
            self._current(p)
        key = (action, kind, name)
        ok = p.decisions.get(key)
        if ok is not None:
            return ok, False
        ok = decide(p, action, kind, name)
        remember(p, key, ok)
        return ok, True

    def grant(self, p: Principal, flt: str) -> Grant:
        if p.version != self.directory.version:
            self._current(p)
        return grant(p, flt)

    def may_open_vhost(self, p: Principal, vhost: str) -> bool:
        self._current(p)
        if p.revoked:
            return False
        user = self.directory.users.get(p.user)
        if p.anonymous or (p.external and user is None):
            return vhost == "/"  # the default virtual host only: it has no user record to list others
        return p.admin or (user is not None and vhost in user.vhosts)
