"""The cluster secret's connect-time handshake (docs/security.md, "Closed cluster"), sans-IO: what
the two ends of a name server or store node connection compute and check. `remoting/client.py`
sends the hello, `remoting/server.py` answers it before serving anything else.

    client -> AUTH (9180)  nonce, ts, mac = HMAC-SHA256(secret, "gateway-cluster-v1|client|nonce|ts")
    server -> SUCCESS      mac = HMAC-SHA256(secret, "gateway-cluster-v1|server|nonce|ts")
              or NO_PERMISSION (16), and the connection closed

The server checks the MAC in constant time, the timestamp within `window_s` of its clock and that
the nonce was not seen within that window (a recorded hello cannot be replayed); the client checks
the server's MAC over its own fresh nonce, so a server without the secret is refused too. The
roles in the MAC keep one side's proof from being reflected as the other's.

Hand-written over the standard library's `hmac` and `secrets`: a TLS-PSK or SASL library would
bring a second handshake layer for what is one request and one reply on an existing wire."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable

AUTH_CODE = 9180  # the hello's request code (beside the store protocol's internal 919x codes)
PROTOCOL = "gateway-cluster-v1"
MIN_SECRET_BYTES = 16
WINDOW_S = 60.0  # accepted clock difference, and how long a nonce is remembered
AUTH_TIMEOUT_S = 10.0  # a server closes a connection that has not authenticated by then


class ClusterSecretError(ValueError):
    """The secret file cannot be used (missing, empty, too short, readable by others)."""


class AuthRefused(Exception):
    """One side refused the other; the message says why and never holds the secret."""


def read_secret(path: str) -> bytes:
    """The secret in `path` (surrounding whitespace stripped). Secure by default: refused when the
    file is missing, empty, shorter than MIN_SECRET_BYTES or readable by group or others."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read().strip()
    except OSError as e:
        raise ClusterSecretError(f"cluster_secret_file {path}: cannot read it: {e.strerror or e}") from e
    if mode & 0o077:
        raise ClusterSecretError(
            f"cluster_secret_file {path}: mode {stat.S_IMODE(mode):04o} lets group or others read it; "
            f"make it readable by its owner only (chmod 600 {path})"
        )
    if not data:
        raise ClusterSecretError(f"cluster_secret_file {path} is empty")
    if len(data) < MIN_SECRET_BYTES:
        raise ClusterSecretError(
            f"cluster_secret_file {path}: the secret is {len(data)} bytes, at least {MIN_SECRET_BYTES} are "
            "needed (e.g. `openssl rand -hex 32`)"
        )
    return data


def _mac(secret: bytes, role: str, nonce: str, ts: str) -> str:
    text = f"{PROTOCOL}|{role}|{nonce}|{ts}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


class ClusterAuth:
    """One process's cluster secret: builds and checks hellos. Its repr never shows the secret."""

    __slots__ = ("_secret", "_seen", "clock", "window_s")

    def __init__(self, secret: bytes, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time):
        if len(secret) < MIN_SECRET_BYTES:
            raise ClusterSecretError(f"a cluster secret needs at least {MIN_SECRET_BYTES} bytes")
        self._secret = secret
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[str, float] = {}  # nonces of accepted hellos -> when they may be forgotten

    @classmethod
    def from_file(cls, path: str) -> ClusterAuth:
        return cls(read_secret(path))

    def __repr__(self) -> str:
        return "ClusterAuth(<secret hidden>)"

    # ------------------------------------------------------------------ client side
    def hello(self) -> dict[str, str]:
        """The extFields of a new AUTH request (a fresh nonce each time)."""
        nonce, ts = secrets.token_hex(16), str(int(self.clock() * 1000))
        return {"nonce": nonce, "ts": ts, "mac": _mac(self._secret, "client", nonce, ts)}

    def check_welcome(self, hello: dict[str, str], reply: dict[str, str]) -> None:
        """Check the server's answer to `hello`; AuthRefused when it does not hold the secret."""
        want = _mac(self._secret, "server", hello["nonce"], hello["ts"])
        if not hmac.compare_digest(want, str(reply.get("mac", ""))):
            raise AuthRefused("bad cluster secret (the server's answer does not match ours)")

    # ------------------------------------------------------------------ server side
    def check_hello(self, ext: dict[str, str]) -> dict[str, str]:
        """Check a client's AUTH extFields; the reply's extFields, or AuthRefused with the reason."""
        nonce, ts, mac = ext.get("nonce", ""), ext.get("ts", ""), ext.get("mac", "")
        if not (nonce and ts.isdigit() and mac) or len(nonce) > 128:
            raise AuthRefused("malformed cluster authentication")
        if not hmac.compare_digest(_mac(self._secret, "client", nonce, ts), mac):
            raise AuthRefused("bad cluster secret")
        now = self.clock()
        skew = int(ts) / 1000 - now
        if abs(skew) > self.window_s:
            raise AuthRefused(
                f"cluster authentication {skew:+.0f} s off this clock (limit {self.window_s:g} s)"
            )
        self._forget(now)
        if nonce in self._seen:
            raise AuthRefused("replayed cluster authentication")
        self._seen[nonce] = now + 2 * self.window_s
        return {"mac": _mac(self._secret, "server", nonce, ts)}

    def _forget(self, now: float) -> None:
        """Drop nonces whose hellos could no longer pass the timestamp check anyway."""
        if self._seen and next(iter(self._seen.values())) < now:
            self._seen = {n: t for n, t in self._seen.items() if t >= now}


__all__ = [
    "AUTH_CODE",
    "AUTH_TIMEOUT_S",
    "MIN_SECRET_BYTES",
    "AuthRefused",
    "ClusterAuth",
    "ClusterSecretError",
    "read_secret",
]
