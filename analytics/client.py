"""HTTP client of the gateway's read API (docs/gateway.md, "Read API"), used by the Spark source on
the driver (queues, offsets, commits) and on executors (range reads), and by the telemetry job
(publishing anomaly events as CloudEvents, creating topics).

Only the standard library (urllib) and pyarrow: executors need nothing else. A `ReadClient` holds
no open connection, so it can be created anywhere; readers create theirs inside `read()`."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_URL = "http://127.0.0.1:8082"
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class GatewayError(RuntimeError):
    """The gateway answered with an error (or could not be reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class DataLossError(GatewayError):
    """Offsets asked for are no longer stored (removed by retention)."""


def default_url() -> str:
    """`$GATEWAY_URL`, else http://127.0.0.1:8082."""
    return os.environ.get("GATEWAY_URL") or DEFAULT_URL


def authorization(
    user: str | None = None, password: str | None = None, token: str | None = None
) -> str | None:
    """The `Authorization` header for a gateway with `auth` on (docs/security.md): a token (Bearer),
    else user and password (Basic), else `$GATEWAY_TOKEN`, else `$GATEWAY_USER`/`$GATEWAY_PASSWORD`;
    None when none is given (a gateway without auth)."""
    if token is None and user is None:
        token = os.environ.get("GATEWAY_TOKEN") or None
        if token is None:
            user, password = os.environ.get("GATEWAY_USER") or None, os.environ.get("GATEWAY_PASSWORD")
    if token:
        return f"Bearer {token}"
    if user:
        return "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()
    return None


class ReadClient:
    """The read API of one gateway (`url`: its HTTP address, e.g. http://gw:8082). `auth`: the
    Authorization header to send (default: `authorization()` from the environment)."""

    def __init__(self, url: str | None = None, timeout: float = 60.0, auth: str | None = None) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.timeout = timeout
        self.auth = auth if auth is not None else authorization()

    def __repr__(self) -> str:  # never show the credentials
        return f"ReadClient({self.url!r})"

    # ------------------------------------------------------------------ plumbing
    def _open(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        data = None
        hdrs = dict(headers or {})
        if self.auth:
            hdrs["Authorization"] = self.auth
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs["Content-Type"] = content_type
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)  # noqa: S310 - http(s) URLs only
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("detail", detail)
            raise GatewayError(f"{method} {path}: {e.code} {detail}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise GatewayError(f"{method} {path}: cannot reach the gateway at {self.url}: {e}") from None

    def _json(self, method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None) -> Any:
        with self._open(method, path, params, body) as resp:
            return json.loads(resp.read() or b"null")

    @staticmethod
    def _q(name: str) -> str:
        return urllib.parse.quote(name, safe="")

    # ------------------------------------------------------------------ driver side
    def queues(self, topic: str) -> dict[int, tuple[int, int]]:
        """{queue id: (min offset, max offset)}: offsets [min, max) are readable now."""
        out = self._json("GET", f"/read/topics/{self._q(topic)}/queues")
        return {q["queue_id"]: (q["min_offset"], q["max_offset"]) for q in out["queues"]}

    def offsets_for_timestamp(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """Per queue, the first offset stored at or after `timestamp_ms`."""
        out = self._json("GET", f"/read/topics/{self._q(topic)}/offsets", {"timestamp": timestamp_ms})
        return {q["queue_id"]: q["offset"] for q in out["queues"]}

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offset per queue (-1: never committed)."""
        out = self._json("GET", f"/read/groups/{self._q(group)}/topics/{self._q(topic)}/offsets")
        return {q["queue_id"]: q["offset"] for q in out["queues"]}

    def commit(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Commit the group's progress (everything below each offset is consumed)."""
        body = {"offsets": {str(q): int(o) for q, o in offsets.items()}}
        out = self._json("POST", f"/read/groups/{self._q(group)}/topics/{self._q(topic)}/offsets", body=body)
        return {q["queue_id"]: q["offset"] for q in out["queues"]}

    # ------------------------------------------------------------------ executor side
    def read_range(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        *,
        path_filter: str | None = None,
        fetch_rows: int = 500_000,
        fail_on_data_loss: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Arrow record batches of the queue's messages with offsets in [start, end), in requests of
        up to `fetch_rows` offsets. Offsets below the queue's min (removed by retention) raise
        DataLossError, or are skipped when `fail_on_data_loss` is false."""
        import pyarrow as pa

        off = start
        path = f"/read/topics/{self._q(topic)}/queues/{queue_id}/messages"
        while off < end:
            params = {
                "start": off,
                "end": end,
                "max": min(fetch_rows, end - off),
                "format": "arrow",
                "path": path_filter,
            }
            with self._open("GET", path, params, headers={"Accept": ARROW_STREAM}) as resp:
                first = int(resp.headers["X-Start-Offset"])
                nxt = int(resp.headers["X-Next-Offset"])
                if first > off:
                    msg = (
                        f"offsets [{off}, {first}) of {topic}/{queue_id} are no longer stored "
                        "(retention); set failOnDataLoss=false to skip them"
                    )
                    if fail_on_data_loss:
                        raise DataLossError(msg)
                reader = pa.ipc.open_stream(resp)
                for batch in reader:
                    if batch.num_rows:
                        yield batch
            if nxt <= off:  # the queue ends before `off`: [off, end) is not stored (any more)
                if fail_on_data_loss:
                    raise DataLossError(f"offsets [{off}, {end}) of {topic}/{queue_id} are not stored")
                return
            off = nxt

    # ------------------------------------------------------------------ publishing (telemetry job)
    def topic(self, topic: str) -> dict[str, Any] | None:
        """The topic's settings from the admin API (`compacted`, `queues`, ...), None when missing."""
        try:
            return self._json("GET", f"/admin/topics/{self._q(topic)}")
        except GatewayError as e:
            if e.status != 404:
                raise
            return None

    def ensure_topic(self, topic: str, compacted: bool = False, queues: int | None = None) -> dict[str, Any]:
        """Create `topic` unless it exists (admin API), with the gateway's defaults or `queues`
        queues (per store), compacted when `compacted`; its settings."""
        found = self.topic(topic)
        if found is not None:
            return found
        body: dict[str, Any] = {"name": topic}
        if compacted:
            body["compacted"] = True
        if queues is not None:
            body["queues"] = queues
        return self._json("POST", "/admin/topics", body=body)

    def publish_events(self, topic: str, events: list[dict[str, Any]]) -> None:
        """Store structured CloudEvents on `topic` (batched mode, up to 1024 per request)."""
        for i in range(0, len(events), 1024):
            body = json.dumps(events[i : i + 1024]).encode()
            with self._open(
                "POST",
                f"/topics/{self._q(topic)}/events",
                body=body,
                content_type="application/cloudevents-batch+json",
            ) as resp:
                resp.read()
