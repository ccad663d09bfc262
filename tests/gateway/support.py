"""Helpers of the gateway process tests (also used by the MQTT and AMQP tests that need a real
`gateway start`): `start` a gateway subprocess on ephemeral ports, each one recorded in `started`
(tests/gateway/conftest.py kills what a test there left running)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from conformance.gateway_proc import GatewayError, GatewayProc


def grpc_available() -> bool:
    try:
        from adapters.grpc import GrpcAdapter  # noqa: F401
    except ImportError:
        return False
    return True


# The gRPC listener is tested too once its adapter exists in this tree.
PROTOCOLS = "grpc,http" if grpc_available() else "http"


started: list[Proc] = []


class Proc(GatewayProc):
    """A gateway subprocess, killed after the test."""

    def __init__(
        self,
        args: list[str],
        *,
        new_session: bool = False,
        env: Mapping[str, str] | None = None,
        **kw: Any,  # GatewayProc's: log_path, preexec_fn...
    ) -> None:
        super().__init__(args, new_session=new_session, env=env, **kw)
        started.append(self)


def start(
    tmp_path: Path,
    *extra: str,
    new_session: bool = False,
    env: Mapping[str, str] | None = None,
    protocols: str = PROTOCOLS,
) -> tuple[Proc, dict[str, str]]:
    """Start a gateway on ephemeral ports; wait for `gateway ready`; return it and its listeners.
    `env`: variables set for it (the caller's GATEWAY_* ones are never passed on)."""
    args = ["start", "--data-dir", str(tmp_path / "data"), "--protocols", protocols]
    args += ["--http-port", "0", "--grpc-port", "0", *extra]
    proc = Proc(args, new_session=new_session, env=env)
    try:
        return proc, proc.wait_ready(60)
    except GatewayError as e:
        pytest.fail(f"gateway did not start: {e}")
    except BaseException:
        proc.kill()  # never leave a gateway behind when the test fails
        raise
