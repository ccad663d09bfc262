"""Servers under test for bench/http_bench.py, and the bare FastAPI endpoint itself.

- `start_gateway`: `.venv/bin/gateway start --protocols http --http-port P --data-dir <tmp>` (or
  `python [-m cProfile -o FILE] -m gateway.cli start ...` from `--gateway-src` / with a profile),
  pinned to one CPU (`taskset -c`), ready when it logged `gateway ready` and `GET /healthz` answers
  200. Default settings: flush policy `sync` (a 202 waits for the group commit's fdatasync), uvloop.
- `start_bare`: this file run as a script (`python bench/http_servers.py bare --port P`): a FastAPI
  app with one route of the same shape, `POST /topics/{topic}/events`, that reads the body (as any
  handler must; `--ignore-body` skips even that) and answers an empty 202. It is served exactly as
  the gateway serves its HTTP port: `gateway.http.HttpAdapter` (uvicorn with the gateway's Config:
  lifespan off, no access log, no server header, httptools parser) on a uvloop event loop, so any
  change to the gateway's uvicorn settings applies to both.

Process figures (CPU seconds, idle detection, machine load) come from bench/mqtt_servers.py.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mqtt_servers import Server, ServerError, _spawn, _wait, free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
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


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _env(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src or REPO)
    return env


def start_gateway(
    workdir: Path,
    cpu: int | None,
    extra_args: list[str],
    src: Path | None = None,
    profile: Path | None = None,
    timeout: float = 60.0,
) -> Server:
    port = free_port()
    args = [
        "start",
        "--data-dir",
        str(workdir / "data"),
        "--protocols",
        "http",
        "--http-port",
        str(port),
        *extra_args,
    ]
    script = Path(sys.executable).parent / "gateway"
    env = dict(os.environ)
    cwd = None
    if src is not None or profile is not None or not script.exists():
        env = _env(src)
        cwd = str(src or REPO)
        prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        cmd = [sys.executable, *prof, "-m", "gateway.cli", *args]
    else:
        cmd = [str(script), *args]
    proc, log_path = _spawn("gateway", cmd, workdir, cpu, env, cwd)
    server = Server("gateway", proc, port, workdir, log_path)
    server.info = {"command": " ".join(cmd), "src": str(src or REPO), "flush": _flush(extra_args)}
    return _wait(server, lambda: b"gateway ready" in log_path.read_bytes() and _healthy(port), timeout)


def start_bare(workdir: Path, cpu: int | None, read_body: bool = True, timeout: float = 30.0) -> Server:
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "bare", "--port", str(port)]
    if not read_body:
        cmd.append("--ignore-body")
    proc, log_path = _spawn("bare", cmd, workdir, cpu, _env(None), str(REPO))
    server = Server("bare", proc, port, workdir, log_path)
    server.info = {"command": " ".join(cmd), "reads_body": read_body}
    return _wait(server, lambda: _healthy(port), timeout)


def _flush(args: list[str]) -> str:
    for i, a in enumerate(args):
        if a == "--flush" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--flush="):
            return a.split("=", 1)[1]
    return os.environ.get("GATEWAY_FLUSH") or "sync (default)"


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
