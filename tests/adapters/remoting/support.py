"""Helpers of the 4.x remoting adapter tests: the gateway core (tests/support.py) with a
RemotingAdapter (and optionally the MQTT, gRPC and AMQP adapters) listening, restartable on the same
data directory; raw requests; and the real RocketMQ 4.x clients (clients/) run as subprocesses:

- ali-ons (npm, pure JS): clients/node/node_modules, from its package-lock.json;
- PyPI `rocketmq` 0.4.4 (the Apache C++ client behind ctypes): the virtualenv .venv-remoting, from
  clients/python/requirements.lock (its import name clashes with the 5.x client).

`make install-remoting-clients` (part of `make test`) installs both; tests that need a missing one
are skipped with the command to run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from adapters.remoting import RemotingAdapter
from adapters.remoting.message_codec import encode_properties
from messaging_processor import ClientContext
from remoting import RemotingCommand, RequestCode
from remoting.client import RemotingClient
from tests.support import Core

CTX = ClientContext("test", client_id="other-protocol")


class Env:
    """A Core with a RemotingAdapter (`adapter`, listening on `port`) and the `extra` adapters."""

    def __init__(self, core: Core, adapter: RemotingAdapter) -> None:
        self.core = core
        self.store = core.store
        self.processor = core.processor
        self.adapter = adapter
        self.extra: list = []

    @property
    def port(self) -> int:
        return self.adapter.bound_port

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def client(self, **kw) -> RemotingClient:
        return await RemotingClient.connect("127.0.0.1", self.port, **kw)


async def open_env(
    data_dir: str,
    port: int = 0,
    *,
    auto_create: bool = True,
    queues: int = 2,
    mqtt: bool = False,
    grpc: bool = False,
    amqp: bool = False,
    auth: bool = False,
    traced: bool = False,
    store_kw: dict | None = None,
    **adapter_kw,
) -> Env:
    core = await Core.open(
        data_dir,
        auth=auth,
        traced=traced,
        processor_kw={"auto_create_topics": auto_create},
        default_queues=queues,
        **(store_kw or {}),
    )
    adapter_kw.setdefault("hold_interval", 0.05)
    adapter = RemotingAdapter(core.processor, "127.0.0.1", port, default_queues=queues, **adapter_kw)
    env = Env(core, await core.add(adapter))
    if mqtt:
        from adapters.mqtt import MqttAdapter

        mqtt_adapter = MqttAdapter(core.processor, "127.0.0.1", 0, topic_scan_interval=0.05)
        env.extra.append(await core.add(mqtt_adapter))
    if grpc:
        from adapters.grpc import GrpcAdapter

        env.extra.append(await core.add(GrpcAdapter(core.processor, host="127.0.0.1", port=0)))
    if amqp:
        from adapters.amqp import AmqpAdapter

        env.extra.append(await core.add(AmqpAdapter(core.processor, "127.0.0.1", 0)))
    return env


async def close_env(env: Env) -> None:
    await env.core.close()


def send_v2_fields(
    topic: str, props: dict[str, str], *, queue_id: int = 0, group: str = "PG", **extra
) -> dict:
    """SEND_MESSAGE_V2 extFields as ali-ons sends them (JSON numbers and booleans)."""
    fields = {
        "a": group, "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
        "g": 1_700_000_000_000, "h": 0, "i": encode_properties(props), "j": 0, "k": False,
    }  # fmt: skip
    fields.update(extra)
    return fields


def raw_request(
    code: int, opaque: int, ext: dict, body: bytes = b"", *, version: int = 121, flag: int = 0
) -> bytes:
    """A request frame with extFields exactly as given (numbers stay JSON numbers)."""
    head = json.dumps(
        {
            "code": code,
            "extFields": ext,
            "flag": flag,
            "language": "JAVA",
            "opaque": opaque,
            "version": version,
        }
    ).encode()
    return struct.pack(">II", 4 + len(head) + len(body), len(head)) + head + body


async def send(
    client: RemotingClient, topic: str, body: bytes, props: dict[str, str] | None = None, **kw
) -> RemotingCommand:
    """SEND_MESSAGE_V2 through a raw frame (JSON-number extFields); returns the response."""
    cmd = client.command(RequestCode.SEND_MESSAGE_V2)
    frame = raw_request(
        RequestCode.SEND_MESSAGE_V2, cmd.opaque, send_v2_fields(topic, props or {}, **kw), body
    )
    return await client.invoke(cmd, raw=frame)


# ---------------------------------------------------------------------------------------- real clients

REPO = Path(__file__).resolve().parents[3]
CLIENTS = Path(__file__).resolve().parent / "clients"
NODE_DIR = CLIENTS / "node"
ALIONS_JS = NODE_DIR / "alions.js"
CPP_PY = CLIENTS / "python" / "cpp_client.py"
VENV_PY = Path(os.environ.get("REMOTING_CLIENT_VENV", REPO / ".venv-remoting")) / "bin" / "python"
INSTALL_HINT = "run `make install-remoting-clients` (part of `make test`)"


def alions_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "ali-ons" / "package.json").exists():
        return f"ali-ons is not installed in {NODE_DIR}/node_modules: {INSTALL_HINT}"
    return None


def cpp_missing() -> str | None:
    if not VENV_PY.exists():
        return f"{VENV_PY} does not exist: {INSTALL_HINT}"
    lib = VENV_PY.parent.parent.glob("lib/python*/site-packages/rocketmq/librocketmq.so")
    if not any(lib):
        return f"PyPI rocketmq 0.4.4 is not installed in {VENV_PY.parent.parent}: {INSTALL_HINT}"
    return None


needs_alions = pytest.mark.skipif(alions_missing() is not None, reason=str(alions_missing()))
needs_cpp = pytest.mark.skipif(cpp_missing() is not None, reason=str(cpp_missing()))


class ClientFailed(AssertionError):
    pass


async def run(kind: str, *args: str, home: Path, timeout: float = 90.0) -> list[dict]:
    """Run one client mode; returns its JSON events. Raises ClientFailed with its output otherwise."""
    if kind == "alions":
        cmd = ["node", str(ALIONS_JS), *args]
    elif kind == "cpp":
        cmd = [str(VENV_PY), str(CPP_PY), *args]
    else:
        raise ValueError(kind)
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}  # the C++ client logs to ~/logs/rocketmq-cpp
    env.pop("PYTHONPATH", None)
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=str(home)
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise ClientFailed(
            f"{kind} {' '.join(args)} timed out\nstdout:\n{out.decode()}\nstderr:\n{err.decode()[-4000:]}"
        ) from None
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        raise ClientFailed(
            f"{kind} {' '.join(args)} exited {proc.returncode}\nstdout:\n{out.decode()}\n"
            f"stderr:\n{err.decode()[-4000:]}"
        )
    return events


def received(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("event") == "received"]


GRPC_RECEIVE = CLIENTS / "python" / "grpc_receive.py"


def grpc_available() -> bool:
    """The official 5.x Python client is a dev dependency of the project's own .venv."""
    import importlib.util

    try:
        return (
            importlib.util.find_spec("rocketmq") is not None and importlib.util.find_spec("grpc") is not None
        )
    except (ImportError, ValueError):
        return False


async def run_grpc_receive(endpoint: str, topic: str, group: str, count: int, *, home: Path) -> list[dict]:
    """Receive `count` messages with the official RocketMQ 5 client in a subprocess of this venv."""
    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(GRPC_RECEIVE), endpoint, topic, group, str(count),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    if proc.returncode != 0:
        raise ClientFailed(f"grpc_receive exited {proc.returncode}\n{err.decode()[-4000:]}")
    return list(json.loads(out.decode().strip().splitlines()[-1])["got"])
