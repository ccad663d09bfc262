"""What the bench smoke tests share: run a bench script to its one JSON object, and figure checks."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from typing import Any


def run_bench(cmd: list[str], limit_s: float) -> tuple[dict[str, Any], str, float]:
    """Run `cmd` (a bench with `--json`) in its own process group, so a timeout also kills the
    brokers it started; (its JSON object, its stderr, seconds taken). Fails on a timeout or a
    non-zero exit, with the end of stderr."""
    t = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"bench timed out:\n{err[-3000:]}") from None
    elapsed = time.monotonic() - t
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out), err, elapsed  # exactly one JSON object on stdout


def positive(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def share(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v >= 0
