"""`gateway start` with authentication, as real processes: the secure-by-default start refusal and
its override, the first-admin bootstrap (file or GATEWAY_ADMIN_PASSWORD, never logged), and the
`gateway user|token|acl` commands end to end against the running gateway."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import httpx

from conformance.gateway_proc import GATEWAY
from tests.gateway.support import start

ADMIN_PW = "Adm1n-pw-for-tests"


def cli(
    *args: str, url: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`gateway ARGS` with only the given GATEWAY_* variables (and GATEWAY_URL)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    full.update(env or {})
    full["GATEWAY_URL"] = url
    return subprocess.run(
        GATEWAY + list(args), input=stdin, capture_output=True, text=True, env=full, timeout=60
    )


def run_start(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    full.update(env or {})
    argv = [
        *GATEWAY,
        "start",
        "--data-dir",
        str(tmp_path / "data"),
        "--protocols",
        "http",
        "--http-port",
        "0",
    ]
    return subprocess.run([*argv, *args], capture_output=True, text=True, env=full, timeout=60)


def test_non_loopback_host_without_auth_is_refused(tmp_path):
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        r = run_start(tmp_path, "--host", host)
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert (
            "refusing to start" in line and host in line and "--auth" in line and "--allow-anonymous" in line
        )
    r = run_start(tmp_path, env={"GATEWAY_HOST": "0.0.0.0", "GATEWAY_AUTH": "false"})
    assert r.returncode == 2 and "refusing to start" in r.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def test_allow_anonymous_and_auth_start_on_a_non_loopback_host(tmp_path):
    proc, listeners = start(tmp_path / "a", "--host", "0.0.0.0", "--allow-anonymous", protocols="http")
    assert listeners["http"].startswith("0.0.0.0:")
    port = listeners["http"].rsplit(":", 1)[1]
    assert httpx.get(f"http://127.0.0.1:{port}/admin/topics", timeout=5).status_code == 200  # anonymous
    assert proc.stop() == 0
    env = {"GATEWAY_ALLOW_ANONYMOUS": "1"}
    proc, listeners = start(tmp_path / "b", "--host", "0.0.0.0", env=env, protocols="http")
    assert proc.stop() == 0
    env = {"GATEWAY_ADMIN_PASSWORD": ADMIN_PW}
    proc, listeners = start(tmp_path / "c", "--host", "0.0.0.0", "--auth", env=env, protocols="http")
    port = listeners["http"].rsplit(":", 1)[1]
    assert httpx.get(f"http://127.0.0.1:{port}/admin/topics", timeout=5).status_code == 401
    assert proc.stop() == 0


def test_loopback_anonymous_keeps_working(tmp_path):
    proc, listeners = start(tmp_path, protocols="http")  # default host 127.0.0.1, auth off
    url = f"http://{listeners['http']}"
    r = cli("topic", "create", "orders", url=url)
    assert r.returncode == 0, r.stderr
    r = cli("user", "list", url=url)
    assert r.returncode == 1 and "authentication is off" in r.stderr
    assert proc.stop() == 0


def test_first_admin_password_file(tmp_path):
    proc, listeners = start(tmp_path, "--auth", protocols="http")
    url = f"http://{listeners['http']}"
    pw_file = tmp_path / "data" / "initial-admin-password"
    assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
    password = pw_file.read_text().strip()
    assert len(password) >= 20
    assert httpx.get(url + "/admin/users", auth=("admin", password), timeout=5).status_code == 200
    assert httpx.get(url + "/admin/users", auth=("admin", "x" + password), timeout=5).status_code == 401
    r = cli("user", "list", "--json", url=url, env={"GATEWAY_USER": "admin", "GATEWAY_PASSWORD": password})
    assert r.returncode == 0, r.stderr
    assert [(u["name"], u["role"]) for u in json.loads(r.stdout)] == [("admin", "admin")]
    assert proc.stop() == 0
    out = proc.drain()
    assert str(pw_file) in out and password not in out
    # A restart finds the admin: the file is neither rewritten nor needed.
    proc, listeners = start(tmp_path, "--auth", protocols="http")
    assert pw_file.read_text().strip() == password
    assert proc.stop() == 0
    assert "created the first admin" not in proc.drain()


def test_first_admin_from_env(tmp_path):
    proc, listeners = start(tmp_path, "--auth", env={"GATEWAY_ADMIN_PASSWORD": ADMIN_PW}, protocols="http")
    url = f"http://{listeners['http']}"
    assert not (tmp_path / "data" / "initial-admin-password").exists()
    assert httpx.get(url + "/admin/users", auth=("admin", ADMIN_PW), timeout=5).status_code == 200
    assert proc.stop() == 0
    out = proc.drain()
    assert "GATEWAY_ADMIN_PASSWORD" in out and ADMIN_PW not in out


def test_user_token_acl_commands_end_to_end(tmp_path):
    proc, listeners = start(tmp_path, "--auth", env={"GATEWAY_ADMIN_PASSWORD": ADMIN_PW}, protocols="http")
    url = f"http://{listeners['http']}"
    admin = {"GATEWAY_USER": "admin", "GATEWAY_PASSWORD": ADMIN_PW}

    # no or wrong credentials: exit 1 with the gateway's one-line refusal
    r = cli("topic", "list", url=url)
    assert r.returncode == 1 and "401" in r.stderr
    r = cli("topic", "list", "--user", "admin", "--password-stdin", url=url, stdin="nope\n")
    assert r.returncode == 1 and "401" in r.stderr and "nope" not in r.stderr
    r = cli(
        "topic", "create", "devices", "--user", "admin", "--password-stdin", url=url, stdin=ADMIN_PW + "\n"
    )
    assert r.returncode == 0, r.stderr

    # users: password and secret key as two lines of stdin, after the admin's password
    r = cli(
        "--user", "admin", "--password-stdin", "user", "add", "dev42", "--password-stdin",
        "--access-key", "AK42", "--secret-key-stdin",
        url=url, stdin=f"{ADMIN_PW}\ndev42-pw\nSK42-secret\n",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "dev42-pw" not in r.stdout + r.stderr and "SK42-secret" not in r.stdout + r.stderr
    r = cli("user", "add", "ana", "--password-stdin", url=url, stdin="ana-pw\n", env=admin)
    assert r.returncode == 0, r.stderr
    r = cli("user", "list", "--json", url=url, env=admin)
    users = {u["name"]: u for u in json.loads(r.stdout)}
    assert set(users) == {"admin", "ana", "dev42"} and users["dev42"]["access_key"] == "AK42"
    assert "SK42" not in r.stdout
    r = cli("user", "list", url=url, env=admin)
    assert r.stdout.splitlines()[0].split() == ["NAME", "ROLE", "PASSWORD", "ACCESS_KEY", "VHOSTS"]
    r = cli("user", "passwd", "ana", "--password-stdin", url=url, stdin="ana-pw2\n", env=admin)
    assert r.returncode == 0, r.stderr
    assert (
        httpx.get(url + "/read/topics/devices/queues", auth=("ana", "ana-pw"), timeout=5).status_code == 401
    )

    # ACL rules: dev42 may publish its own telemetry; ana may read everything but dev42's
    r = cli(
        "acl", "add", "--role", "user", "--topic", "devices/%u/#", "--actions", "publish", url=url, env=admin
    )
    assert r.returncode == 0, r.stderr
    r = cli(
        "acl", "add", "--user", "ana", "--topic", "devices/#", "--actions", "subscribe", url=url, env=admin
    )
    assert r.returncode == 0, r.stderr
    r = cli(
        "acl", "add", "--anyone", "--group", "g-%u", "--actions", "subscribe,publish", "--deny",
        "--json", url=url, env=admin,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    deny = json.loads(r.stdout)
    assert (deny["subject"], deny["kind"], deny["effect"]) == ("anyone", "group", "deny")
    r = cli("acl", "add", "--anyone", "--topic", "a/#/b", "--actions", "publish", url=url, env=admin)
    assert r.returncode == 1 and "400" in r.stderr
    r = cli("acl", "list", "--json", url=url, env=admin)
    rules = json.loads(r.stdout)
    assert len(rules) == 3
    assert (
        httpx.get(url + "/read/topics/devices/queues", auth=("ana", "ana-pw2"), timeout=5).status_code == 200
    )
    assert (
        httpx.get(url + "/read/topics/devices/queues", auth=("dev42", "dev42-pw"), timeout=5).status_code
        == 403
    )

    # tokens: printed once on stdout, listed without their text, revoked
    r = cli("token", "create", "ci", "--user", "ana", url=url, env=admin)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("gwt_") and "shown only now" in r.stderr
    r = cli("token", "list", "--json", url=url, env={"GATEWAY_TOKEN": token})
    assert r.returncode == 1 and "403" in r.stderr  # ana is no admin
    assert (
        httpx.get(
            url + "/read/topics/devices/queues", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 200
    )
    r = cli("token", "create", "ops", url=url, env=admin)  # the caller's own token
    admin_token = r.stdout.strip()
    r = cli("token", "list", "--json", url=url, env={"GATEWAY_TOKEN": admin_token})
    assert r.returncode == 0, r.stderr
    tokens = {t["name"]: t for t in json.loads(r.stdout)}
    assert tokens["ops"]["user"] == "admin" and tokens["ci"]["user"] == "ana" and token not in r.stdout
    r = cli("token", "revoke", tokens["ci"]["id"], url=url, env={"GATEWAY_TOKEN": admin_token})
    assert r.returncode == 0, r.stderr
    assert (
        httpx.get(
            url + "/read/topics/devices/queues", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 401
    )

    # export, change, import: back to the exported policy
    r = cli("acl", "export", url=url, env=admin)
    assert r.returncode == 0, r.stderr
    exported = r.stdout
    assert (
        "[[users]]" in exported
        and "[[rules]]" in exported
        and "SK42" not in exported
        and "argon2" not in exported
    )
    policy = tmp_path / "policy.toml"
    policy.write_text(exported)
    r = cli("acl", "delete", deny["id"], url=url, env=admin)
    assert r.returncode == 0, r.stderr
    r = cli("acl", "add", "--user", "dev42", "--topic", "#", "--actions", "admin", url=url, env=admin)
    assert r.returncode == 0, r.stderr
    r = cli("acl", "import", str(policy), url=url, env=admin)
    assert r.returncode == 0, r.stderr
    assert "imported 3 user(s) and 3 rule(s); removed 1 rule(s)" in r.stdout
    r = cli("acl", "list", "--json", url=url, env=admin)
    assert sorted(json.loads(r.stdout), key=lambda x: x["id"]) == sorted(rules, key=lambda x: x["id"])
    assert cli("acl", "export", url=url, env=admin).stdout == exported

    r = cli("user", "delete", "dev42", url=url, env=admin)
    assert r.returncode == 0, r.stderr
    assert (
        httpx.get(url + "/read/topics/devices/queues", auth=("dev42", "dev42-pw"), timeout=5).status_code
        == 401
    )
    assert proc.stop() == 0
    out = proc.drain()
    for secret in (ADMIN_PW, "dev42-pw", "SK42-secret", "ana-pw", token, admin_token):
        assert secret not in out
