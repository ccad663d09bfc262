"""The console and its endpoints with `--auth` on: `/metrics/per-object` needs credentials from
loopback too (docs/observability.md), and the Users page shows each user's role (Chromium)."""

from __future__ import annotations

import httpx
import pytest

from tests.console.support import Console, Shots, needs_chromium
from tests.support import running_gateway

pytestmark = [pytest.mark.timeout(90)]

ADMIN_PW = "admin-pw-Zq8"


@pytest.fixture
async def secured(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_ADMIN_PASSWORD", ADMIN_PW)
    async with running_gateway(str(tmp_path / "data"), ("http",), auth=True) as g:
        (http,) = g.adapters
        base = f"http://{http.address}"
        async with httpx.AsyncClient(base_url=base, auth=("admin", ADMIN_PW)) as admin:
            r = await admin.post(
                "/admin/users", json={"name": "ops", "password": "ops-pw-Zq8", "role": "user"}
            )
            assert r.status_code == 201, r.text
        yield base


async def test_per_object_metrics_need_credentials_on_loopback_too(secured):
    """Anonymous and wrong-password requests from 127.0.0.1 get 401 with the Basic challenge;
    any user's credentials (not only the admin's) get the series."""
    async with httpx.AsyncClient(base_url=secured) as c:
        r = await c.get("/metrics/per-object")
        assert r.status_code == 401, r.text
        assert 'Basic realm="gateway"' in r.headers.get_list("www-authenticate")
        r = await c.get("/metrics/per-object", auth=("admin", "wrong-password"))
        assert r.status_code == 401
        r = await c.get("/metrics/per-object", auth=("nobody", "x"))
        assert r.status_code == 401
        for who in (("admin", ADMIN_PW), ("ops", "ops-pw-Zq8")):
            r = await c.get("/metrics/per-object", auth=who)
            assert r.status_code == 200, (who, r.text)
            assert r.headers["content-type"].startswith("text/plain")
        r = await c.get("/metrics")  # unchanged: open to loopback clients (docs/security.md)
        assert r.status_code == 200


@needs_chromium
async def test_users_page_shows_each_users_role(secured, browser, tmp_path):
    ctx = await browser.new_context(http_credentials={"username": "admin", "password": ADMIN_PW})
    try:
        c = Console(await ctx.new_page(), secured, Shots(tmp_path))
        await c.open("users", "users-roles")
        roles = {r[0]: r[1] for r in await c.rows("users")}
        assert roles == {"admin": "admin", "ops": "user"}
        # no console page reads /metrics/per-object; the logged-in browser's credentials reach it
        status = await c.page.evaluate("fetch('/metrics/per-object').then((r) => r.status)")
        assert status == 200
        assert c.errors == []
    finally:
        await ctx.close()
