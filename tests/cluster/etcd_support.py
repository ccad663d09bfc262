"""A real single-member etcd for tests: free loopback ports, a temporary data dir, stop and start
again on the same data dir and ports (to test a controller across an etcd outage)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_missing() -> bool:
    return not Path(ETCD).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdProcess:
    """One etcd member named `t`; `endpoint` is its client URL."""

    def __init__(self, root: Path) -> None:
        self.data_dir = root / "etcd-data"
        self.log_path = root / "etcd.log"
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        """Start etcd and wait until it serves requests."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [ETCD, "--name", "t", "--data-dir", str(self.data_dir)]
        args += ["--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint]
        args += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        args += ["--initial-cluster", f"t={peer}"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited ({self._proc.returncode}): {self.log_path.read_text()[-2000:]}"
                )
            try:  # a linearizable read answers only once the member leads
                if httpx.post(f"{self.endpoint}/v3/kv/range", json={"key": "eA=="}, timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not answer within {timeout} s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
