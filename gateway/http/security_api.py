"""Admin API of identities and access control (docs/security.md): users, API tokens, ACL rules, and
the policy file (export / import). Under `/admin`, so only admins reach it when `auth` is on; with
`auth` off there is no directory to manage and every route answers 409.

    POST   /admin/users                    {name, password?, role?, access_key?, secret_key?, vhosts?}
    GET    /admin/users
    PUT    /admin/users/{name}/password    {password}
    DELETE /admin/users/{name}             (its tokens go too; the last admin cannot be deleted)
    POST   /admin/tokens                   {name, user?} -> the token text, shown this once
    GET    /admin/tokens
    DELETE /admin/tokens/{id}
    POST   /admin/acl                      {subject, kind, pattern, actions, effect}
    GET    /admin/acl
    DELETE /admin/acl/{id}
    GET    /admin/acl/export               TOML: users without secrets, and rules
    POST   /admin/acl/import?replace=true  TOML body; replace=false keeps rules the file lacks

Nothing here ever answers a password hash or a secret key."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field

from adapters.cloudevents.problems import IDENTITY_KEY
from messaging_processor import MessagingProcessor
from messaging_processor.security import Security
from messaging_processor.security.policy_file import export_policy, parse_policy

from .deps import get_processor

router = APIRouter(prefix="/admin", tags=["security"])

TOML_TYPE = "application/toml"
_ERRORS = {
    400: {"description": "invalid name, role, pattern or policy file (problem+json)"},
    404: {"description": "no such user, token or rule (problem+json)"},
    409: {"description": "authentication is off, or the user exists (problem+json)"},
}


def get_security(p: Annotated[MessagingProcessor, Depends(get_processor)]) -> Security:
    if p.security is None:
        raise HTTPException(
            409, "authentication is off: start the gateway with --auth to manage users, tokens and rules"
        )
    return p.security


Sec = Annotated[Security, Depends(get_security)]


# ----------------------------------------------------------------------------- models
class UserIn(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    password: str | None = Field(None, min_length=1, description="argon2id-hashed; never shown")
    role: Literal["admin", "user"] = "user"
    access_key: str | None = Field(None, min_length=1, description="RocketMQ AccessKey")
    secret_key: str | None = Field(None, min_length=1, description="RocketMQ SecretKey; never shown")
    vhosts: list[str] = Field(default_factory=lambda: ["/"], description="AMQP virtual hosts")


class UserOut(BaseModel):
    name: str
    role: str
    password: bool = Field(description="whether the user has a password")
    access_key: str | None
    vhosts: list[str]
    created_ms: int


class PasswordIn(BaseModel):
    password: str = Field(min_length=1)


class TokenIn(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    user: str | None = Field(None, description="whose token (default: the caller)")


class TokenOut(BaseModel):
    id: str
    name: str
    user: str
    created_ms: int


class NewToken(TokenOut):
    token: str = Field(description="the token text: shown this once, only its digest is stored")


class RuleIn(BaseModel):
    subject: str = Field(
        description="user:NAME, role:admin|user, anyone (every authenticated user) or anonymous "
        "(clients without credentials, with allow_anonymous)"
    )
    kind: Literal["topic", "group"] = "topic"
    pattern: str = Field(description="MQTT filter syntax with %u (user name) and %c (client id)")
    actions: list[Literal["publish", "subscribe", "admin"]] = Field(min_length=1)
    effect: Literal["allow", "deny"] = "allow"


class RuleOut(BaseModel):
    id: str
    subject: str
    kind: str
    pattern: str
    actions: list[str]
    effect: str


class ImportResult(BaseModel):
    users: int = Field(description="users created or updated (passwords and secrets kept)")
    rules: int = Field(description="rules in the file")
    removed: int = Field(description="stored rules removed (replace=true: not in the file)")


def _bad(e: ValueError) -> HTTPException:
    return HTTPException(400, str(e))


# ----------------------------------------------------------------------------- users
@router.post("/users", response_model=UserOut, status_code=201, responses=_ERRORS)
async def create_user(body: UserIn, sec: Sec) -> UserOut:
    if body.name in sec.directory.users:
        raise HTTPException(409, f"user {body.name} exists")
    try:
        user = await sec.add_user(
            body.name,
            password=body.password,
            role=body.role,
            access_key=body.access_key,
            secret_key=body.secret_key,
            vhosts=tuple(body.vhosts),
        )
    except ValueError as e:
        raise _bad(e) from None
    return UserOut(**user.public())


@router.get("/users", response_model=list[UserOut])
async def list_users(sec: Sec) -> list[UserOut]:
    return [UserOut(**u.public()) for _, u in sorted(sec.directory.users.items())]


@router.put("/users/{name}/password", status_code=204, response_class=Response, responses=_ERRORS)
async def set_password(name: str, body: PasswordIn, sec: Sec) -> Response:
    try:
        await sec.set_password(name, body.password)
    except KeyError:
        raise HTTPException(404, f"no user {name}") from None
    except ValueError as e:
        raise _bad(e) from None
    return Response(status_code=204)


@router.delete("/users/{name}", status_code=204, response_class=Response, responses=_ERRORS)
async def delete_user(name: str, sec: Sec) -> Response:
    users = sec.directory.users
    user = users.get(name)
    if user is None:
        raise HTTPException(404, f"no user {name}")
    if user.role == "admin" and not any(u.role == "admin" for n, u in users.items() if n != name):
        raise HTTPException(409, f"{name} is the last admin user: create another admin first")
    await sec.directory.delete_user(name)
    return Response(status_code=204)


# ----------------------------------------------------------------------------- tokens
@router.post("/tokens", response_model=NewToken, status_code=201, responses=_ERRORS)
async def create_token(body: TokenIn, request: Request, sec: Sec) -> NewToken:
    caller = request.scope.get(IDENTITY_KEY)
    user = body.user or (caller.username if caller is not None else None)
    if not user:
        raise HTTPException(400, "name the token's user")
    if user not in sec.directory.users:
        raise HTTPException(404, f"no user {user}")
    token, text = await sec.directory.create_token(body.name, user)
    return NewToken(**token.public(), token=text)


@router.get("/tokens", response_model=list[TokenOut])
async def list_tokens(sec: Sec) -> list[TokenOut]:
    tokens = sorted(sec.directory.tokens.values(), key=lambda t: (t.created_ms, t.id))
    return [TokenOut(**t.public()) for t in tokens]


@router.delete("/tokens/{token_id}", status_code=204, response_class=Response, responses=_ERRORS)
async def revoke_token(token_id: str, sec: Sec) -> Response:
    if not await sec.directory.revoke_token(token_id):
        raise HTTPException(404, f"no token {token_id}")
    return Response(status_code=204)


# ----------------------------------------------------------------------------- ACL rules
@router.post("/acl", response_model=RuleOut, status_code=201, responses=_ERRORS)
async def add_rule(body: RuleIn, sec: Sec) -> RuleOut:
    try:
        rule = await sec.directory.add_rule(
            body.subject, body.kind, body.pattern, tuple(body.actions), body.effect == "deny"
        )
    except ValueError as e:
        raise _bad(e) from None
    return RuleOut(**rule.public())


@router.get("/acl", response_model=list[RuleOut])
async def list_rules(sec: Sec) -> list[RuleOut]:
    rules = sorted(sec.directory.rules.values(), key=lambda r: (r.subject, r.kind, r.pattern, r.id))
    return [RuleOut(**r.public()) for r in rules]


@router.delete("/acl/{rule_id}", status_code=204, response_class=Response, responses=_ERRORS)
async def delete_rule(rule_id: str, sec: Sec) -> Response:
    if not await sec.directory.delete_rule(rule_id):
        raise HTTPException(404, f"no rule {rule_id}")
    return Response(status_code=204)


@router.get(
    "/acl/export",
    response_class=Response,
    responses={200: {"content": {TOML_TYPE: {}}, "description": "the policy file"}, 409: _ERRORS[409]},
)
async def export_rules(sec: Sec) -> Response:
    return Response(export_policy(sec.directory), media_type=TOML_TYPE)


@router.post(
    "/acl/import",
    response_model=ImportResult,
    responses=_ERRORS,
    openapi_extra={"requestBody": {"required": True, "content": {TOML_TYPE: {"schema": {"type": "string"}}}}},
)
async def import_rules(
    request: Request,
    sec: Sec,
    replace: Annotated[bool, Query(description="remove stored rules the file does not have")] = True,
) -> ImportResult:
    """Users are created or updated (never deleted; new ones have no password until one is set),
    rules added by id (replacing a stored rule of the same id)."""
    try:
        text = (await request.body()).decode()
        users, rules = parse_policy(text)
    except UnicodeDecodeError:
        raise HTTPException(400, "the policy file is not UTF-8") from None
    except ValueError as e:
        raise _bad(e) from None
    d = sec.directory
    for u in users:
        other = d.by_access_key.get(u.access_key) if u.access_key else None
        if other is not None and other.name != u.name:
            raise HTTPException(400, f"access key of user {u.name} belongs to user {other.name}")
    roles = {n: u.role for n, u in d.users.items()} | {u.name: u.role for u in users}
    if "admin" not in roles.values():
        raise HTTPException(409, "the policy would leave no admin user")
    ids = {r.id for r in rules}
    removed = sum(1 for rid in d.rules if rid not in ids) if replace else 0
    await d.replace_policy(users, rules, replace_rules=replace)
    return ImportResult(users=len(users), rules=len(rules), removed=removed)
