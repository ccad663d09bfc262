"""Device token verification (messaging_processor/security/jwt_tokens.py) and its settings: ES256
from a PEM key, RS256 and ES256 from a JWKS file (by `kid`), the user and device claims, `iss`,
`aud`, `nbf` and `exp`, algorithms that are refused, key files the gateway refuses to start with,
and `%d` in ACL rules."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.config import ConfigError, Settings
from gateway.server import StartupError, jwt_verifier
from messaging_processor.security.acl import Principal, compile_rules, decide
from messaging_processor.security.jwt_tokens import (
    JwtConfigError,
    JwtError,
    JwtSettings,
    JwtVerifier,
    looks_like_jwt,
)
from messaging_processor.security.records import Rule

EC_KEY = ec.generate_private_key(ec.SECP256R1())
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
SECRET = b"s" * 32


def claims(**extra: object) -> dict:
    return {"sub": "dev-7", "exp": int(time.time()) + 60} | extra


def pem(key) -> bytes:  # noqa: ANN001
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def refused(v: JwtVerifier, token: str) -> str:
    with pytest.raises(JwtError) as e:
        v.verify(token)
    return e.value.reason


@pytest.fixture
def ec_verifier(tmp_path) -> JwtVerifier:
    f = tmp_path / "ec.pem"
    f.write_bytes(pem(EC_KEY))
    return JwtVerifier(JwtSettings(public_key_file=str(f), device_claim="device_id"))


def test_es256_from_pem_with_user_and_device_claims(ec_verifier):
    exp = int(time.time()) + 60
    c = ec_verifier.verify(jwt.encode(claims(device_id="thermo-3", exp=exp), EC_KEY, "ES256"))
    assert (c.user, c.device, c.expires_at) == ("dev-7", "thermo-3", float(exp))
    other = ec.generate_private_key(ec.SECP256R1())
    assert refused(ec_verifier, jwt.encode(claims(), other, "ES256")) == "jwt_bad_signature"
    assert (
        refused(ec_verifier, jwt.encode(claims(exp=int(time.time()) - 5), EC_KEY, "ES256")) == "jwt_expired"
    )
    nbf = jwt.encode(claims(nbf=int(time.time()) + 60), EC_KEY, "ES256")
    assert refused(ec_verifier, nbf) == "jwt_not_yet_valid"
    assert refused(ec_verifier, jwt.encode({"exp": int(time.time()) + 60}, EC_KEY, "ES256")) == "jwt_no_user"
    assert refused(ec_verifier, jwt.encode(claims(sub="$anonymous"), EC_KEY, "ES256")) == "jwt_no_user"
    # no key of those algorithms is configured: never `none`, never HS256 keyed by the public key
    assert refused(ec_verifier, jwt.encode(claims(), None, "none")) == "jwt_algorithm"
    assert refused(ec_verifier, jwt.encode(claims(), SECRET, "HS256")) == "jwt_algorithm"
    assert refused(ec_verifier, jwt.encode(claims(), RSA_KEY, "RS256")) == "jwt_algorithm"
    # a token without exp is accepted (as EMQX), and has no expiry
    assert ec_verifier.verify(jwt.encode({"sub": "dev-7"}, EC_KEY, "ES256")).expires_at is None


def test_jwks_keys_by_kid_issuer_and_audience(tmp_path):
    keys = []
    for kid, key, alg in (("r1", RSA_KEY, "RS256"), ("e1", EC_KEY, "ES256")):
        jwk = json.loads(jwt.get_algorithm_by_name(alg).to_jwk(key.public_key()))
        keys.append(jwk | {"kid": kid, "alg": alg, "use": "sig"})
    f = tmp_path / "jwks.json"
    f.write_text(json.dumps({"keys": keys}))
    v = JwtVerifier(
        JwtSettings(jwks_file=str(f), user_claim="username", audience="gateway", issuer="https://idp")
    )
    good = {"username": "dev-9", "aud": "gateway", "iss": "https://idp", "exp": int(time.time()) + 60}
    for kid, key, alg in (("r1", RSA_KEY, "RS256"), ("e1", EC_KEY, "ES256")):
        assert v.verify(jwt.encode(good, key, alg, headers={"kid": kid})).user == "dev-9"
    assert v.verify(jwt.encode(good, RSA_KEY, "RS256")).user == "dev-9"  # no kid: every RS256 key tried
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(v, jwt.encode(good, other, "RS256", headers={"kid": "r1"})) == "jwt_bad_signature"
    assert refused(v, jwt.encode(good | {"aud": "other"}, RSA_KEY, "RS256")) == "jwt_bad_claims"
    assert refused(v, jwt.encode(good | {"iss": "https://evil"}, RSA_KEY, "RS256")) == "jwt_bad_claims"
    no_aud = {k: x for k, x in good.items() if k != "aud"}
    assert refused(v, jwt.encode(no_aud, RSA_KEY, "RS256")) == "jwt_bad_claims"  # aud required when set


def test_hs256_secret_file_must_be_private_and_long(tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(SECRET + b"\n")
    f.chmod(0o644)
    with pytest.raises(JwtConfigError, match="readable by group or others"):
        JwtVerifier(JwtSettings(secret_file=str(f)))
    f.chmod(0o600)
    v = JwtVerifier(JwtSettings(secret_file=str(f)))
    assert v.verify(jwt.encode(claims(), SECRET, "HS256")).user == "dev-7"
    f.write_bytes(b"short")
    with pytest.raises(JwtConfigError, match="at least 32 bytes"):
        JwtVerifier(JwtSettings(secret_file=str(f)))


def test_settings_and_startup_refusals(tmp_path):
    with pytest.raises(ConfigError, match="need auth"):
        Settings(jwt_public_key="k.pem")
    with pytest.raises(ConfigError, match="jwt_user_claim"):
        Settings(auth=True, jwt_public_key="k.pem", jwt_user_claim="")
    assert jwt_verifier(Settings(auth=True)) is None
    with pytest.raises(StartupError, match="cannot read") as e:
        jwt_verifier(Settings(auth=True, jwt_secret_file=str(tmp_path / "missing")))
    assert "device tokens" in str(e.value)
    bad = tmp_path / "not.pem"
    bad.write_text("hello")
    with pytest.raises(StartupError, match="not a PEM public key"):
        jwt_verifier(Settings(auth=True, jwt_public_key=str(bad)))


def test_token_shape():
    assert looks_like_jwt(jwt.encode(claims(), SECRET, "HS256"))
    for text in ("", "password", "a.b.c", "gwt_1234_abcdef", "alice.pw.not-a-token", "aaaa.bbbb.cc=c"):
        assert not looks_like_jwt(text), text


def test_device_variable_in_rules():
    rules = [Rule("1", "anyone", "topic", "devices/%d/#", ("publish",), False)]
    p = Principal("dev-7", "user", "cid", "mqtt", external=True, device="d1")
    compile_rules(p, rules, 1)
    assert decide(p, "publish", "topic", "devices/d1/t")
    assert not decide(p, "publish", "topic", "devices/d2/t")
    for device in (None, "d/1", "+", "#"):  # no device id, or one with wildcards: the rule never applies
        q = Principal("dev-7", "user", "cid", "mqtt", external=True, device=device)
        compile_rules(q, rules, 1)
        assert not decide(q, "publish", "topic", "devices/d1/t")
        assert not decide(q, "publish", "topic", "devices/+/t")
