"""A tiny client for the gateway's HTTP admin API (stdlib only: the runner must not need the
gateway's dependencies)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


class AdminError(RuntimeError):
    pass


class AdminClient:
    def __init__(self, host: str, http_port: int, timeout: float = 10.0) -> None:
        self.base = f"http://{_host_for_url(host)}:{http_port}"
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            raise AdminError(f"{method} {self.base}{path}: {e}") from e

    def healthy(self) -> bool:
        try:
            status, _ = self._request("GET", "/healthz")
        except AdminError:
            return False
        return status == 200

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise AdminError(f"{self.base}/healthz did not answer 200 within {timeout:.0f}s")
            time.sleep(0.1)

    def create_topic(self, name: str, **fields) -> None:
        self._create("/admin/topics", {"name": name, **fields})

    def create_group(self, name: str, **fields) -> None:
        self._create("/admin/groups", {"name": name, **fields})

    def _create(self, path: str, body: dict) -> None:
        status, text = self._request("POST", path, body)
        if status not in (200, 201, 409):  # 409: exists already (a rerun with the same names)
            raise AdminError(f"POST {path} {json.dumps(body)} -> {status} {text[:300]}")


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
