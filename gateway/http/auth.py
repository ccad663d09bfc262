"""Authentication of the HTTP port when `auth` is on (an ASGI middleware around the whole app, so the
raw CloudEvents ingest route is covered too).

- `/healthz` is open to everyone; `/metrics` and the API docs (`/docs`, `/redoc`, `/openapi.json`)
  are open to loopback clients and need credentials from anywhere else; `/metrics/per-object`
  (topic and group names) needs credentials from everywhere (docs/observability.md).
- Every other route needs `Authorization: Basic` (a user's password, mechanism "http-basic") or
  `Authorization: Bearer <API token>` (also the webhook spec's `access_token` query parameter).
  Missing or wrong credentials: 401 problem+json with `WWW-Authenticate`, the same body whatever
  was wrong. The verified identity goes to the routes in the scope (`IDENTITY_KEY`), where the
  processor's ACL checks (publish, subscribe) use it.
- `/admin/...` needs the admin role: 403 problem+json otherwise.
- With `allow_anonymous`, a request without credentials is the anonymous principal: the data routes
  (CloudEvents, read API, shadows) let the ACL rules of `anonymous` decide (403 when they refuse);
  the console, the admin API, `/metrics` and the API docs still answer it 401, so that a browser
  asks for a login. Credentials that do not verify are refused (401), never taken as anonymous.

Password checks are argon2id, remembered by the security core for later requests."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.cloudevents.problems import IDENTITY_KEY
from gateway.config import is_loopback
from messaging_processor import Action, ClientContext, Identity, MessagingProcessor, ProcessorError, Resource

from .errors import problem

CHALLENGES = ('Basic realm="gateway"', "Bearer")
CHALLENGE = ", ".join(CHALLENGES)
OPEN = frozenset({"/healthz"})
OPEN_ON_LOOPBACK = frozenset({"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
ADMIN_RESOURCE = Resource("cluster", "admin-api")
# what the anonymous principal never reaches (401 as without allow_anonymous): all but the data routes
NOT_ANONYMOUS = ("/admin", "/console", "/metrics", "/docs", "/redoc", "/openapi.json")


def _not_anonymous(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in NOT_ANONYMOUS)


def credentials(scope: Scope) -> Identity:
    """The credentials a request presents (unverified). An `access_token` query parameter is
    redacted from the scope, so that no access log line shows it."""
    token = None
    query = scope.get("query_string", b"")
    if b"access_token" in query:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        token = dict(pairs).get("access_token")  # as Starlette's query_params: the last one wins
        kept = [(k, "redacted" if k == "access_token" else v) for k, v in pairs]
        scope["query_string"] = urlencode(kept).encode("latin-1")
    auth = None
    for k, v in scope["headers"]:
        if k == b"authorization":
            auth = v.decode("latin-1")
            break
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "basic":
            try:
                text = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return Identity(mechanism="http-basic")  # malformed: refused like a wrong password
            user, sep, password = text.partition(":")
            return Identity(user, password if sep else None, "http-basic")
        if scheme == "bearer":
            return Identity(secret=value or None, mechanism="bearer")
        return Identity(mechanism="http-" + (scheme[:32] or "empty"))  # refused, never anonymous
    if token:
        return Identity(secret=token, mechanism="bearer")
    return Identity()


def _loopback_client(scope: Scope) -> bool:
    client = scope.get("client")
    return bool(client) and is_loopback(str(client[0]))


def unauthorized():
    """The one 401 answer, whatever was wrong. The two challenges go in two header lines (read
    together they are CHALLENGE): browsers such as Chromium take no Basic challenge that shares
    its line with another scheme, and the console logs in through the browser's Basic prompt."""
    r = problem(401, "unauthorized", "authentication failed")
    for challenge in CHALLENGES:
        r.headers.append("WWW-Authenticate", challenge)
    return r


class AuthMiddleware:
    def __init__(self, app: ASGIApp, processor: MessagingProcessor) -> None:
        self.app = app
        self.processor = processor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket routes: nothing else gets in unauthenticated
            await send({"type": "websocket.close", "code": 1008})
            return
        path: str = scope["path"]
        if path in OPEN or (path in OPEN_ON_LOOPBACK and _loopback_client(scope)):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        remote = f"{client[0]}:{client[1]}" if client else ""
        ctx = ClientContext("http", client_id=remote, identity=credentials(scope), remote=remote)
        p = self.processor
        try:
            await p.authenticate(ctx)
        except ProcessorError:
            await unauthorized()(scope, receive, send)
            return
        principal = ctx.identity.principal
        if principal is not None and principal.anonymous and _not_anonymous(path):
            await unauthorized()(scope, receive, send)
            return
        if (path == "/admin" or path.startswith("/admin/")) and not p.permits(
            ctx.identity, Action.ADMIN, ADMIN_RESOURCE
        ):
            await problem(403, "forbidden", "the admin API needs the admin role")(scope, receive, send)
            return
        scope[IDENTITY_KEY] = ctx.identity
        await self.app(scope, receive, send)
