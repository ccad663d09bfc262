"""Running the real RocketMQ 4.x clients (tests/remoting/clients/) as subprocesses.

- ali-ons (npm, pure JS): tests/remoting/clients/node/node_modules, from its package-lock.json;
- PyPI `rocketmq` 0.4.4 (the Apache C++ client behind ctypes): the virtualenv .venv-remoting, from
  tests/remoting/clients/python/requirements.lock (its import name clashes with the 5.x client).

`make install-remoting-clients` (part of `make test`) installs both; tests that need a missing one
are skipped with the command to run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
    import sys

    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(GRPC_RECEIVE), endpoint, topic, group, str(count),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    if proc.returncode != 0:
        raise ClientFailed(f"grpc_receive exited {proc.returncode}\n{err.decode()[-4000:]}")
    return list(json.loads(out.decode().strip().splitlines()[-1])["got"])
