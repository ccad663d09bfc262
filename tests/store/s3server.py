"""A local S3-compatible server for tests: moto's server mode (`python -m moto.server`) in a
subprocess on a free loopback port. In-memory: a restart loses every bucket, so tests that need
"the store comes back" pause it (SIGSTOP/SIGCONT through `S3Server.pause`/`resume`) instead.

    with s3_server() as s3:          # or: endpoint, stop = start_s3_server()
        s3.endpoint                  # "http://127.0.0.1:PORT"
        s3.create_bucket("b")
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# moto accepts any credentials; boto3 needs some (tests must not pick up a developer's real ones)
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen

    def client(self):  # noqa: ANN201 - a boto3 S3 client (boto3 has no importable client type)
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=TEST_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=TEST_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=TEST_ENV["AWS_DEFAULT_REGION"],
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def pause(self) -> None:
        """Unreachable (connections hang) until `resume`, data kept."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_s3(min_part_size: int | None = None, timeout: float = 30.0) -> S3Server:
    """Start a moto S3 server; returns once it answers HTTP. `min_part_size`: the smallest
    multipart part but the last it accepts (S3's is 5 MiB; tests lower it)."""
    for k, v in TEST_ENV.items():
        os.environ.setdefault(k, v)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "S3_UPLOAD_PART_MIN_SIZE": str(min_part_size or 5 << 20)},
    )
    endpoint = f"http://127.0.0.1:{port}"
    server = S3Server(endpoint, proc)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=1):
                return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.05)


def start_s3_server(min_part_size: int | None = None) -> tuple[str, Callable[[], None]]:
    """(endpoint, stop) of a fresh moto S3 server."""
    s = start_s3(min_part_size)
    return s.endpoint, s.stop


@contextlib.contextmanager
def s3_server(min_part_size: int | None = None) -> Iterator[S3Server]:
    s = start_s3(min_part_size)
    try:
        yield s
    finally:
        s.stop()
