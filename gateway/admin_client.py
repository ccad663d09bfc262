"""Admin subcommands of the CLI: talk to a running gateway's HTTP admin API (the running gateway
holds the store directory's lock, so admin goes through it rather than opening the store)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8082"
REDRIVE_CHUNK = 100  # dead letter ids per redrive request
DLQ_PAGE = 1000  # dead letters per list request (the API's maximum)


class AdminError(Exception):
    """A one-line reason the admin call failed (unreachable gateway, error answer)."""


class AdminClient:
    """`auth`: ("basic", user, password) or ("bearer", token), sent with every request; None for a
    gateway with authentication off."""

    def __init__(self, url: str, timeout: float = 10.0, auth: tuple[str, ...] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers: dict[str, str] = {}
        if auth is not None and auth[0] == "basic":
            raw = f"{auth[1]}:{auth[2]}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        elif auth is not None:
            self.headers["Authorization"] = f"Bearer {auth[1]}"

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The answer of a request, AdminError for an unreachable gateway or an error status."""
        headers = {**self.headers, **kw.pop("headers", {})}
        try:
            r = httpx.request(method, self.url + path, headers=headers, timeout=self.timeout, **kw)
        except httpx.HTTPError as e:
            raise AdminError(f"cannot reach the gateway at {self.url}: {e}") from e
        if r.status_code >= 400:
            raise AdminError(f"{r.status_code} {_detail(r)}")
        return r

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        r = self.send(method, path, json=body)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError as e:
            raise AdminError(f"{self.url}{path} answered {r.status_code} with a non-JSON body") from e

    def list_topics(self) -> list[dict]:
        return self.request("GET", "/admin/topics")

    def get_topic(self, name: str) -> dict:
        return self.request("GET", f"/admin/topics/{_seg(name)}")

    def create_topic(self, name: str, **fields: Any) -> dict:
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return self.request("POST", "/admin/topics", body)

    def update_topic(self, name: str, queues: int) -> dict:
        return self.request("PATCH", f"/admin/topics/{_seg(name)}", {"queues": queues})

    def delete_topic(self, name: str) -> None:
        self.request("DELETE", f"/admin/topics/{_seg(name)}")

    def list_groups(self) -> list[dict]:
        return self.request("GET", "/admin/groups")

    def get_group(self, name: str) -> dict:
        return self.request("GET", f"/admin/groups/{_seg(name)}")

    def create_group(self, name: str, **fields: Any) -> dict:
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return self.request("POST", "/admin/groups", body)

    def delete_group(self, name: str) -> None:
        self.request("DELETE", f"/admin/groups/{_seg(name)}")

    def list_clients(self) -> list[dict]:
        return self.request("GET", "/admin/clients")

    # ------------------------------------------------------------------ identities and ACL
    def add_user(self, name: str, **fields: Any) -> dict:
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return self.request("POST", "/admin/users", body)

    def list_users(self) -> list[dict]:
        return self.request("GET", "/admin/users")

    def set_password(self, name: str, password: str) -> None:
        self.request("PUT", f"/admin/users/{_seg(name)}/password", {"password": password})

    def delete_user(self, name: str) -> None:
        self.request("DELETE", f"/admin/users/{_seg(name)}")

    def create_token(self, name: str, user: str | None = None) -> dict:
        body = {"name": name, **({"user": user} if user else {})}
        return self.request("POST", "/admin/tokens", body)

    def list_tokens(self) -> list[dict]:
        return self.request("GET", "/admin/tokens")

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/admin/tokens/{_seg(token_id)}")

    def add_rule(self, subject: str, kind: str, pattern: str, actions: list[str], effect: str) -> dict:
        body = {"subject": subject, "kind": kind, "pattern": pattern, "actions": actions, "effect": effect}
        return self.request("POST", "/admin/acl", body)

    def list_rules(self) -> list[dict]:
        return self.request("GET", "/admin/acl")

    def delete_rule(self, rule_id: str) -> None:
        self.request("DELETE", f"/admin/acl/{_seg(rule_id)}")

    def export_policy(self) -> str:
        return self.send("GET", "/admin/acl/export").text

    def import_policy(self, text: str, *, replace: bool = True) -> dict:
        r = self.send(
            "POST",
            "/admin/acl/import",
            content=text.encode(),
            headers={"Content-Type": "application/toml"},
            params={"replace": "true" if replace else "false"},
        )
        return r.json()

    # ------------------------------------------------------------------ messages and dead letters
    def browse(self, topic: str, offset: int | None, queue: int | None, count: int | None) -> list[dict]:
        params = {k: v for k, v in (("offset", offset), ("queue", queue), ("count", count)) if v is not None}
        return self.send("GET", f"/admin/topics/{_seg(topic)}/messages", params=params).json()

    def get_message(self, message_id: str) -> list[dict]:
        return self.request("GET", f"/admin/messages/{_seg(message_id)}")

    def find_messages(self, key: str) -> list[dict]:
        return self.send("GET", "/admin/messages", params={"key": key}).json()

    def trace(self, message_id: str) -> dict:
        return self.request("GET", f"/admin/messages/{_seg(message_id)}/trace")

    def dead_letters(self, group: str, count: int | None = None, *, pending: bool = False) -> list[dict]:
        params: dict[str, Any] = {"count": count} if count is not None else {}
        if pending:
            params["pending"] = "true"
        return self.send("GET", f"/admin/dlq/{_seg(group)}", params=params).json()

    def redrive(self, group: str, ids: list[str] | None = None) -> dict:
        return self.request("POST", f"/admin/dlq/{_seg(group)}/redrive", {} if ids is None else {"ids": ids})

    def redrive_in_chunks(
        self,
        group: str,
        ids: list[str] | None,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = REDRIVE_CHUNK,
    ) -> dict:
        """Redrive `ids` `chunk` ids per request, calling `progress(done, total)` after each; the
        answers merged into one. `ids` None: every pending dead letter, listed a page at a time
        (the total grows as pages come) until none is left or a page redrives nothing."""
        out: dict[str, Any] = {"redriven": 0, "ids": [], "new_ids": []}
        done = total = 0
        todo = list(dict.fromkeys(ids)) if ids is not None else None
        while True:
            page = (
                todo
                if todo is not None
                else [d["id"] for d in self.dead_letters(group, DLQ_PAGE, pending=True)]
            )
            total += len(page)
            if progress is not None:
                progress(done, total)
            before = out["redriven"]
            for i in range(0, len(page), chunk):
                r = self.redrive(group, page[i : i + chunk])
                out["redriven"] += r["redriven"]
                out["ids"] += r["ids"]
                out["new_ids"] += r.get("new_ids", [])
                done += len(page[i : i + chunk])
                if progress is not None:
                    progress(done, total)
            if todo is not None or not page or out["redriven"] == before:
                return out


