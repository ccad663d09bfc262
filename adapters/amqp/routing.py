"""Exchanges and their routing: direct, fanout, topic (`*` one word, `#` zero or more), headers
(x-match all / any / all-with-x / any-with-x), exchange-to-exchange bindings and alternate
exchanges; a virtual host's exchanges and queues (`VHost`) and the route of a publish through them.
Routing happens at publish time, in memory; declarations are in registry.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from messaging_processor import Message

from .codec import AMQPError, ReplyCode
from .mapping import headers_of
from .queues import Queue

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
_CACHE_MAX = 4096


class Binding:
    """source exchange -> destination (a Queue or an Exchange), with its key and arguments."""

    __slots__ = ("source", "dest", "routing_key", "args", "key")

    def __init__(self, source: Exchange, dest: Any, routing_key: str, args: dict[str, Any], key: str) -> None:
        self.source = source
        self.dest = dest
        self.routing_key = routing_key
        self.args = args
        self.key = key  # identity (vhost, source, dest kind + name, routing key, arguments)


class Exchange:
    __slots__ = (
        "vhost",
        "name",
        "type",
        "durable",
        "auto_delete",
        "internal",
        "args",
        "bindings",
        "_direct",
        "_cache",
        "_headers",
        "alternate",
        "deleted",
        "queues_only",
        "bridge",
        "watch",
        "stores",
        "stored",
    )

    def __init__(
        self,
        vhost: str,
        name: str,
        type_: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        args: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.type = type_
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.args = args or {}
        self.stored: bytes | None = None  # its record in the store (records.py); None: not recorded
        ae = self.args.get("alternate-exchange")
        self.alternate: str | None = ae if isinstance(ae, str) and ae else None
        self.bindings: dict[str, Binding] = {}
        self._direct: dict[str, list[Any]] = {}
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._headers: list[tuple[bool, bool, dict[str, Any], Any]] = []
        self.deleted = False
        self.queues_only = True  # no exchange-to-exchange binding from here
        # the MQTT exchange (bridge.py): the store message for MQTT of a publish, and a callback
        # for binding changes (with the time a new binding was made, epoch ms, when it is known)
        self.bridge: Callable[[str, bytes, bytes, Any], Message | None] | None = None
        self.watch: Callable[[int | None], None] | None = None
        self.stores = False  # the exchange of a store topic (bridge.py): a publish is stored on it

    def __repr__(self) -> str:
        return f"Exchange({self.vhost!r}, {self.name!r}, {self.type})"

    # ------------------------------------------------------------------ bindings
    def bind(self, b: Binding, made_at: int | None = None) -> bool:
        """Add a binding (made at `made_at`, epoch ms, if not now); False if it already exists."""
        if b.key in self.bindings:
            return False
        self.bindings[b.key] = b
        # added to the routing tables as they are, not rebuilt from every binding: an app that
        # declares thousands of bound queues pays for each, not for all of them each time
        self._cache.clear()
        if self.type == "direct":
            dests = self._direct.get(b.routing_key, [])
            if b.dest not in dests:
                self._direct[b.routing_key] = [*dests, b.dest]  # a new list: `match` hands lists out
        elif self.type == "headers":
            self._headers = [*self._headers, _header_entry(b)]
        if isinstance(b.dest, Exchange):
            self.queues_only = False
        if self.watch is not None:
            self.watch(made_at)
        return True

    def unbind(self, key: str) -> Binding | None:
        b = self.bindings.pop(key, None)
        if b is not None:
            self._rebuild()
        return b

    def _rebuild(self) -> None:
        self._cache.clear()
        direct: dict[str, list[Any]] = {}
        headers: list[tuple[bool, bool, dict[str, Any], Any]] = []
        for b in self.bindings.values():
            if self.type == "direct":
                lst = direct.setdefault(b.routing_key, [])
                if b.dest not in lst:
                    lst.append(b.dest)
            elif self.type == "headers":
                headers.append(_header_entry(b))
        self._direct = direct
        self._headers = headers
        self.queues_only = all(not isinstance(b.dest, Exchange) for b in self.bindings.values())
        if self.watch is not None:
            self.watch(None)

    # ------------------------------------------------------------------ matching
    def match(self, routing_key: str, raw_properties: bytes) -> tuple[Any, ...] | list[Any]:
        """The direct destinations of a message (queues and exchanges, no duplicates); the headers
        exchange decodes the headers from the raw content properties."""
        t = self.type
        if t == "direct":
            return self._direct.get(routing_key, ())
        if t == "fanout":
            r = self._cache.get("")
            if r is None:
                r = self._cache[""] = tuple(dict.fromkeys(b.dest for b in self.bindings.values()))
            return r
        if t == "topic":
            r = self._cache.get(routing_key)
            if r is None:
                words = routing_key.split(".")
                r = tuple(
                    dict.fromkeys(
                        b.dest
                        for b in self.bindings.values()
                        if topic_matches(b.routing_key.split("."), words)
                    )
                )
                if len(self._cache) >= _CACHE_MAX:
                    self._cache.clear()
                self._cache[routing_key] = r
            return r
        if t == "headers" and self._headers:
            h = headers_of(raw_properties)
            out: list[Any] = []
            for any_, _with_x, want, dest in self._headers:
                if dest not in out and headers_match(any_, want, h):
                    out.append(dest)
            return out
        return ()


def _header_entry(b: Binding) -> tuple[bool, bool, dict[str, Any], Any]:
    """A headers exchange binding as `match` reads it: (any, with x-, wanted headers, destination)."""
    mode = str(b.args.get("x-match", "all"))
    with_x = mode.endswith("-with-x")
    want = {k: v for k, v in b.args.items() if with_x or not k.startswith("x-")}
    return mode.startswith("any"), with_x, want, b.dest


def topic_matches(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic matching of routing key words against binding pattern words."""

    def m(i: int, j: int) -> bool:
        np, nw = len(pattern), len(words)
        while i < np:
            p = pattern[i]
            if p == "#":
                while i + 1 < np and pattern[i + 1] == "#":
                    i += 1
                if i + 1 == np:
                    return True
                return any(m(i + 1, k) for k in range(j, nw + 1))
            if j >= nw or (p != "*" and p != words[j]):
                return False
            i += 1
            j += 1
        return j == nw

    return m(0, 0)


