"""Password hashing: argon2id through argon2-cffi (RFC 9106 low-memory parameters).

A verify costs about 0.1 s of CPU by design, so callers run it off the event loop (`verify`
is a plain function; `Security` calls it in a worker thread) and remember a success for the
connection's lifetime instead of verifying every request."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_HASHER = PasswordHasher()  # argon2id, t=3, m=64 MiB, p=4 (argon2-cffi's RFC 9106 low-memory profile)

# A hash no password matches: verifying an unknown user costs the same time as a known one.
DUMMY_HASH = _HASHER.hash("no user has this password: it only spends the same time")


def hash_password(password: str) -> str:
    """The argon2id hash (PHC string, salt included) of `password`."""
    if not password:
        raise ValueError("a password must not be empty")
    return _HASHER.hash(password)


def verify(password_hash: str, password: str) -> bool:
    """Whether `password` matches `password_hash` (constant-time inside argon2)."""
    try:
        return _HASHER.verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
