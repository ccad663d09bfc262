"""A small client of etcd's v3 JSON API (the gRPC gateway on the client URL, `/v3/...`) over httpx.

Only what the controller uses: kv/range, kv/txn, lease/grant, lease/keepalive (one renewal per call),
lease/revoke. Keys and values travel base64-encoded and int64 fields as decimal strings.

Hand-written because no well-kept asyncio etcd v3 client on PyPI fits the project's lock: they
(aetcd, etcd3aio, python-etcd3-async) ship their own generated grpc/protobuf stubs and pin protobuf
below the 7.x this project uses (aetcd: `protobuf>4,<7`), and the API surface used here is five calls.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import httpx

from cluster.controller.base import ControllerError, ControllerUnavailable

NOT_FOUND = 5  # gRPC status code: e.g. "requested lease not found"
_UNAVAILABLE = 14  # gRPC status code: e.g. "no leader"


class EtcdError(ControllerError):
    """etcd answered with an error (gRPC status `code`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.code = code


def b64(data: str | bytes) -> str:
    """A key or value as the JSON API carries it."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: str) -> str:
    """The `range_end` (base64) that makes a range cover every key starting with `prefix`."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # prefixes used here end in "/", never in 0xff
    return b64(bytes(raw))


def _normalize(endpoints: str | Sequence[str]) -> list[str]:
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = [e.strip().rstrip("/") for e in items if e.strip()]
    if not out:
        raise ValueError("no etcd endpoint given")
    return [e if "://" in e else f"http://{e}" for e in out]


class EtcdApi:
    """POSTs to one of several etcd endpoints, moving to the next when one cannot be reached.

    Only a request that surely did not arrive (connection refused or not established, or etcd
    answering "unavailable") is tried on the next endpoint; any other transport failure raises
    ControllerUnavailable at once, since a write may have been applied.
    """

    def __init__(
        self, endpoints: str | Sequence[str], *, timeout_s: float = 3.0, connect_timeout_s: float = 1.0
    ) -> None:
        self.endpoints = _normalize(endpoints)
        self._current = 0
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._http = httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `/v3/<path>`; the decoded answer. Raises EtcdError or ControllerUnavailable."""
        failures: list[str] = []
        for step in range(len(self.endpoints)):
            index = (self._current + step) % len(self.endpoints)
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                resp = await self._http.post(url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                failures.append(f"{url}: {e!r}")
                continue
            except httpx.HTTPError as e:
                raise ControllerUnavailable(f"{url}: {e!r}") from e
            answer = resp.json() if resp.content else {}
            error = answer.get("error")
            if isinstance(error, dict):  # a streaming call's error: {"error": {"grpc_code": ...}}
                answer = {"code": error.get("grpc_code", error.get("http_code")), "message": error}
            if resp.status_code == 503 or answer.get("code") == _UNAVAILABLE:
                failures.append(f"{url}: {answer.get('message', resp.status_code)}")
                continue
            if resp.status_code >= 400 or ("code" in answer and "message" in answer):
                raise EtcdError(int(answer.get("code") or 0), str(answer.get("message", resp.status_code)))
            self._current = index
            return answer
        raise ControllerUnavailable("no etcd endpoint answered: " + "; ".join(failures))

    async def range_prefix(self, prefix: str) -> tuple[int, list[dict[str, Any]]]:
        """The store revision and the key-values under `prefix`."""
        answer = await self.call("kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)})
        return int(answer["header"]["revision"]), list(answer.get("kvs", []))

    async def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> tuple[bool, int]:
        """Apply `success` if every `compare` holds; (whether it did, the store revision after)."""
        answer = await self.call("kv/txn", {"compare": compare, "success": success, "failure": []})
        return bool(answer.get("succeeded", False)), int(answer["header"]["revision"])

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease; (its id, its TTL in seconds: etcd may raise a short TTL to its minimum)."""
        answer = await self.call("lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"]), int(answer["TTL"])

    async def keepalive(self, lease_id: int) -> int:
        """Renew a lease once; its TTL in seconds, 0 if it has expired or was revoked."""
        answer = await self.call("lease/keepalive", {"ID": str(lease_id)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease_id: int) -> bool:
        """Revoke a lease (deleting its keys); False if it was already gone."""
        try:
            await self.call("lease/revoke", {"ID": str(lease_id)})
        except EtcdError as e:
            if e.code == NOT_FOUND:
                return False
            raise
        return True

    async def aclose(self) -> None:
        await self._http.aclose()
