"""Runs conformance scenarios: each (scenario, client) pair is one process of a real third-party
client library, in that client's own environment, against a live gateway.

The runner itself uses only the standard library. Per pair it creates the topics and groups the
scenario declares (unique names per run) through the gateway's admin API, starts the client's
scenario script with a JSON config, enforces the scenario's timeout and reads the one JSON result
line the script prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from conformance.admin import AdminClient, AdminError

REPO = Path(__file__).resolve().parent.parent
CLIENTS_DIR = Path(__file__).resolve().parent / "clients"


# --------------------------------------------------------------------------- clients


@dataclass(frozen=True)
class ClientEnv:
    """One third-party client: how to start its scenario script and how to tell it is installed."""

    name: str
    description: str
    command: Callable[[], list[str]]  # interpreter + script
    installed: Callable[[], str | None]  # None when ready, else what is missing


def _python_command() -> list[str]:
    exe = os.environ.get("CONFORMANCE_PYTHON") or str(REPO / ".venv-conformance" / "bin" / "python")
    return [exe, str(CLIENTS_DIR / "python" / "scenarios.py")]


def _python_installed() -> str | None:
    exe = Path(_python_command()[0])
    if not exe.exists():
        return f"{exe} is missing (run `make install-conformance`)"
    return None


def _node_command() -> list[str]:
    exe = os.environ.get("CONFORMANCE_NODE") or shutil.which("node") or "node"
    return [exe, str(CLIENTS_DIR / "node" / "scenarios.js")]


def _node_installed() -> str | None:
    if not shutil.which(_node_command()[0]) and not Path(_node_command()[0]).exists():
        return "node is not on PATH"
    if not (CLIENTS_DIR / "node" / "node_modules" / "rocketmq-client-nodejs").is_dir():
        return "conformance/clients/node/node_modules is missing (run `make install-conformance`)"
    return None


CLIENTS: dict[str, ClientEnv] = {
    "python": ClientEnv(
        "python",
        "rocketmq-python-client 5.1.2 (PyPI) in .venv-conformance",
        _python_command,
        _python_installed,
    ),
    "node": ClientEnv(
        "node",
        "rocketmq-client-nodejs 1.0.8 (npm) in conformance/clients/node",
        _node_command,
        _node_installed,
    ),
}


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Names:
    """Unique resource names for one (scenario, client) run."""

    prefix: str

    def topic(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def group(self, role: str) -> str:
        return f"{self.prefix}-g{role}"


@dataclass(frozen=True)
class Scenario:
    """A scenario of one protocol. ``topics``/``groups`` map a role to the admin API fields the
    runner creates them with; ``params`` are passed to the script (a callable gets the names)."""

    name: str
    summary: str
    clients: tuple[str, ...]
    topics: dict[str, dict] = field(default_factory=dict)
    groups: dict[str, dict] = field(default_factory=dict)
    params: dict | Callable[[Names], dict] = field(default_factory=dict)
    timeout: float = 60.0
    # Clients that cannot run this scenario, with the reason (shown as SKIP in the table).
    unsupported: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    host: str = "127.0.0.1"
    grpc_port: int = 8081
    http_port: int = 8082

    @property
    def grpc_endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.grpc_port}"

    def admin(self) -> AdminClient:
        return AdminClient(self.host, self.http_port)


@dataclass
class Result:
    protocol: str
    scenario: str
    client: str
    status: str  # PASS, FAIL, SKIP
    reason: str = ""
    elapsed: float = 0.0
    details: dict = field(default_factory=dict)
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"

    def to_json(self) -> dict:
        return {
            "protocol": self.protocol,
            "scenario": self.scenario,
            "client": self.client,
            "status": self.status,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed, 2),
            "details": self.details,
            "log_dir": self.log_dir,
        }


def registry() -> dict[str, dict[str, Scenario]]:
    """protocol → scenario name → Scenario."""
    from conformance.protocols import REGISTRY

    return REGISTRY


def new_run_id() -> str:
    return time.strftime("%H%M%S") + secrets.token_hex(2)


def run_scenario(
    target: Target,
    protocol: str,
    scenario: str | Scenario,
    client: str,
    *,
    run_id: str | None = None,
    log_dir: str | Path | None = None,
    extra_params: dict | None = None,
    names: Names | None = None,
    setup: bool = True,
) -> Result:
    """Run one scenario with one client in its own process; never raises for scenario failures.

    ``scenario`` is a registered name or a Scenario (e.g. a helper of tests/conformance). ``names``
    fixes the resource names (to reuse them across runs, then ``setup=False`` skips creating them).
    """
    spec = scenario if isinstance(scenario, Scenario) else registry()[protocol][scenario]
    scenario = spec.name
    if client in spec.unsupported:
        return Result(protocol, scenario, client, "SKIP", spec.unsupported[client])
    if client not in spec.clients:
        return Result(protocol, scenario, client, "SKIP", f"{client} has no script for this scenario")
    env_spec = CLIENTS[client]
    missing = env_spec.installed()
    if missing:
        return Result(protocol, scenario, client, "FAIL", f"client environment not installed: {missing}")

    run_id = run_id or new_run_id()
    names = names or Names(f"cf{run_id}-{scenario.replace('_', '')}-{client}")
    work = Path(log_dir or tempfile.mkdtemp(prefix="conformance-")) / f"{protocol}-{scenario}-{client}"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    topics = {role: names.topic(role) for role in spec.topics}
    groups = {role: names.group(role) for role in spec.groups}
    if setup:
        try:
            admin = target.admin()
            for role, fields in spec.topics.items():
                admin.create_topic(topics[role], **fields)
            for role, fields in spec.groups.items():
                admin.create_group(groups[role], **fields)
        except AdminError as e:
            return Result(
                protocol,
                scenario,
                client,
                "FAIL",
                f"setup failed: {e}",
                time.monotonic() - started,
                log_dir=str(work),
            )

    params = spec.params(names) if callable(spec.params) else dict(spec.params)
    params.update(extra_params or {})
    config = {
        "endpoint": target.grpc_endpoint,
        "topics": topics,
        "groups": groups,
        "timeout": spec.timeout,
        "params": params,
    }
    cmd = [*env_spec.command(), scenario, json.dumps(config)]
    env = dict(os.environ)
    env["HOME"] = str(work)  # both clients write their logs under $HOME/logs
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(work),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=spec.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    elapsed = time.monotonic() - started
    (work / "stdout.txt").write_text(out or "")
    (work / "stderr.txt").write_text(err or "")

    line = _last_json_line(out or "")
    if timed_out:
        return Result(
            protocol,
            scenario,
            client,
            "FAIL",
            f"timed out after {spec.timeout:.0f}s{_tail(err)}",
            elapsed,
            log_dir=str(work),
        )
    if line is None:
        return Result(
            protocol,
            scenario,
            client,
            "FAIL",
            f"no result line (exit {proc.returncode}){_tail(err)}",
            elapsed,
            log_dir=str(work),
        )
    ok = bool(line.get("ok")) and proc.returncode == 0
    reason = line.get("reason", "") if not ok else ""
    if not ok and not reason:
        reason = f"exit code {proc.returncode}"
    return Result(
        protocol,
        scenario,
        client,
        "PASS" if ok else "FAIL",
        reason,
        elapsed,
        line.get("details", {}),
        str(work),
    )


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _last_json_line(out: str) -> dict | None:
    for raw in reversed(out.strip().splitlines()):
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                continue
    return None


def _tail(err: str | None, n: int = 3) -> str:
    lines = [x for x in (err or "").strip().splitlines() if x.strip()]
    return (": " + " | ".join(lines[-n:])[:400]) if lines else ""


def run_all(
    target: Target,
    protocols: Iterable[str],
    clients: Iterable[str],
    *,
    scenarios: Iterable[str] | None = None,
    jobs: int = 1,
    log_dir: str | Path | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    reg = registry()
    run_id = new_run_id()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="conformance-"))
    wanted = set(scenarios) if scenarios else None
    pairs = [(p, s, c) for p in protocols for s in reg[p] if wanted is None or s in wanted for c in clients]
    results: list[Result] = []

    def one(pair):
        r = run_scenario(target, *pair, run_id=run_id, log_dir=log_dir)
        if on_result:
            on_result(r)
        return r

    if jobs <= 1:
        results = [one(pair) for pair in pairs]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, pairs))
    return results


def format_table(results: list[Result], clients: list[str]) -> str:
    rows: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        rows.setdefault((r.protocol, r.scenario), {})[r.client] = r

    def cell(r: Result | None) -> str:
        if r is None:
            return "-"
        return f"{r.status} {r.elapsed:.1f}s" if r.status != "SKIP" else "SKIP"

    header = ["protocol", "scenario", *clients]
    body = [[p, s, *(cell(rows[(p, s)].get(c)) for c in clients)] for (p, s) in rows]
    widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row) for row in body]
    notes = [r for r in results if r.status in ("FAIL", "SKIP")]
    if notes:
        lines.append("")
        for r in notes:
            where = f" [{r.log_dir}]" if r.status == "FAIL" and r.log_dir else ""
            lines.append(f"{r.status} {r.protocol}/{r.scenario}/{r.client}: {r.reason}{where}")
    return "\n".join(lines)
