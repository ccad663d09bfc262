"""CLUSTER mode with `auth` on, as real processes (a name server, one store node, two proxies serving
HTTP): one first admin for the cluster, and users, tokens and rules created through one proxy are
enforced by the other (a new user at once: an unknown user makes a proxy re-read the directory;
rules and tokens within its 1 s directory poll, awaited by polling what the client sees)."""

from __future__ import annotations

import httpx
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from tests.cluster.support import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)

ADMIN_PW = "cluster-admin-pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster-auth"))
    try:
        c.start_namesrv()
        c.start_stores("store-a")
        c.start_proxies(2, "http", extra=("--auth",), env={"GATEWAY_ADMIN_PASSWORD": ADMIN_PW})
        yield c
    finally:
        c.close()


def clients(cluster: Cluster, auth=None, headers=None) -> list[httpx.Client]:
    return [
        httpx.Client(base_url=f"http://{listeners['http']}", auth=auth, headers=headers, timeout=10)
        for _, listeners in cluster.proxies
    ]


def test_one_first_admin_for_the_cluster(cluster):
    created = sum(p.output(500).count("created the first admin user") for p, _ in cluster.proxies)
    assert created == 1, cluster.output()
    for c in clients(cluster, auth=("admin", ADMIN_PW)):
        assert c.get("/admin/users").json()[0]["name"] == "admin"
        assert c.get("/admin/users", auth=("admin", "wrong")).status_code == 401
    assert not (cluster.root / "proxy-data").exists()  # the password came from the environment
    assert ADMIN_PW not in cluster.output()


def test_users_rules_and_tokens_made_on_one_proxy_hold_on_the_other(cluster):
    admin1, admin2 = clients(cluster, auth=("admin", ADMIN_PW))
    assert admin1.post("/admin/topics", json={"name": "orders"}).status_code == 201
    r = admin1.post("/admin/users", json={"name": "dev1", "password": "dev1-pw"})
    assert r.status_code == 201, r.text
    _, dev2 = clients(cluster, auth=("dev1", "dev1-pw"))
    # At once: authenticated (no rule yet, so 403, not 401) through the other proxy.
    assert dev2.get("/read/topics/orders/queues").status_code == 403

    rule = admin1.post(
        "/admin/acl", json={"subject": "user:dev1", "pattern": "orders", "actions": ["subscribe"]}
    )
    assert rule.status_code == 201
    wait_for(lambda: dev2.get("/read/topics/orders/queues").status_code == 200, what="allow rule on proxy 2")

    ev = to_binary_event(CloudEvent({"type": "t", "source": "/s", "id": "1"}, {"n": 1}))
    assert dev2.post("/topics/orders/events", headers=ev.headers, content=ev.body).status_code == 403
    pub = {"subject": "user:dev1", "pattern": "orders/#", "actions": ["publish"]}
    assert admin1.post("/admin/acl", json=pub).status_code == 201
    wait_for(
        lambda: dev2.post("/topics/orders/events", headers=ev.headers, content=ev.body).status_code == 202,
        what="publish rule on proxy 2",
    )

    deny = {"subject": "role:user", "pattern": "orders", "actions": ["subscribe"], "effect": "deny"}
    assert admin1.post("/admin/acl", json=deny).status_code == 201
    wait_for(lambda: dev2.get("/read/topics/orders/queues").status_code == 403, what="deny rule on proxy 2")

    tok = admin1.post("/admin/tokens", json={"name": "t", "user": "dev1"}).json()
    bearer = {"Authorization": f"Bearer {tok['token']}"}
    _, tok2 = clients(cluster, headers=bearer)
    wait_for(lambda: tok2.get("/read/topics/orders/queues").status_code == 403, what="token on proxy 2")
    assert admin2.delete(f"/admin/tokens/{tok['id']}").status_code == 204  # revoked through proxy 2
    tok1, _ = clients(cluster, headers=bearer)
    wait_for(lambda: tok1.get("/read/topics/orders/queues").status_code == 401, what="revocation on proxy 1")

    assert admin2.put("/admin/users/dev1/password", json={"password": "dev1-new"}).status_code == 204
    dev1, _ = clients(cluster, auth=("dev1", "dev1-pw"))
    wait_for(lambda: dev1.get("/read/topics/orders/queues").status_code == 401, what="password change")
    for c in clients(cluster, auth=("dev1", "dev1-new")):
        assert wait_for(lambda c=c: c.get("/read/topics/orders/queues").status_code == 403)
