"""Device tokens (docs/security.md, "Device tokens (JWT)"): verify a JSON Web Token presented in
place of a password (MQTT, AMQP PLAIN) or as a Bearer token (HTTP, gRPC) with PyJWT, against keys
read once at start: a JWKS file or a PEM public key (RS256, ES256), or an HS256 secret file.

A verified token names its user by a claim (`sub` by default) and, optionally, a device id by
another claim (the ACL's `%d`); `exp` and `nbf` are enforced, `iss` and `aud` when configured. The
token itself is never logged: a refusal says only why (`jwt_expired`, `jwt_bad_signature`, ...)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

ASYMMETRIC = ("RS256", "ES256")
MIN_SECRET_BYTES = 32  # HS256 keys shorter than the hash are weak (RFC 7518 3.2)

# header.payload.signature, each base64url without padding (RFC 7515 compact serialization)
_SHAPE = re.compile(r"[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]+")


def looks_like_jwt(text: str | None) -> bool:
    """Whether `text` has a compact JWT's shape (three base64url parts): only then is it tried as
    a token, anything else goes to the password or API token check."""
    return bool(text) and len(text) <= 16384 and _SHAPE.fullmatch(text) is not None  # type: ignore[arg-type]


class JwtError(Exception):
    """A token that does not verify; `reason` is for logs and metrics (never the token)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JwtConfigError(ValueError):
    """Key files or claim settings that cannot be used (the gateway refuses to start)."""


@dataclass(frozen=True, slots=True)
class JwtClaims:
    user: str
    device: str | None
    expires_at: float | None  # the `exp` claim (Unix seconds), None when the token has none


@dataclass(frozen=True, slots=True)
class JwtSettings:
    jwks_file: str | None = None
    public_key_file: str | None = None
    secret_file: str | None = None
    user_claim: str = "sub"
    device_claim: str | None = None
    audience: str | None = None
    issuer: str | None = None
    leeway_s: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.jwks_file or self.public_key_file or self.secret_file)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise JwtConfigError(f"cannot read {path}: {e.strerror or e}") from None


def _secret(path: str) -> bytes:
    """An HS256 secret: readable by its owner only (as the cluster secret), at least 32 bytes."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise JwtConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if mode & 0o077:
        raise JwtConfigError(f"{path} is readable by group or others: chmod 600 it")
    key = _read(path).strip()
    if len(key) < MIN_SECRET_BYTES:
        raise JwtConfigError(f"{path}: an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
    return key


def _pem_key(path: str) -> tuple[str, object]:
    try:
        key = load_pem_public_key(_read(path))
    except ValueError as e:
        raise JwtConfigError(f"{path} is not a PEM public key: {e}") from None
    if isinstance(key, rsa.RSAPublicKey):
        return "RS256", key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ES256", key
    raise JwtConfigError(f"{path}: only RSA (RS256) and P-256 (ES256) public keys are supported")


def _jwks(path: str) -> list[tuple[str | None, str, object]]:
    try:
        keys = jwt.PyJWKSet.from_json(_read(path).decode()).keys
    except (jwt.PyJWKError, ValueError, json.JSONDecodeError) as e:
        raise JwtConfigError(f"{path} is not a usable JWKS: {e}") from None
    out = []
    for k in keys:
        alg = k.algorithm_name
        if alg not in ASYMMETRIC:
            continue  # HS256 keys belong in --jwt-secret-file, other algorithms are not offered
        out.append((k.key_id, alg, k.key))
    if not out:
        raise JwtConfigError(f"{path}: no RS256 or ES256 key")
    return out


class JwtVerifier:
    """The configured keys and claim rules; `verify` is CPU only (no I/O), about 70 us for RS256."""

    def __init__(self, settings: JwtSettings) -> None:
        if not settings.enabled:
            raise JwtConfigError("no JWT key: give a JWKS file, a PEM public key or an HS256 secret file")
        if not settings.user_claim:
            raise JwtConfigError("jwt_user_claim must name a claim")
        self.settings = settings
        self._keys: list[tuple[str | None, str, object]] = []  # (kid, algorithm, key)
        if settings.jwks_file:
            self._keys += _jwks(settings.jwks_file)
        if settings.public_key_file:
            alg, key = _pem_key(settings.public_key_file)
            self._keys.append((None, alg, key))
        if settings.secret_file:
            self._keys.append((None, "HS256", _secret(settings.secret_file)))
        self._algorithms = sorted({alg for _, alg, _ in self._keys})
        # exp and nbf are checked when present (as EMQX: a token without exp does not expire)
        self._options = {"verify_aud": settings.audience is not None}

    def _candidates(self, kid: str | None, alg: str) -> list[object]:
        """Keys of the token's algorithm; with a `kid`, the key of that id first (JWKS)."""
        same = [(k, key) for k, a, key in self._keys if a == alg]
        if kid is not None:
            exact = [key for k, key in same if k == kid]
            if exact:
                return exact
        return [key for _, key in same]

    def verify(self, token: str) -> JwtClaims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise JwtError("jwt_malformed") from None
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise JwtError("jwt_algorithm")  # never `none`, never one without a configured key
        s = self.settings
        claims = None
        for key in self._candidates(header.get("kid"), alg):
            try:
                claims = jwt.decode(
                    token,
                    key,  # type: ignore[arg-type]
                    algorithms=[alg],
                    audience=s.audience,
                    issuer=s.issuer,
                    leeway=s.leeway_s,
                    options=self._options,  # type: ignore[arg-type]
                )
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.ExpiredSignatureError:
                raise JwtError("jwt_expired") from None
            except jwt.ImmatureSignatureError:
                raise JwtError("jwt_not_yet_valid") from None
            except (jwt.InvalidAudienceError, jwt.InvalidIssuerError, jwt.MissingRequiredClaimError):
                raise JwtError("jwt_bad_claims") from None
            except jwt.InvalidTokenError:
                raise JwtError("jwt_malformed") from None
        if claims is None:
            raise JwtError("jwt_bad_signature")
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user or user.startswith("$"):
            raise JwtError("jwt_no_user")
        device = None
        if s.device_claim is not None:
            d = claims.get(s.device_claim)
            device = d if isinstance(d, str) and d else None
        exp = claims.get("exp")
        return JwtClaims(user, device, float(exp) if isinstance(exp, int | float) else None)
