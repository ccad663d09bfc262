"""docker-compose.yml and Dockerfile, checked structurally (no Docker daemon or network needed):
the topology (etcd, name server, two replica groups of two stores, two proxies), the image built
from the project's own Dockerfile with the lock file, and every service's command parsed by the
real CLI parser into valid settings that point at each other. `docker compose config` runs too
where it exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.cli import build_parser, settings_from_args
from gateway.config import check_exposure
from namesrv.cli import _FLAGS as NAMESRV_FLAGS
from namesrv.config import load as load_namesrv

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
STORES = ("store-1a", "store-1b", "store-2a", "store-2b")
SECRET = "/run/secrets/cluster_secret"


def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def env_of(svc: dict) -> dict[str, str]:
    """The service's environment with compose's `${VAR:-default}` resolved to the default."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}


def parsed(svc: dict):
    cmd = svc["command"]
    assert isinstance(cmd, list), "commands are exec-form lists"
    return build_parser().parse_args([str(c) for c in cmd])


def test_topology_and_image():
    svcs = services()
    assert set(svcs) == {"etcd", "namesrv", *STORES, "proxy-1", "proxy-2"}
    assert svcs["etcd"]["image"].startswith("quay.io/coreos/etcd:v3.4")  # Debian's etcd-server is 3.4
    svcs = {n: s for n, s in svcs.items() if n != "etcd"}
    for name, svc in svcs.items():
        assert svc["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        assert (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    roles = {name: parsed(svc).command for name, svc in svcs.items()}
    assert roles == {
        "namesrv": "namesrv",
        **dict.fromkeys(STORES, "store"),
        "proxy-1": "start",
        "proxy-2": "start",
    }
    text = DOCKERFILE.read_text()
    assert re.search(r"^ENTRYPOINT \[\"gateway\"\]$", text, re.M)
    assert "uv sync --locked" in text  # installs from uv.lock, as `make install` does
    for src in re.findall(r"^COPY (\S+)/ ", text, re.M):
        assert (REPO / src).is_dir(), src
    for pkg in re.findall(
        r'"(\w+)"', (REPO / "pyproject.toml").read_text().split("packages = [", 1)[1].split("]")[0]
    ):
        assert f"COPY {pkg}/ {pkg}/" in text, f"the image lacks package {pkg}"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "data" in ignored


def test_commands_parse_into_settings_that_point_at_each_other():
    svcs = services()
    ns_args = parsed(svcs["namesrv"])
    ns = load_namesrv({f: getattr(ns_args, f) for f in NAMESRV_FLAGS}, {})
    assert ns.host == "0.0.0.0" and ns.cluster_secret_file == SECRET
    ns_addr = f"namesrv:{ns.port}"
    stores = {}
    for name in STORES:
        svc = svcs[name]
        s = settings_from_args(parsed(svc), env_of(svc))
        assert s.namesrv == ns_addr and s.host == "0.0.0.0" and s.cluster_secret_file == SECRET
        assert s.store_name == name and s.advertise_host == name  # reachable by service name
        (volume,) = svc["volumes"]
        assert volume.endswith(":" + s.data_dir)
        stores[name] = (s, volume.split(":")[0])
        assert {"namesrv", "etcd"} <= set(svc["depends_on"])
        assert s.controller == "http://etcd:2379" and (s.replication, s.min_insync) == ("sync", 2)
        assert s.store_group == "g" + name[len("store-")]  # store-1a, store-1b: group g1
    assert len({v for _, v in stores.values()}) == 4  # each store has its own volume
    groups = [s.store_group for s, _ in stores.values()]
    assert sorted(groups) == ["g1", "g1", "g2", "g2"]  # two groups of two
    assert len({s.cluster_name for s, _ in stores.values()}) == 1
    cluster = next(iter(stores.values()))[0].cluster_name
    host_ports = []
    for name in ("proxy-1", "proxy-2"):
        svc = svcs[name]
        s = settings_from_args(parsed(svc), env_of(svc))
        assert (s.mode, s.namesrv, s.cluster_name, s.host) == ("cluster", ns_addr, cluster, "0.0.0.0")
        assert s.proxy_name == name and s.advertise_host == "127.0.0.1"
        assert s.cluster_secret_file == SECRET
        check_exposure(s)  # every interface: the proxies run with --auth, so they start
        assert s.auth and "GATEWAY_ADMIN_PASSWORD" in svc["environment"]
        assert set(svc["depends_on"]) == set(STORES)
        published = {}
        for p in svc["ports"]:
            host, container = p.split(":")
            published[int(container)] = int(host)
        # Every listener is published on the same port number (what the proxy advertises).
        for proto in s.protocols:
            port = s.port(proto)
            assert published.get(port) == port, (name, proto, port)
        host_ports += list(published.values())
        assert str(s.http_port) in " ".join(svc["healthcheck"]["test"])
    assert len(host_ports) == len(set(host_ports))  # the two proxies do not collide


def test_every_gateway_service_gets_the_cluster_secret():
    top = yaml.safe_load(COMPOSE.read_text())["secrets"]
    assert top == {"cluster_secret": {"file": "./cluster.secret"}}
    for name, svc in services().items():
        if name == "etcd":
            continue
        (mount,) = svc["secrets"]
        assert mount["source"] == "cluster_secret" and SECRET.endswith("/" + mount["target"]), name
        assert mount["uid"] == "10001" and mount["mode"] == 0o400, name  # the image's user, owner-only


def test_the_image_starts_with_authentication():
    cmd = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD"))
    s = settings_from_args(build_parser().parse_args(json.loads(cmd[3:])), {})
    assert s.host == "0.0.0.0" and s.auth
    check_exposure(s)


def test_a_bad_flag_in_a_command_would_be_caught(capsys):
    svc = dict(services()["store-1a"])
    svc["command"] = [*svc["command"], "--no-such-flag"]
    with pytest.raises(SystemExit):
        parsed(svc)


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    r = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return r.returncode == 0


@pytest.mark.skipif(not _compose_available(), reason="docker compose is not installed")
def test_docker_compose_config_accepts_the_file():
    r = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
