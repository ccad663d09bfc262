"""The HMAC-SHA1 signatures RocketMQ clients send instead of a password.

- gRPC (`apache.rocketmq.v2`): metadata `authorization: MQv2-HMAC-SHA1 Credential=<AK>,
  SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secret, x-mq-date-time)>` (the official
  Python and Node clients' `Signature.sign`).
- 4.x remoting (ACL 1.0): ext field `Signature` = base64 HMAC-SHA1(secret, the values of every other
  ext field concatenated in key order, then the body), as ali-ons and the C++ client's RPC hook
  compute it and RocketMQ's PlainAccessValidator checks it."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping


def grpc_signature(secret: str, date_time: str) -> str:
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def remoting_content(ext_fields: Mapping[str, str], body: bytes | None) -> bytes:
    """What a remoting request's Signature signs: ext field values by key, Signature left out, + body."""
    text = "".join(str(ext_fields[k]) for k in sorted(ext_fields) if k != "Signature")
    data = text.encode()
    return data + body if body else data


def remoting_signature(secret: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def same(a: str, b: str) -> bool:
    """Constant-time comparison of two signatures or secrets."""
    return hmac.compare_digest(a.encode(), b.encode())