def _seg(name: str) -> str:
    return quote(name, safe="")


def _detail(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text.strip().splitlines()[0] if r.text.strip() else r.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)
    return str(body)


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """Left-aligned columns separated by two spaces; `-` for None."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


# ----------------------------------------------------------------------------- renderers
def render_topics(topics: list[dict]) -> str:
    rows = [
        (
            t["name"],
            _queues(t),
            t.get("messages"),
            t.get("retention_ms"),
            t.get("retention_bytes"),
            "yes" if t.get("compacted") else "",
        )
        for t in topics
    ]
    return table(rows, ("NAME", "QUEUES", "MESSAGES", "RETENTION_MS", "RETENTION_BYTES", "COMPACTED"))


def _queues(t: dict) -> str:
    """QUEUES column: writable queues, with the sealed ones still readable after a shrink."""
    n, r = t["queues"], t.get("read_queues") or 0
    return f"{n} (+{r - n} sealed)" if r > n else str(n)


def render_topic(t: dict) -> str:
    lines = [render_topics([t]), ""]
    lines.append(
        table(
            [(q["queue_id"], q["min_offset"], q["max_offset"]) for q in t.get("queue_offsets", [])],
            ("QUEUE", "MIN_OFFSET", "MAX_OFFSET"),
        )
    )
    groups = t.get("groups") or {}
    if groups:
        lines += [
            "",
            table(
                [(g, v["backlog"], v["inflight"]) for g, v in sorted(groups.items())],
                ("GROUP", "BACKLOG", "INFLIGHT"),
            ),
        ]
    return "\n".join(lines)


def render_groups(groups: list[dict]) -> str:
    rows = []
    for g in groups:
        topics = g.get("topics") or {}
        backlog = sum(v["backlog"] for v in topics.values())
        inflight = sum(v["inflight"] for v in topics.values())
        rows.append(
            (
                g["name"],
                g["max_attempts"],
                g["retry_initial_ms"],
                g["retry_multiplier"],
                g["retry_max_ms"],
                ",".join(sorted(topics)) or "-",
                backlog,
                inflight,
            )
        )
    return table(
        rows,
        (
            "NAME",
            "MAX_ATTEMPTS",
            "RETRY_INITIAL_MS",
            "RETRY_MULTIPLIER",
            "RETRY_MAX_MS",
            "TOPICS",
            "BACKLOG",
            "INFLIGHT",
        ),
    )


def render_group(g: dict) -> str:
    out = render_groups([g])
    topics = g.get("topics") or {}
    if topics:
        out += "\n\n" + table(
            [(t, v["backlog"], v["inflight"]) for t, v in sorted(topics.items())],
            ("TOPIC", "BACKLOG", "INFLIGHT"),
        )
    return out


def render_clients(clients: list[dict]) -> str:
    rows = [
        (
            c["protocol"],
            c["client_id"],
            c["kind"],
            c["group"] or "-",
            ",".join(c["topics"]) or "-",
            c["remote"] or "-",
        )
        for c in clients
    ]
    return table(rows, ("PROTOCOL", "CLIENT_ID", "KIND", "GROUP", "TOPICS", "REMOTE"))


def render_users(users: list[dict]) -> str:
    rows = [
        (u["name"], u["role"], "yes" if u["password"] else "no", u.get("access_key"), ",".join(u["vhosts"]))
        for u in users
    ]
    return table(rows, ("NAME", "ROLE", "PASSWORD", "ACCESS_KEY", "VHOSTS"))


def render_tokens(tokens: list[dict]) -> str:
    return table([(t["id"], t["name"], t["user"]) for t in tokens], ("ID", "NAME", "USER"))


def render_rules(rules: list[dict]) -> str:
    rows = [
        (r["id"], r["subject"], r["kind"], r["pattern"], ",".join(r["actions"]), r["effect"]) for r in rules
    ]
    return table(rows, ("ID", "SUBJECT", "KIND", "PATTERN", "ACTIONS", "EFFECT"))


# ----------------------------------------------------------------------------- messages, DLQ, trace
def render_body(m: dict, fmt: str = "text") -> str:
    """A message body as `text` (UTF-8, else hex), `json` (pretty-printed, else as text) or `hex`."""
    raw = base64.b64decode(m.get("body_base64") or "")
    if fmt == "json" and m.get("body") is not None:
        try:
            return json.dumps(json.loads(m["body"]), indent=2, sort_keys=True)
        except ValueError:
            pass
    if fmt == "hex" or m.get("body") is None:
        return raw.hex(" ")
    return m["body"]


def _ms(epoch_ms: int | None) -> str:
    if not epoch_ms:
        return "-"
    t = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{epoch_ms % 1000:03d}"


def render_messages(messages: list[dict], fmt: str = "text") -> str:
    """One block per message: a header line, its properties, then the body."""
    if not messages:
        return "no messages"
    blocks = []
    for m in messages:
        head = table(
            [
                (
                    m["id"],
                    m["topic"],
                    m["queue"],
                    m["offset"],
                    _ms(m.get("store_time")),
                    ",".join(m.get("keys") or []) or "-",
                    m.get("tag") or "-",
                    m.get("size"),
                )
            ],
            ("ID", "TOPIC", "QUEUE", "OFFSET", "STORED", "KEYS", "TAG", "SIZE"),
        )
        props = "".join(f"\n  {k}: {v}" for k, v in sorted((m.get("properties") or {}).items()))
        blocks.append(f"{head}{props}\n\n{render_body(m, fmt)}")
    return "\n\n".join(blocks)


def render_dead_letters(dead: list[dict]) -> str:
    rows = [
        (
            d["id"],
            d.get("original_topic"),
            d.get("reason"),
            d.get("attempts"),
            _ms(d.get("store_time")),
            d.get("redriven_id") or ("yes" if d.get("redriven") else ""),
        )
        for d in dead
    ]
    return table(rows, ("ID", "TOPIC", "REASON", "ATTEMPTS", "DEAD_LETTERED", "REDRIVEN"))


def render_trace(trace: dict) -> str:
    """A message trace (GET /admin/messages/{id}/trace) as a timeline: one row per event, by time."""
    head = (
        f"message {trace.get('message_id')}  topic {trace.get('topic')}  "
        f"trace {trace.get('trace_id')}  traceparent {trace.get('traceparent')}"
    )
    events = sorted(trace.get("events") or [], key=lambda e: e.get("time") or 0)
    rows = [
        (
            _ms(e.get("time")),
            e.get("event"),
            e.get("protocol") or None,
            e.get("client_id") or None,
            e.get("group"),
            e.get("attempt"),
            e.get("detail"),
        )
        for e in events
    ]
    return head + "\n\n" + table(rows, ("TIME", "EVENT", "PROTOCOL", "CLIENT", "GROUP", "ATTEMPT", "DETAIL"))


def progress_bar(done: int, total: int, width: int = 30) -> str:
    """`[#####.....] 300/1000`: plain text, redrawn in place with a leading carriage return."""
    filled = width if total <= 0 else width * done // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
