"""The ingest route: a raw ASGI endpoint that the CloudEvents service puts first in the gateway's
routing table, and that also works (and is documented) from the routers alone, in an app built
without `CloudEvents.serve` (ASGI in process, no socket)."""

from __future__ import annotations

import httpx
import pytest

from adapters.cloudevents import CloudEvents
from adapters.cloudevents.ingest import IngestEndpoint
from gateway.http import create_app
from messaging_processor import Limits, LocalStoreClient, MessagingProcessor
from store import Store, StoreConfig

BIN = {"ce-specversion": "1.0", "ce-id": "r-1", "ce-source": "/src", "ce-type": "io.example.t"}


@pytest.fixture
async def service(tmp_path):
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data"), flush="async"))
    p = MessagingProcessor(LocalStoreClient(store), limits=Limits())
    await p.start()
    await p.create_topic("t")
    yield CloudEvents(p)
    await p.close()
    await store.close()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_routers_alone_serve_and_document_ingest(service):
    app = create_app(service.processor, service.routers())
    assert not isinstance(getattr(app.router.routes[0], "app", None), IngestEndpoint)
    async with _client(app) as c:
        r = await c.post("/topics/t/events", headers={**BIN, "content-type": "text/plain"}, content=b"hi")
        assert r.status_code == 202 and r.content == b""
        r = await c.post("/topics/nope/events", headers=BIN, content=b"")
        assert r.status_code == 404 and r.json()["kind"] == "topic_not_found"  # the app's handler
        r = await c.post("/topics/t/events", headers={**BIN, "ce-id": ""}, content=b"")
        assert r.status_code == 400 and r.json()["errors"][0]["attribute"] == "id"
        assert (await c.get("/topics/t/events")).status_code == 405
        spec = (await c.get("/openapi.json")).json()
    post = spec["paths"]["/topics/{topic}/events"]["post"]
    assert set(post["requestBody"]["content"]) >= {"application/cloudevents+json", "*/*"}
    assert "202" in post["responses"]


async def test_served_app_matches_ingest_first(service):
    class Listener:  # what CloudEvents.serve needs of the HTTP listener: its app
        name = "http"
        address = "-"
        listening = True

        def __init__(self, app) -> None:
            self.app = app

    app = create_app(service.processor, service.routers())
    service.serve(Listener(app))
    first = app.router.routes[0]
    assert first.path == "/topics/{topic}/events" and first.methods == {"POST"}
    assert first.app is service.ingest
    async with _client(app) as c:
        r = await c.post("/topics/t/events", headers=BIN, content=b"")
        assert r.status_code == 202
        r = await c.options("/topics/t/events", headers={"webhook-request-origin": "x.example"})
        assert r.status_code == 200 and r.headers["webhook-allowed-origin"] == "x.example"
        r = await c.put("/topics/t/events")
        assert r.status_code == 405 and r.headers["allow"] == "POST, OPTIONS"
        assert (await c.get("/healthz")).status_code in (200, 503)
    assert (await service.processor.get_topic("t")).messages == 1