def headers_match(any_: bool, want: dict[str, Any], headers: dict[str, Any]) -> bool:
    """x-match any / all: a binding value of None (void) matches the header's mere presence."""
    if not want:
        return not any_
    for k, v in want.items():
        ok = k in headers and (v is None or headers[k] == v)
        if any_ and ok:
            return True
        if not any_ and not ok:
            return False
    return not any_


class VHost:
    """A virtual host: its exchanges (the default and amq.* ones pre-declared) and queues."""

    __slots__ = ("name", "exchanges", "queues", "dropping", "topic_exchange")

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {"": Exchange(name, "", "direct")}
        for n, t in PREDECLARED:
            self.exchanges[n] = Exchange(name, n, t)
        self.queues: dict[str, Queue] = {}
        # ("q" | "e", name) being deleted: their records must not be adopted back meanwhile
        self.dropping: set[tuple[str, str]] = set()
        # vhost "/": the exchange of store topic `name`, made on first use (bridge.py); None if none
        self.topic_exchange: Callable[[str], Awaitable[Exchange | None]] | None = None

    def exchange(self, name: str, cls: int, mid: int) -> Exchange:
        """An exchange this proxy knows (the publish path: no store round trip); 404 if none."""
        ex = self.exchanges.get("" if name == "amq.default" else name)
        if ex is None:
            raise AMQPError(
                ReplyCode.NOT_FOUND,
                f"no exchange '{name}' in vhost '{self.name}'",
                class_id=cls,
                method_id=mid,
            )
        return ex

    def route(self, ex: Exchange, rk: str, raw: bytes) -> tuple[Queue, ...] | list[Queue]:
        """The queues a message published to `ex` with `rk` goes to (exchange-to-exchange bindings
        and alternate exchanges followed); `raw`: its content properties (headers exchanges)."""
        if not ex.name:
            q = self.queues.get(rk)
            return (q,) if q is not None else ()
        dests = ex.match(rk, raw)
        if ex.queues_only and (dests or ex.alternate is None):
            return dests
        out: list[Queue] = []
        seen: set[int] = {id(ex)}
        stack: list[Any] = list(dests)
        while True:
            while stack:
                d = stack.pop(0)
                if type(d) is Queue:
                    if d not in out:
                        out.append(d)
                elif id(d) not in seen:
                    seen.add(id(d))
                    stack.extend(d.match(rk, raw))
            if out or ex.alternate is None:
                return out
            alt = self.exchanges.get(ex.alternate)
            if alt is None or id(alt) in seen:
                return out
            seen.add(id(alt))
            ex = alt
            stack = list(alt.match(rk, raw)) if alt.name else list(self.route(alt, rk, raw))
