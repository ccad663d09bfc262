"""HTTP / CloudEvents conformance scenarios driven by the CloudEvents Python SDK (`cloudevents` 2.2.0:
HTTP binding and JSON format) with httpx 0.28 as the HTTP client, and Eclipse Paho for the
cross-protocol half. Runs in ``.venv-conformance``; imports nothing from the project.

    .venv-conformance/bin/python conformance/clients/python/cloudevents_scenarios.py SCENARIO CONFIG_JSON

CONFIG_JSON: ``{"http": {"host", "port"}, "mqtt": {"host", "port"}, "prefix", "topics", "groups",
"timeout", "params"}``; prints one line ``{"client", "scenario", "ok", "reason", "details"}``, exit
0 = pass. Scenarios: see conformance/protocols/cloudevents.py and docs/conformance.md.

The SDK writes the events of `sdk_roundtrip` and `push_webhook` (binary and structured mode; a batch is
a JSON array of SDK-written events, as SDK 2.2 has no batch writer) and reads every event the gateway
hands out (pull answers, webhook deliveries). The test vectors (conformance/vectors/) are sent as
they are, so that invalid events reach the gateway unchanged (the SDK would refuse or repair them).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from cloudevents.core.bindings.http import (
    HTTPMessage,
    from_http_event,
    from_structured_event,
    to_binary_event,
    to_structured_event,
)
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

CLIENT = "cloudevents"
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
PROBLEM = "application/problem+json"
HANDLE = "receipthandle"
FORMAT = JSONFormat()


class Fail(Exception):
    """The scenario's expectation was not met."""


def check(cond: object, reason: str) -> None:
    if not cond:
        raise Fail(reason)


