"""A `gateway` subprocess (any subcommand) whose stderr is read line by line on a thread: what the
process tests (tests/gateway/test_process.py, tests/cluster/) wait on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.streamlines import StreamLines

BIN = Path(sys.executable).parent
GATEWAY = [str(BIN / "gateway")] if (BIN / "gateway").exists() else [sys.executable, "-m", "gateway.cli"]
REPO = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"INFO gateway: (\w+) listening on (\S+)$")


class GatewayProc:
    """`gateway <args>` without any GATEWAY_* variable of the test environment."""

    def __init__(self, args: list[str], name: str = "gateway", *, new_session: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        self.name = name
        self.p = subprocess.Popen(
            GATEWAY + args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
            start_new_session=new_session,
        )
        assert self.p.stderr is not None
        self._out = StreamLines(self.p.stderr)
        self.lines = self._out.lines

    def wait_line(self, pattern: str, timeout: float = 30) -> re.Match | None:
        """The first new line matching `pattern`, or None if the process ended or time ran out."""
        return self._out.wait_line(pattern, timeout)

    def drain(self) -> str:
        """Everything it wrote, waiting up to 5 s for each further line (for a process ending)."""
        self._out.collect(5)
        return "\n".join(self.lines)

    def output(self) -> str:
        """The last 60 lines written so far (no waiting)."""
        self._out.collect(None)
        return "\n".join(self.lines[-60:])

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM; the exit code."""
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout)
