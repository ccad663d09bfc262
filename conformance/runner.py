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


def _conformance_python() -> str:
    return os.environ.get("CONFORMANCE_PYTHON") or str(REPO / ".venv-conformance" / "bin" / "python")


def _node() -> str:
    return os.environ.get("CONFORMANCE_NODE") or shutil.which("node") or "node"


def _python_script(script: str) -> Callable[[], list[str]]:
    return lambda: [_conformance_python(), str(CLIENTS_DIR / script)]


def _node_script(script: str) -> Callable[[], list[str]]:
    return lambda: [_node(), str(CLIENTS_DIR / script)]


def _python_installed(*packages: str) -> Callable[[], str | None]:
    """The conformance venv exists and holds ``packages`` (import names, checked on disk: importing
    them here would need that venv)."""

    def check() -> str | None:
        exe = Path(_conformance_python())
        if not exe.exists():
            return f"{exe} is missing (run `make install-conformance`)"
        if os.environ.get("CONFORMANCE_PYTHON"):
            return None  # someone else's interpreter: trust it
        site = list((REPO / ".venv-conformance" / "lib").glob("python3*/site-packages"))
        for pkg in packages:
            if not any((d / pkg).exists() for d in site):
                return f"{pkg} is not installed in .venv-conformance (run `make install-conformance`)"
        return None

    return check


def _node_installed(package: str) -> Callable[[], str | None]:
    def check() -> str | None:
        if not shutil.which(_node()) and not Path(_node()).exists():
            return "node is not on PATH"
        if not (CLIENTS_DIR / "node" / "node_modules" / package).is_dir():
            return (
                f"conformance/clients/node/node_modules/{package} is missing (run `make install-conformance`)"
            )
        return None

    return check


def _mosquitto_installed() -> str | None:
    missing = [exe for exe in ("mosquitto_pub", "mosquitto_sub") if not shutil.which(exe)]
    if missing:
        return f"{' and '.join(missing)} not on PATH (Debian mosquitto-clients: `make install-system`)"
    # The driver runs in the conformance venv: cross_protocol uses the RocketMQ Python client.
    return _python_installed("rocketmq")()


# RocketMQ 5 gRPC clients keep their historical names (python, node); MQTT clients are named after
# the library (paho, mqttjs) or tool (mosquitto), whatever language drives them.
CLIENTS: dict[str, ClientEnv] = {
    "python": ClientEnv(
        "python",
        "rocketmq-python-client 5.1.2 (PyPI) in .venv-conformance",
        _python_script("python/scenarios.py"),
        _python_installed("rocketmq"),
    ),
    "node": ClientEnv(
        "node",
        "rocketmq-client-nodejs 1.0.8 (npm) in conformance/clients/node",
        _node_script("node/scenarios.js"),
        _node_installed("rocketmq-client-nodejs"),
    ),
    "paho": ClientEnv(
        "paho",
        "paho-mqtt 2.2.0 (PyPI, Eclipse Paho Python) in .venv-conformance",
        _python_script("python/paho_scenarios.py"),
        _python_installed("paho", "rocketmq"),
    ),
    "mqttjs": ClientEnv(
        "mqttjs",
        "mqtt 5.16.0 (npm, MQTT.js) in conformance/clients/node",
        _node_script("node/mqttjs_scenarios.js"),
        _node_installed("mqtt"),
    ),
    "mosquitto": ClientEnv(
        "mosquitto",
        "mosquitto_pub / mosquitto_sub (Debian mosquitto-clients), driven from .venv-conformance",
        _python_script("mosquitto/scenarios.py"),
        _mosquitto_installed,
    ),
    # AMQP 0-9-1: pika (blocking connection) and aio-pika (asyncio, on aiormq); see protocols/amqp.py.
    "pika": ClientEnv(
        "pika",
        "pika 1.4.4 (PyPI, BlockingConnection) in .venv-conformance",
        _python_script("python/amqp_scenarios.py"),
        _python_installed("pika", "paho"),
    ),
    "aiopika": ClientEnv(
        "aiopika",
        "aio-pika 10.2.1 (PyPI, on aiormq 7.2.4) in .venv-conformance",
        _python_script("python/amqp_scenarios.py"),
        _python_installed("aio_pika", "paho"),
    ),
    # HTTP / CloudEvents: the CloudEvents Python SDK with httpx (and Paho for cross_protocol).
    "cloudevents": ClientEnv(
        "cloudevents",
        "cloudevents 2.2.0 (PyPI, CloudEvents Python SDK) + httpx 0.28.1 in .venv-conformance",
        _python_script("python/cloudevents_scenarios.py"),
        _python_installed("cloudevents", "httpx", "paho"),
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

    def applies_to(self, client: str) -> bool:
        """The client has a script for this scenario or is listed as unable to run it."""
        return client in self.clients or client in self.unsupported


@dataclass(frozen=True)
class Target:
    host: str = "127.0.0.1"
    grpc_port: int = 8081
    http_port: int = 8082
    mqtt_port: int = 1883
    amqp_port: int = 5672

    @property
    def grpc_endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.grpc_port}"

    @property
    def mqtt_endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.mqtt_port}"

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
        "mqtt": {"host": target.host, "port": target.mqtt_port},
        "http": {"host": target.host, "port": target.http_port},
        "amqp": {"host": target.host, "port": target.amqp_port},
        "client": client,
        "prefix": names.prefix,
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
    pairs = [
        (p, s, c)
        for p in protocols
        for s, spec in reg[p].items()
        if wanted is None or s in wanted
        for c in clients
        if spec.applies_to(c)
    ]
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
    """One table per protocol (rows: scenarios; columns: the given clients that ran in it), then
    the reasons of every FAIL and SKIP."""
    blocks = []
    for proto in dict.fromkeys(r.protocol for r in results):
        blocks.append(_protocol_table([r for r in results if r.protocol == proto], clients))
    notes = [r for r in results if r.status in ("FAIL", "SKIP")]
    if notes:
        lines = []
        for r in notes:
            where = f" [{r.log_dir}]" if r.status == "FAIL" and r.log_dir else ""
            lines.append(f"{r.status} {r.protocol}/{r.scenario}/{r.client}: {r.reason}{where}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _protocol_table(results: list[Result], clients: list[str]) -> str:
    rows: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        rows.setdefault((r.protocol, r.scenario), {})[r.client] = r

    def cell(r: Result | None) -> str:
        if r is None:
            return "-"
        return f"{r.status} {r.elapsed:.1f}s" if r.status != "SKIP" else "SKIP"

    clients = [c for c in clients if any(r.client == c for r in results)]
    header = ["protocol", "scenario", *clients]
    body = [[p, s, *(cell(rows[(p, s)].get(c)) for c in clients)] for (p, s) in rows]
    widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*row).rstrip() for row in body]
    return "\n".join(lines)
