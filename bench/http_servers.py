"""Servers under test for bench/http_bench.py, and the bare FastAPI endpoint itself.

- the gateway (bench/common.py `start_gateway(workdir, "http", ...)`): `.venv/bin/gateway start
  --data-dir <tmp> --protocols http --http-port P` (or `python [-m cProfile -o FILE] -m gateway.cli
  start ...` from `--gateway-src` / with a profile), pinned to one CPU (`taskset -c`), ready when it
  logged `gateway ready` and `GET /healthz` answers 200. Default settings: flush policy `sync` (a
  202 waits for the group commit's fdatasync), uvloop.
- `start_bare`: this file run as a script (`python bench/http_servers.py bare --port P`): a FastAPI
  app with one route of the same shape, `POST /topics/{topic}/events`, that reads the body (as any
  handler must; `--ignore-body` skips even that) and answers an empty 202. It is served exactly as
  the gateway serves its HTTP port: `gateway.http.HttpAdapter` (uvicorn with the gateway's Config:
  lifespan off, no access log, no server header, httptools parser) on a uvloop event loop, so any
  change to the gateway's uvicorn settings applies to both.

Process figures (CPU seconds, idle detection, machine load) come from bench/common.py.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from common import REPO, Server, ServerError, free_port, healthz_ok, spawn, wait_ready

EVENTS_PATH = "/topics/{topic}/events"


# ---------------------------------------------------------------------------- the bare endpoint


def bare_app(read_body: bool = True):
    from fastapi import FastAPI, Request, Response

    app = FastAPI(title="bare", version="0")

    if read_body:

        @app.post(EVENTS_PATH, status_code=202, response_class=Response)
        async def publish(topic: str, request: Request) -> Response:
            await request.body()
            return Response(status_code=202)

    else:

        @app.post(EVENTS_PATH, status_code=202, response_class=Response)
        async def publish_ignoring_body(topic: str) -> Response:
            return Response(status_code=202)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def _serve_bare(host: str, port: int, read_body: bool) -> None:
    from gateway.http import HttpAdapter

    adapter = HttpAdapter(bare_app(read_body), host, port)
    await adapter.start()
    print(f"bare listening on {adapter.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await adapter.stop(0.5)


def bare_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the bare FastAPI endpoint of bench/http_bench.py")
    ap.add_argument("what", choices=["bare"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ignore-body", action="store_true")
    ap.add_argument("--event-loop", choices=("uvloop", "asyncio"), default="uvloop")
    a = ap.parse_args(argv)
    factory = None
    if a.event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve_bare(a.host, a.port, not a.ignore_body))


# ---------------------------------------------------------------------------- starting servers


def start_bare(workdir: Path, cpu: int | None, read_body: bool = True, timeout: float = 30.0) -> Server:
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "bare", "--port", str(port)]
    if not read_body:
        cmd.append("--ignore-body")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc, log_path = spawn("bare", cmd, workdir, cpu, env, str(REPO))
    server = Server("bare", proc, port, workdir, log_path)
    server.info = {"command": " ".join(cmd), "reads_body": read_body}
    return wait_ready(server, lambda: healthz_ok(port), timeout)


# ---------------------------------------------------------------------------- HTTP calls


def call(port: int, method: str, path: str, body: object = None, timeout: float = 10.0) -> tuple[int, object]:
    """A JSON request to 127.0.0.1:port (admin API, subscriptions); returns (status, parsed body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def create_topic(port: int, name: str, queues: int | None = None) -> None:
    body: dict[str, object] = {"name": name}
    if queues:
        body["queues"] = queues
    status, out = call(port, "POST", "/admin/topics", body)
    if status not in (200, 201):
        raise ServerError(f"creating topic {name}: {status} {out}")


if __name__ == "__main__":
    bare_main()
