"""A failover keeps what is not a message, as real processes: a real etcd, a name server, a
two-node replica group (sync, min-insync 1) and a proxy with `--auth`. Before `kill -9` of the
primary: an admin creates a user, an MQTT client with a persistent session receives and acknowledges
30 messages, then goes offline while 10 more are published. After the failover: the user still logs
in (and a wrong password is still refused), the session is still there, and it gets exactly the 10
it had not received: key-value data and consumer progress were on the replica."""

from __future__ import annotations

import asyncio
import base64
import json
import signal

import aiomqtt
import httpx
import pytest
from aiomqtt.exceptions import MqttConnectError

from cluster.nodes import NodeClient
from conformance.gateway_proc import GatewayProc as Proc
from tests.cluster.etcd_support import EtcdProcess, etcd_missing
from tests.cluster.support import LEASE, Cluster, _ready
from tests.cluster.test_replica_group import FAILOVER_BOUND_S, group_state, until

pytestmark = [
    pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)"),
    pytest.mark.timeout(150),
]
ADMIN_PW = "group-admin-pw"
NODES = ("a", "b")


def start_member(c: Cluster, name: str, etcd: str) -> str:
    args = ["store", "--data-dir", str(c.root / name), "--port", "0", "--name", name, "--namesrv", c.namesrv]
    args += [*LEASE, "--flush", "sync", "--group", "g1", "--controller", etcd, "--min-insync", "1"]
    p = Proc(args, name)
    c.procs.append(p)
    addr = _ready(p)["store"]
    c.stores[name] = (p, addr)
    return addr


def mqtt(listeners: dict[str, str], user: str, password: str, **kw) -> aiomqtt.Client:
    host, port = listeners["mqtt"].rsplit(":", 1)
    return aiomqtt.Client(host, int(port), username=user, password=password, timeout=10, **kw)


async def replica_backlog(name: str, addr: str, client_id: str) -> int | None:
    """The backlog on topic `fleet` of `client_id`'s session group, as the replica `name` at `addr`
    has it."""
    node = NodeClient(name, addr, 0, lambda *_: None)  # named as it answers HELLO
    await node.connect(5)
    try:
        raw = await node.value("kv_get", {"ns": "mqtt.sessions", "key": client_id})
        if raw is None:
            return None
        group = json.loads(base64.b64decode(raw))["g"]
        return await node.value("backlog", {"group": group, "topic": "fleet"})
    finally:
        await node.close()


async def test_users_sessions_and_consumer_progress_survive_a_failover(tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    c = Cluster(tmp_path)
    try:
        c.start_namesrv()
        for name in NODES:
            start_member(c, name, etcd.endpoint)
        env = {"GATEWAY_ADMIN_PASSWORD": ADMIN_PW}
        (listeners,) = c.start_proxies(1, "mqtt,http", extra=("--auth",), env=env)

        async def both_in_sync():
            s = await group_state(etcd.endpoint)
            return s if s is not None and s.primary and set(s.sync_state_set) == set(NODES) else None

        state = await until(both_in_sync, 20, "both nodes in the SyncStateSet")
        replica = (set(NODES) - {state.primary}).pop()
        async with httpx.AsyncClient(base_url=f"http://{listeners['http']}", timeout=10) as http:
            r = await http.post(
                "/admin/users", json={"name": "dev1", "password": "dev1-pw"}, auth=("admin", ADMIN_PW)
            )
            assert r.status_code == 201, r.text
        # a persistent session receives (and PUBACKs) 30 messages, then goes offline; 10 more wait
        sub_opts = {"identifier": "sub-1", "clean_session": False}
        async with mqtt(listeners, "admin", ADMIN_PW, **sub_opts) as sub:
            await sub.subscribe("fleet/#", qos=1)
            async with mqtt(listeners, "admin", ADMIN_PW, identifier="pub-1") as pub:
                for i in range(30):
                    await pub.publish(f"fleet/d/{i}", f"first-{i}".encode(), qos=1)
                got = []
                async with asyncio.timeout(20):
                    async for m in sub.messages:
                        got.append(m.payload)
                        if len(got) == 30:
                            break
            assert sorted(got) == sorted(f"first-{i}".encode() for i in range(30))
        async with mqtt(listeners, "admin", ADMIN_PW, identifier="pub-2") as pub:
            for i in range(10):
                await pub.publish(f"fleet/d/{i}", f"later-{i}".encode(), qos=1)
        # the replica holds the session and the progress (acknowledged deliveries: async, ~100 ms)
        replica_addr = c.stores[replica][1]
        backlog = lambda: replica_backlog(replica, replica_addr, "sub-1")  # noqa: E731
        await until(lambda: _equals(backlog(), 10), 10, "progress on the replica")

        c.stores[state.primary][0].p.send_signal(signal.SIGKILL)
        c.stores[state.primary][0].p.wait(10)

        async def failed_over():
            s = await group_state(etcd.endpoint)
            return s if s is not None and s.primary == replica else None

        await until(failed_over, FAILOVER_BOUND_S, "the replica elected")

        async def logs_in() -> bool:
            try:
                async with mqtt(listeners, "dev1", "dev1-pw", identifier="dev-1"):
                    return True
            except aiomqtt.MqttError:
                return False

        await until(logs_in, 20, "dev1 logging in after the failover")
        with pytest.raises(aiomqtt.MqttError):
            async with mqtt(listeners, "dev1", "wrong", identifier="dev-1"):
                pass
        later: list[bytes] = []

        async def resumes() -> bool:
            """The session's reconnect: a resume writes its record, which the new primary may
            refuse until the dead node has left its SyncStateSet (CONNACK 0x88 Server unavailable,
            which a device retries, as here); a CONNACK it accepts must bring the waiting messages."""
            try:
                async with mqtt(listeners, "admin", ADMIN_PW, **sub_opts) as sub:
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(3):  # every message that was waiting, and nothing else
                            async for m in sub.messages:
                                later.append(m.payload)
                return True
            except MqttConnectError as e:
                if e.rc != 136:
                    raise
                return False

        try:
            # (45 s: one clean-clone run saw more than 20 s of 0x88 here, not seen again in 11 runs
            # on this machine; on failure the proxy's output says why, issue 51's note)
            await until(resumes, 45, "the persistent session resumed after the failover")
        except AssertionError as e:  # (what the proxy said meanwhile, for the reader of the failure)
            raise AssertionError(f"{e}\nproxy output:\n{c.proxies[0][0].output(80)}") from None
        assert sorted(later) == sorted(f"later-{i}".encode() for i in range(10)), later
    finally:
        c.close()
        etcd.stop()


async def _equals(value, expected) -> bool:
    try:
        return await value == expected
    except Exception:  # noqa: BLE001 - not there yet
        return False
