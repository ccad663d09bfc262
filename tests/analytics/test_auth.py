"""The analytics read client with a gateway that has `auth` on: refused without credentials, reads
with a token or a user's password given as options or through GATEWAY_TOKEN / GATEWAY_USER."""

from __future__ import annotations

import pytest

from analytics.client import GatewayError, ReadClient, authorization
from analytics.source import SourceOptions
from tests.analytics.support import GatewayThread


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    data = tmp_path_factory.mktemp("gw") / "data"
    g = GatewayThread(str(data), auth=True).start()
    sec = g.processor.security
    admin_password = (data / "initial-admin-password").read_text().strip()
    g.call(sec.add_user("spark", password="spark-pw"))
    g.call(sec.directory.add_rule("user:spark", "topic", "devices/#", ("subscribe",), False))
    _, token = g.call(sec.directory.create_token("job", "spark"))
    ReadClient(g.url, auth=authorization("admin", admin_password)).ensure_topic("devices")
    yield g, token
    g.stop()


def test_without_credentials_the_read_api_says_401(secured, monkeypatch) -> None:
    g, _ = secured
    for var in ("GATEWAY_TOKEN", "GATEWAY_USER", "GATEWAY_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(GatewayError) as e:
        ReadClient(g.url).queues("devices")
    assert e.value.status == 401


def test_token_and_password_from_options_or_environment(secured, monkeypatch) -> None:
    g, token = secured
    for var in ("GATEWAY_TOKEN", "GATEWAY_USER", "GATEWAY_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    by_token = SourceOptions.parse({"url": g.url, "topic": "devices", "token": token})
    assert len(by_token.client().queues("devices")) == 4
    assert token not in repr(by_token) and token not in repr(by_token.client())
    by_password = SourceOptions.parse(
        {"url": g.url, "topic": "devices", "user": "spark", "password": "spark-pw"}
    )
    assert len(by_password.client().queues("devices")) == 4
    monkeypatch.setenv("GATEWAY_TOKEN", token)
    assert len(ReadClient(g.url).queues("devices")) == 4
    monkeypatch.delenv("GATEWAY_TOKEN")
    monkeypatch.setenv("GATEWAY_USER", "spark")
    monkeypatch.setenv("GATEWAY_PASSWORD", "wrong")
    with pytest.raises(GatewayError) as e:
        SourceOptions.parse({"url": g.url, "topic": "devices"}).client().queues("devices")
    assert e.value.status == 401