class Ctx:
    def __init__(self, config: dict, scenario: str) -> None:
        self.config = config
        self.scenario = scenario
        self.params = config.get("params", {})
        self.topics = config.get("topics", {})
        self.groups = config.get("groups", {})
        http = config["http"]
        host = f"[{http['host']}]" if ":" in http["host"] else http["host"]
        self.base = f"http://{host}:{http['port']}"
        self.http = httpx.Client(base_url=self.base, timeout=10.0)
        self.started = time.monotonic()
        self.deadline = self.started + float(config.get("timeout", 60)) - 5
        self.details: dict = {}
        self._cleanup: list[Callable[[], None]] = []

    def left(self, cap: float) -> float:
        return max(0.1, min(cap, self.deadline - time.monotonic()))

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        self._cleanup.append(fn)

    def cleanup(self) -> None:
        for fn in reversed(self._cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001 - cleanup must not mask the result
                traceback.print_exc(file=sys.stderr)
        self.http.close()

    # -- gateway calls
    def events_url(self, topic: str) -> str:
        return f"/topics/{topic}/events"

    def post(self, topic: str, headers: dict | list, content: bytes | str) -> httpx.Response:
        return self.http.post(self.events_url(topic), headers=headers, content=content)

    def pop(
        self, topic: str, group: str, *, max_events: int = 64, wait_ms: int = 0, invisible_ms: int = 30000
    ) -> list[dict]:
        r = self.http.post(
            f"/topics/{topic}/subscriptions/{group}/pop",
            json={"max_events": max_events, "wait_ms": wait_ms, "invisible_time_ms": invisible_ms},
            headers={"accept": BATCH},
            timeout=wait_ms / 1000 + 10,
        )
        check(r.status_code == 200, f"pop answered {r.status_code}: {r.text[:200]}")
        check(
            r.headers.get("content-type", "").startswith(BATCH),
            f"pop content type {r.headers.get('content-type')}",
        )
        out = r.json()
        check(isinstance(out, list), "pop did not answer a JSON array")
        return out

    def ack(self, topic: str, group: str, handles: list[str]) -> dict:
        r = self.http.post(f"/topics/{topic}/subscriptions/{group}/ack", json={"receipt_handles": handles})
        check(r.status_code == 200, f"ack answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def drain(self, topic: str, group: str, n: int, cap: float = 15.0) -> list[dict]:
        """Pop (and ack) until `n` events arrived; then make sure no more come."""
        got: list[dict] = []
        end = time.monotonic() + self.left(cap)
        while len(got) < n and time.monotonic() < end:
            batch = self.pop(topic, group, max_events=min(256, n - len(got)), wait_ms=1000)
            if batch:
                res = self.ack(topic, group, [e[HANDLE] for e in batch])
                check(res["acked"] == len(batch) and not res["failed"], f"ack failed: {res}")
                got.extend(batch)
        check(len(got) == n, f"expected {n} events, pulled {len(got)}")
        extra = self.pop(topic, group, wait_ms=300)
        check(not extra, f"{len(extra)} unexpected event(s): {[e.get('id') for e in extra]}")
        return got


def strip_handle(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != HANDLE}


def no_nulls(e: dict) -> dict:
    return {k: v for k, v in e.items() if v is not None}


def canon(e: dict) -> str:
    return json.dumps(e, sort_keys=True, ensure_ascii=False)


def same_multiset(got: list[dict], want: list[dict], what: str) -> None:
    g = sorted(canon(strip_handle(e)) for e in got)
    w = sorted(canon(e) for e in want)
    if g != w:
        missing = [x for x in w if x not in g]
        extra = [x for x in g if x not in w]
        raise Fail(f"{what}: missing {missing[:3]} unexpected {extra[:3]}")


def sdk_read(e: dict) -> CloudEvent:
    """The SDK's reading of one JSON-format event the gateway produced."""
    try:
        return FORMAT.read(None, json.dumps(e))
    except Exception as ex:
        raise Fail(f"the SDK cannot read {e.get('id')!r}: {type(ex).__name__}: {ex}") from ex


def problem_of(r: httpx.Response, status: int, what: str) -> dict:
    check(r.status_code == status, f"{what}: status {r.status_code} (want {status}): {r.text[:200]}")
    check(
        r.headers.get("content-type", "").startswith(PROBLEM),
        f"{what}: content type {r.headers.get('content-type')}",
    )
    body = r.json()
    check(body.get("status") == status and body.get("kind"), f"{what}: problem body {body}")
    return body


def vectors(ctx: Ctx, name: str) -> dict:
    return json.loads(Path(ctx.params["vectors_dir"], name).read_text())


# --------------------------------------------------------------------------- scenarios


def sc_json_format_vectors(ctx: Ctx) -> None:
    topic, group = ctx.topics["main"], ctx.groups["main"]
    v = vectors(ctx, "cloudevents-json.json")
    expected: list[dict] = []
    for t in v["validEvents"]:
        r = ctx.post(topic, {"content-type": STRUCTURED}, json.dumps(t["event"]))
        check(r.status_code == 202, f"valid event {t['id']}: {r.status_code} {r.text[:300]}")
        expected.append(no_nulls(t["event"]))
    for t in v["validBatches"]:
        r = ctx.post(topic, {"content-type": BATCH}, json.dumps(t["batch"]))
        check(r.status_code == 202, f"valid batch {t['id']}: {r.status_code} {r.text[:300]}")
        expected.extend(no_nulls(e) for e in t["batch"])
    for t in v["invalidEvents"]:
        body = problem_of(ctx.post(topic, {"content-type": STRUCTURED}, json.dumps(t["event"])), 400, t["id"])
        named = [p.get("attribute") for p in body.get("errors", [])]
        check(
            t["attribute"] in named, f"invalid event {t['id']}: errors name {named}, not {t['attribute']!r}"
        )
        body = problem_of(
            ctx.post(topic, {"content-type": BATCH}, json.dumps([t["event"]])), 400, t["id"] + " in a batch"
        )
        check(
            any(p.get("index") == 0 for p in body.get("errors", [])),
            f"{t['id']} in a batch: no index 0 in {body}",
        )
    for t in v["invalidBatches"]:
        body = problem_of(ctx.post(topic, {"content-type": BATCH}, json.dumps(t["batch"])), 400, t["id"])
        idx = [p.get("index") for p in body.get("errors", [])]
        check(t["index"] in idx, f"invalid batch {t['id']}: errors at {idx}, not at {t['index']}")
    for t in v["invalidBodies"]:
        problem_of(ctx.post(topic, {"content-type": t["contentType"]}, t["body"]), t["status"], t["id"])
    got = ctx.drain(topic, group, len(expected))  # also proves nothing of the refused ones was stored
    same_multiset(got, expected, "events pulled back")
    for e in got:
        sdk_read(strip_handle(e))
    ctx.details.update(
        valid_events=len(v["validEvents"]),
        valid_batches=len(v["validBatches"]),
        invalid_events=len(v["invalidEvents"]),
        invalid_batches=len(v["invalidBatches"]),
        invalid_bodies=len(v["invalidBodies"]),
        events_round_tripped=len(got),
    )


def sc_binary_binding(ctx: Ctx) -> None:
    topic, group = ctx.topics["main"], ctx.groups["main"]
    v = vectors(ctx, "cloudevents-http-binary.json")
    for t in v["valid"]:
        body = t["body"]
        content = base64.b64decode(body["base64"]) if isinstance(body, dict) else body.encode()
        r = ctx.post(topic, t["headers"], content)
        check(r.status_code == 202, f"valid binary {t['id']}: {r.status_code} {r.text[:300]}")
    for t in v["invalid"]:
        body = problem_of(ctx.post(topic, t["headers"], b"{}"), 400, t["id"])
        named = [p.get("attribute") for p in body.get("errors", [])]
        check(
            t["attribute"] in named, f"invalid binary {t['id']}: errors name {named}, not {t['attribute']!r}"
        )
    # a repeated ce- header (httpx sends both)
    headers = [(k, val) for k, val in v["valid"][0]["headers"].items()] + [
        ("ce-subject", "a"),
        ("ce-subject", "b"),
    ]
    problem_of(ctx.post(topic, headers, b""), 400, "repeated ce-subject")
    # HTTP semantics of the events URL
    url = ctx.events_url(topic)
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        r = ctx.http.request(method, url)
        check(
            r.status_code == 405 and r.headers.get("allow") == "POST, OPTIONS",
            f"{method}: {r.status_code} {r.headers}",
        )
    r = ctx.http.options(url, headers={"WebHook-Request-Origin": "conformance.example.org"})
    check(
        r.status_code == 200 and r.headers.get("webhook-allowed-origin") == "conformance.example.org",
        f"handshake: {r.status_code} {dict(r.headers)}",
    )
    minimal = v["valid"][0]["headers"]
    problem_of(ctx.post(ctx.params["missing_topic"], minimal, b""), 404, "unknown topic")
    too_big = b"x" * (ctx.params["request_limit"] + 1)
    r = ctx.post(topic, {**minimal, "content-type": "application/octet-stream"}, too_big)
    check(r.status_code == 413, f"{len(too_big)}-byte request: {r.status_code}")
    many = [
        {"specversion": "1.0", "id": str(i), "source": "/s", "type": "t"}
        for i in range(ctx.params["max_batch"] + 1)
    ]
    r = ctx.post(topic, {"content-type": BATCH}, json.dumps(many))
    check(r.status_code == 413, f"batch of {len(many)}: {r.status_code}")
    got = ctx.drain(topic, group, len(v["valid"]))
    same_multiset(got, [t["expect"] for t in v["valid"]], "binary events pulled back")
    for e in got:
        sdk_read(strip_handle(e))
    ctx.details.update(valid=len(v["valid"]), invalid=len(v["invalid"]) + 1, http_checks=8)


def _sdk_events(prefix: str) -> list[CloudEvent]:
    t = datetime(2021, 7, 13, 8, 15, 0, 123000, tzinfo=UTC)
    base = {"source": "https://example.org/sdk", "type": "org.example.sdk.v1"}
    return [
        CloudEvent(
            {
                **base,
                "id": f"{prefix}-bin-json",
                "subject": "Grüße",
                "time": t,
                "datacontenttype": "application/json",
                "myext": "x y",
            },
            {"a": 1, "b": ["c"]},
        ),
        CloudEvent(
            {**base, "id": f"{prefix}-bin-bytes", "datacontenttype": "application/octet-stream"},
            bytes(range(256)),
        ),
        CloudEvent(
            {
                **base,
                "id": f"{prefix}-struct-text",
                "datacontenttype": "text/plain",
                "count": 7,
                "flag": True,
            },
            "just text",
        ),
        CloudEvent(
            {**base, "id": f"{prefix}-struct-bytes", "datacontenttype": "application/octet-stream"},
            b"\x00\x01\xfe\xff",
        ),
        CloudEvent({**base, "id": f"{prefix}-batch-1", "time": t}, {"n": 1}),
        CloudEvent({**base, "id": f"{prefix}-batch-2", "datacontenttype": "text/plain"}, "two"),
        CloudEvent({**base, "id": f"{prefix}-batch-3", "extnum": -5}, None),
    ]


def _same_event(got: CloudEvent, want: CloudEvent, binary_mode: bool) -> None:
    a, b = dict(got.get_attributes()), dict(want.get_attributes())
    a.pop(HANDLE, None)
    if binary_mode:  # binary mode carries no types: extensions come back as strings
        b = {
            k: (str(val).lower() if isinstance(val, bool) else str(val)) if k not in _CORE else val
            for k, val in b.items()
        }
    check(a == b, f"{want.get_id()}: attributes {a} != {b}")
    check(
        got.get_data() == want.get_data(), f"{want.get_id()}: data {got.get_data()!r} != {want.get_data()!r}"
    )


_CORE = {"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema"}


def sc_sdk_roundtrip(ctx: Ctx) -> None:
    topic, group = ctx.topics["main"], ctx.groups["main"]
    evs = _sdk_events(ctx.config["prefix"][-8:])
    modes = {}
    for e in evs[:2]:  # binary mode
        m = to_binary_event(e)
        check(ctx.post(topic, m.headers, m.body).status_code == 202, f"binary {e.get_id()}")
        modes[e.get_id()] = True
    for e in evs[2:4]:  # structured mode
        m = to_structured_event(e)
        check(
            m.headers.get("content-type", "").startswith(STRUCTURED),
            f"SDK structured content type {m.headers}",
        )
        check(ctx.post(topic, m.headers, m.body).status_code == 202, f"structured {e.get_id()}")
        modes[e.get_id()] = False
    batch = b"[" + b",".join(FORMAT.write(e) for e in evs[4:]) + b"]"
    r = ctx.post(topic, {"content-type": BATCH}, batch)
    check(r.status_code == 202, f"batch: {r.status_code} {r.text[:300]}")
    for e in evs[4:]:
        modes[e.get_id()] = False
    got = {e["id"]: sdk_read(strip_handle(e)) for e in ctx.drain(topic, group, len(evs))}
    for e in evs:
        check(e.get_id() in got, f"{e.get_id()} did not come back")
        _same_event(got[e.get_id()], e, modes[e.get_id()])
    # one structured event per pop (Accept: application/cloudevents+json), read by the SDK's binding
    last = CloudEvent(
        {"source": "/sdk", "type": "t", "id": "single", "datacontenttype": "application/json"}, {"k": "v"}
    )
    m = to_binary_event(last)
    ctx.post(topic, m.headers, m.body)
    pop = f"/topics/{topic}/subscriptions/{group}/pop"
    r = ctx.http.post(pop, json={"wait_ms": 3000}, headers={"accept": STRUCTURED})
    check(r.status_code == 200, f"structured pop: {r.status_code}")
    one = from_structured_event(HTTPMessage(dict(r.headers), r.content))
    check(
        one.get_id() == "single" and one.get_data() == {"k": "v"},
        f"structured pop read as {one.get_attributes()}",
    )
    ctx.ack(topic, group, [one.get_extension(HANDLE)])
    r = ctx.http.post(pop, json={"wait_ms": 200}, headers={"accept": STRUCTURED})
    check(r.status_code == 204, f"empty structured pop: {r.status_code}")
    ctx.details.update(events=len(evs) + 1, modes="binary 2, structured 2, batch 3, structured pop 1")


def sc_pull(ctx: Ctx) -> None:
    topic, group = ctx.topics["main"], ctx.groups["main"]
    for i in range(3):
        m = to_binary_event(CloudEvent({"source": "/pull", "type": "t", "id": f"p{i}"}, {"i": i}))
        ctx.post(topic, m.headers, m.body)
    first = ctx.pop(topic, group, max_events=2, wait_ms=2000)
    check(len(first) == 2 and all(HANDLE in e for e in first), f"pop 2: {first}")
    res = ctx.ack(topic, group, [first[0][HANDLE], "not-a-handle"])
    check(res["acked"] == 1 and res["failed"][0]["kind"] == "invalid_receipt_handle", f"ack: {res}")
    r = ctx.http.post(
        f"/topics/{topic}/subscriptions/{group}/nack",
        json={"receipt_handles": [first[1][HANDLE]], "invisible_time_ms": 0},
    )
    check(r.status_code == 200 and r.json()["receipt_handles"][0], f"nack: {r.status_code} {r.text[:200]}")
    rest = ctx.drain(topic, group, 2)
    ids = sorted(e["id"] for e in rest)
    check(first[1]["id"] in ids and len(set(ids) | {first[0]["id"]}) == 3, f"after nack: {ids}")
    # long polling: the pop waits for an event published while it waits
    got: list = []
    th = threading.Thread(target=lambda: got.extend(ctx.pop(topic, group, wait_ms=5000)))
    t0 = time.monotonic()
    th.start()
    time.sleep(0.5)
    m = to_binary_event(CloudEvent({"source": "/pull", "type": "t", "id": "late"}, None))
    ctx.post(topic, m.headers, m.body)
    th.join(10)
    waited = time.monotonic() - t0
    check([e["id"] for e in got] == ["late"] and 0.4 < waited < 4, f"long poll got {got} after {waited:.2f}s")
    ctx.ack(topic, group, [got[0][HANDLE]])
    ctx.details.update(long_poll_s=round(waited, 2))


class Webhook:
    """A stdlib HTTP server that reads every delivery with the SDK and answers from a script."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.deliveries: list[tuple[str, float, dict, CloudEvent]] = []  # path, time, headers, event
        self.options: list[dict] = []
        self.errors: list[str] = []
        self.answers: dict[str, list[tuple[int, dict, bytes]]] = {}
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:  # quiet
                pass

            def do_OPTIONS(self) -> None:  # noqa: N802
                with hook.lock:
                    hook.options.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("WebHook-Allowed-Origin", "*")
                self.send_header("WebHook-Allowed-Rate", "*")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, rheaders, rbody = 202, {}, b""
                try:
                    ev = from_http_event(HTTPMessage(headers, body))
                    with hook.lock:
                        script = hook.answers.get(ev.get_id())
                        if script:
                            status, rheaders, rbody = script.pop(0)
                        hook.deliveries.append((self.path, time.monotonic(), headers, ev))
                        hook.lock.notify_all()
                except Exception as e:  # noqa: BLE001
                    with hook.lock:
                        hook.errors.append(f"{type(e).__name__}: {e} in {headers} {body[:100]!r}")
                    status = 400
                self.send_response(status)
                for k, val in rheaders.items():
                    self.send_header(k, val)
                self.send_header("Content-Length", str(len(rbody)))
                self.end_headers()
                self.wfile.write(rbody)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def wait(self, pred: Callable[[list], bool], timeout: float, what: str) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: pred(self.deliveries), timeout):
                raise Fail(
                    f"webhook: {what} did not happen; "
                    f"got {[(p, e.get_id()) for p, _, _, e in self.deliveries]}"
                )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sc_push_webhook(ctx: Ctx) -> None:
    topic = ctx.topics["main"]
    hook = Webhook()
    ctx.on_cleanup(hook.close)
    reply = CloudEvent(
        {
            "source": "/webhook",
            "type": "org.example.reply",
            "id": "the-reply",
            "datacontenttype": "application/json",
        },
        {"ok": True},
    )
    rm = to_structured_event(reply)
    hook.answers = {
        "retry-me": [(503, {}, b"busy")],
        "reply-me": [(200, {"content-type": rm.headers["content-type"]}, rm.body)],
        "reject-me": [(400, {}, b"no thanks")],
    }
    sub = {
        "topic": topic,
        "sink": hook.url("/sink"),
        "delivery": {
            "retry": 2,
            "backoff_policy": "linear",
            "backoff_delay": "PT0.3S",
            "dead_letter_sink": hook.url("/dead"),
            "origin": "conformance.example.org",
        },
    }
    r = ctx.http.post("/subscriptions", json=sub)
    check(r.status_code == 201, f"create subscription: {r.status_code} {r.text[:300]}")
    sid = r.json()["id"]
    ctx.on_cleanup(lambda: ctx.http.delete(f"/subscriptions/{sid}"))
    end = time.monotonic() + ctx.left(10)
    while ctx.http.get(f"/subscriptions/{sid}").json()["status"]["state"] != "active":
        check(time.monotonic() < end, "subscription did not become active")
        time.sleep(0.05)
    check(
        hook.options and hook.options[0].get("webhook-request-origin") == "conformance.example.org",
        f"handshake: {hook.options}",
    )
    sent = {}
    for i, eid in enumerate(["plain", "retry-me", "reply-me", "reject-me"]):
        ev = CloudEvent(
            {
                "source": "/push",
                "type": "org.example.push",
                "id": eid,
                "subject": f"s{i}",
                "datacontenttype": "application/json",
            },
            {"i": i},
        )
        m = to_binary_event(ev)
        check(ctx.post(topic, m.headers, m.body).status_code == 202, f"publish {eid}")
        sent[eid] = ev

    def seen(path: str, eid: str) -> Callable[[list], int]:
        return lambda ds: sum(1 for p, _, _, e in ds if p == path and e.get_id() == eid)

    hook.wait(lambda ds: seen("/sink", "retry-me")(ds) >= 2, ctx.left(15), "the retry after a 503")
    hook.wait(lambda ds: seen("/sink", "the-reply")(ds) >= 1, ctx.left(15), "the reply event's delivery")
    hook.wait(lambda ds: seen("/dead", "reject-me")(ds) >= 1, ctx.left(15), "the dead letter")
    time.sleep(0.3)
    with hook.lock:
        ds = list(hook.deliveries)
    check(not hook.errors, f"the SDK could not read deliveries: {hook.errors}")
    for eid in ("plain", "reply-me"):
        check(seen("/sink", eid)(ds) == 1, f"{eid} delivered {seen('/sink', eid)(ds)} times")
    check(seen("/sink", "reject-me")(ds) == 1, "a 400 must not be retried")
    tries = [t for p, t, _, e in ds if p == "/sink" and e.get_id() == "retry-me"]
    check(len(tries) == 2 and tries[1] - tries[0] >= 0.25, f"retry-me attempts at {tries}")
    for p, _, h, e in ds:
        check(h.get("webhook-request-origin") == "conformance.example.org", f"delivery without origin: {h}")
        if p == "/sink" and e.get_id() in sent:
            want = sent[e.get_id()]
            check(
                e.get_data() == want.get_data() and e.get_subject() == want.get_subject(),
                f"{e.get_id()} changed: {e.get_attributes()}",
            )
    the_reply = next(e for p, _, _, e in ds if e.get_id() == "the-reply")
    check(
        the_reply.get_extension("knativebrokerttl") == "254" and the_reply.get_data() == {"ok": True},
        f"reply: {the_reply.get_attributes()}",
    )
    dead = next(e for p, _, _, e in ds if p == "/dead")
    ext = {k: dead.get_extension(k) for k in ("knativeerrordest", "knativeerrorcode", "knativeerrordata")}
    check(
        ext["knativeerrordest"] == sub["sink"] and ext["knativeerrorcode"] == "400",
        f"dead letter extensions {ext}",
    )
    check(
        base64.b64decode(ext["knativeerrordata"] or "") == b"no thanks",
        f"knativeerrordata {ext['knativeerrordata']}",
    )
    status = ctx.http.get(f"/subscriptions/{sid}").json()["status"]
    check(
        status["dead_lettered"] == 1 and status["replies"] == 1 and status["delivered"] >= 4,
        f"status {status}",
    )
    r = ctx.http.delete(f"/subscriptions/{sid}")
    check(r.status_code == 204, f"delete: {r.status_code}")
    ctx.details.update(deliveries=len(ds), handshakes=len(hook.options), status=status)


def sc_cross_protocol(ctx: Ctx) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    sensors, orders, group = ctx.topics["sensors"], ctx.topics["orders"], ctx.groups["sensors"]
    m = ctx.config["mqtt"]
    inbox: list = []
    cond = threading.Condition()

    def on_message(_client, _userdata, msg) -> None:
        with cond:
            inbox.append(msg)
            cond.notify_all()

    def client(name: str) -> mqtt.Client:
        c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{ctx.config['prefix']}-{name}", protocol=mqtt.MQTTv5
        )
        c.on_message = on_message
        c.connect(m["host"], m["port"])
        c.loop_start()
        ctx.on_cleanup(lambda: (c.disconnect(), c.loop_stop()))
        return c

    # MQTT -> HTTP pull: valid CloudEvents with the documented synthesized attributes
    pub = client("pub")
    pub.publish(f"{sensors}/dev1/temp", b"21.5", qos=1).wait_for_publish(5)
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    pub.publish(f"{sensors}/dev2/status", b"online", qos=1, properties=props).wait_for_publish(5)
    got = {e["subject"]: e for e in ctx.drain(sensors, group, 2)}
    for path, data, ct in (
        (f"{sensors}/dev1/temp", 21.5, None),
        (f"{sensors}/dev2/status", "online", "text/plain"),
    ):
        e = got.get(path)
        check(e is not None, f"no event for MQTT topic {path}: {list(got)}")
        ce = sdk_read(strip_handle(e))
        check(
            ce.get_source() == f"/gateway/mqtt/{sensors}" and ce.get_type() == "mqtt.publish", f"{path}: {e}"
        )
        check(ce.get_data() == data and e.get("datacontenttype") == ct and e.get("time"), f"{path}: {e}")
    # HTTP -> MQTT: the data is the payload, on the topic's path
    sub = client("sub")
    ok = threading.Event()
    sub.on_subscribe = lambda *a: ok.set()
    sub.subscribe(f"{orders}/#", qos=1)
    check(ok.wait(5), "SUBACK")
    ev = CloudEvent(
        {
            "source": "/orders",
            "type": "org.example.order",
            "id": f"o-{uuid.uuid4().hex[:8]}",
            "datacontenttype": "application/json",
        },
        {"order": 1},
    )
    msg = to_binary_event(ev)
    check(ctx.post(orders, msg.headers, msg.body).status_code == 202, "publish over HTTP")
    with cond:
        check(cond.wait_for(lambda: inbox, ctx.left(10)), "the MQTT subscriber got nothing")
    got_msg = inbox[0]
    check(
        got_msg.topic == orders and got_msg.payload == msg.body and got_msg.qos == 1,
        f"MQTT got {got_msg.topic} {got_msg.payload!r} q{got_msg.qos}",
    )
    ctx.details.update(mqtt_to_http=2, http_to_mqtt=1)


SCENARIOS: dict[str, Callable[[Ctx], None]] = {
    "json_format_vectors": sc_json_format_vectors,
    "binary_binding": sc_binary_binding,
    "sdk_roundtrip": sc_sdk_roundtrip,
    "pull": sc_pull,
    "push_webhook": sc_push_webhook,
    "cross_protocol": sc_cross_protocol,
}


def main(argv: list[str]) -> None:
    scenario = argv[1] if len(argv) == 3 else ""
    if scenario not in SCENARIOS:
        print(f"usage: {argv[0]} {{{','.join(SCENARIOS)}}} CONFIG_JSON", file=sys.stderr)
        os._exit(2)
    ctx = Ctx(json.loads(argv[2]), scenario)
    ok, reason = False, ""
    try:
        SCENARIOS[scenario](ctx)
        ok = True
    except Fail as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001
        reason = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        ctx.cleanup()
    ctx.details["elapsed_s"] = round(time.monotonic() - ctx.started, 2)
    line = {"client": CLIENT, "scenario": scenario, "ok": ok, "reason": reason, "details": ctx.details}
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main(sys.argv)
