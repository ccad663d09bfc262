"""The durable records of declarations in the processor's key-value table, read and written by every
proxy of a cluster.

Namespaces: `amqp.exchanges` (every exchange, so that proxies share non-durable ones too; those
are removed when a proxy starts), `amqp.queues` (every queue, so that transient and exclusive ones
are removed from the store after a crash), `amqp.bindings` (every binding, so that a publish
through any proxy routes by the bindings made through the others; those with a transient end are
removed with it), `amqp.meta` (`bindings/<owner>/<nonce>`: one generation per proxy, random
bytes it writes after each change of `amqp.bindings` and each deletion of an exchange or queue it
makes; a proxy polls the others' generations, so its own changes do not make it re-read every
record; a proxy that stops deletes its own, and one that starts those of processes that are gone),
`amqp.leases` (each proxy's lease: messaging_processor/ownership.py). Keys are
`<len(vhost)>:<vhost><name>` (a binding's name: `<len(source)>:<source><binding key>`), values
JSON with arguments as base64 of the AMQP field table. A queue record names the user who declared
it (`user`, for the per-user queue limit); records written before that have none and count for
nobody. Exchange and queue records name the process that declared them (`owner`,
messaging_processor/ownership.py): a
proxy that starts removes only the transient ones whose process is gone. An unreadable exchange or
queue record is deleted when it is read.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from typing import Any, Protocol

from messaging_processor.ownership import this_process

from .codec import AMQPError, decode_table, encode_table
from .queues import Queue
from .routing import Binding, Exchange

log = logging.getLogger("adapters.amqp")

EXCHANGES_NS = "amqp.exchanges"
QUEUES_NS = "amqp.queues"
BINDINGS_NS = "amqp.bindings"
META_NS = "amqp.meta"
LEASES_NS = "amqp.leases"  # key: an owner name; value: its lease (OwnerLeases)
GENERATIONS = "bindings"  # the prefix of the generation keys in META_NS


class KeyValue(Protocol):
    """The processor's key-value table (MessagingProcessor provides it)."""

    async def kv_get(self, ns: str, key: str) -> bytes | None: ...
    async def kv_put(self, ns: str, key: str, value: bytes) -> None: ...
    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None: ...
    async def kv_delete(self, ns: str, key: str) -> bool: ...
    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]: ...


def vkey(vhost: str, name: str) -> str:
    return f"{len(vhost)}:{vhost}{name}"


def parse_vkey(key: str) -> tuple[str, str]:
    n, _, rest = key.partition(":")
    k = int(n)
    return rest[:k], rest[k:]


def args_b64(args: dict[str, Any]) -> str:
    return base64.b64encode(encode_table(args)).decode("ascii") if args else ""


def args_of(text: str) -> dict[str, Any]:
    if not text:
        return {}
    raw = base64.b64decode(text)
    return decode_table(raw, 0, len(raw))[0]


def binding_name(source: str, key: str) -> str:
    """A binding's name within its vhost: its source and its key (`Binding.key`)."""
    return f"{len(source)}:{source}{key}"


def binding_source(value: bytes, queue: str) -> str | None:
    """The source exchange of a stored binding to `queue` (None for any other record)."""
    try:
        r = json.loads(value)
        return r["source"] if r["kind"] == "q" and r["dest"] == queue else None
    except (ValueError, KeyError, TypeError):
        return None


def _text_field(value: bytes, name: str) -> str | None:
    """A record's text field `name` (None: not recorded, or an unreadable record)."""
    try:
        v = json.loads(value).get(name)
    except (ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None


def record_owner(value: bytes) -> str | None:
    """The process that declared a stored exchange or queue (messaging_processor/ownership.py)."""
    return _text_field(value, "owner")


def queue_user(value: bytes) -> str | None:
    """The user who declared a stored queue."""
    return _text_field(value, "user")


class Records:
    """Reads and writes of the declaration records."""

    __slots__ = ("kv", "generation_key")

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        # this proxy's generation of the bindings (`amqp.meta`): a nonce per proxy, as several
        # proxies may run in one process (tests)
        self.generation_key = f"{GENERATIONS}/{this_process()}/{secrets.token_hex(4)}"

    # ------------------------------------------------------------------ exchanges
    async def exchanges(self) -> list[tuple[str, bytes]]:
        return await self.kv.kv_scan(EXCHANGES_NS)

    async def exchange_value(self, vh: str, name: str) -> bytes | None:
        return await self.kv.kv_get(EXCHANGES_NS, vkey(vh, name))

    async def exchange_of(self, vh: str, name: str, value: bytes) -> Exchange | None:
        try:
            r = json.loads(value)
            durable = r.get("durable", True)  # records written before non-durable ones were kept
            ex = Exchange(vh, name, r["type"], durable, r["auto_delete"], r["internal"], args_of(r["args"]))
        except (ValueError, KeyError, TypeError):
            log.warning("amqp: unreadable exchange record %r dropped", vkey(vh, name))
            await self.kv.kv_delete(EXCHANGES_NS, vkey(vh, name))
            return None
        ex.stored = value
        return ex

    async def put_exchange(self, ex: Exchange) -> None:
        """Write a new exchange's record (kept as `ex.stored`)."""
        rec = {
            "type": ex.type,
            "durable": ex.durable,
            "auto_delete": ex.auto_delete,
            "internal": ex.internal,
            "args": args_b64(ex.args),
            "owner": this_process(),
        }
        ex.stored = json.dumps(rec).encode()
        await self.kv.kv_put(EXCHANGES_NS, vkey(ex.vhost, ex.name), ex.stored)

    async def delete_exchange(self, vh: str, name: str) -> None:
        await self.kv.kv_delete(EXCHANGES_NS, vkey(vh, name))

    # ------------------------------------------------------------------ queues
    async def queues(self) -> list[tuple[str, bytes]]:
        return await self.kv.kv_scan(QUEUES_NS)

    async def queue_count(self, vh: str) -> int:
        """The queues of vhost `vh` (every proxy's: read from the key-value table)."""
        return len(await self.kv.kv_scan(QUEUES_NS, vkey(vh, "")))

    async def user_queue_count(self, user: str) -> int:
        """The queues `user` declared, in every vhost (every proxy's: read from the key-value table)."""
        return sum(1 for _, value in await self.kv.kv_scan(QUEUES_NS) if queue_user(value) == user)

    async def queue_value(self, vh: str, name: str) -> bytes | None:
        return await self.kv.kv_get(QUEUES_NS, vkey(vh, name))

    async def queue_of(self, vh: str, name: str, value: bytes) -> Queue | None:
        try:
            r = json.loads(value)
            q = Queue(
                vh,
                name,
                r["topic"],
                durable=r["durable"],
                exclusive=r["exclusive"],
                auto_delete=r["auto_delete"],
                args=args_of(r["args"]),
                own_topic=r["own_topic"],
            )
        except (ValueError, KeyError, TypeError, AMQPError):
            log.warning("amqp: unreadable queue record %r dropped", vkey(vh, name))
            await self.kv.kv_delete(QUEUES_NS, vkey(vh, name))
            return None
        q.stored = value
        return q

    async def create_queue(self, q: Queue, args: dict[str, Any], user: str | None = None) -> bytes | None:
        """Write a new queue's record (declared by `user`, None: nobody's; kept as `q.stored`) unless
        one exists; the existing record if there is one."""
        rec = q.record()
        rec["args"] = args_b64(args)
        rec["owner"] = this_process()
        if user is not None:
            rec["user"] = user
        q.stored = json.dumps(rec).encode()
        return await self.kv.kv_put_if_absent(QUEUES_NS, vkey(q.vhost, q.name), q.stored)

    async def delete_queue(self, vh: str, name: str) -> None:
        await self.kv.kv_delete(QUEUES_NS, vkey(vh, name))

    # ------------------------------------------------------------------ bindings
    async def bindings(self, vh: str | None = None) -> list[tuple[str, bytes]]:
        """Every stored binding (of one vhost when `vh` is given)."""
        if vh is None:
            return await self.kv.kv_scan(BINDINGS_NS)
        return await self.kv.kv_scan(BINDINGS_NS, vkey(vh, ""))

    @staticmethod
    def parse_binding(value: bytes) -> tuple[str, str, str, str, dict[str, Any]]:
        """(source, "q" | "e", destination, routing key, arguments); ValueError, KeyError or
        TypeError when unreadable."""
        r = json.loads(value)
        return r["source"], r["kind"], r["dest"], r["rk"], args_of(r["args"])

    @staticmethod
    def binding_made_at(value: bytes) -> int | None:
        """When a stored binding was made (epoch ms; None: not recorded, or unreadable)."""
        try:
            at = json.loads(value).get("at")
        except (ValueError, AttributeError):
            return None
        return at if isinstance(at, int) else None

    async def put_binding(self, vh: str, b: Binding) -> None:
        rec = {
            "source": b.source.name,
            "kind": "q" if isinstance(b.dest, Queue) else "e",
            "dest": b.dest.name,
            "rk": b.routing_key,
            "args": args_b64(b.args),
            "at": time.time_ns() // 1_000_000,
        }
        await self.kv.kv_put(
            BINDINGS_NS, vkey(vh, binding_name(b.source.name, b.key)), json.dumps(rec).encode()
        )

    async def delete_binding(self, vh: str, b: Binding) -> None:
        await self.kv.kv_delete(BINDINGS_NS, vkey(vh, binding_name(b.source.name, b.key)))

    async def delete_binding_key(self, key: str) -> None:
        await self.kv.kv_delete(BINDINGS_NS, key)

    async def bindings_generation(self) -> tuple[tuple[str, bytes], ...]:
        """The other proxies' generations of `amqp.bindings` (this proxy's own changes are
        applied here already: they need no re-read)."""
        gens = await self.kv.kv_scan(META_NS, GENERATIONS)
        return tuple(sorted(g for g in gens if g[0] != self.generation_key))

    async def bindings_changed(self) -> None:
        """Write a new generation: the other proxies re-read the bindings (Registry.sync_bindings)."""
        await self.kv.kv_put(META_NS, self.generation_key, secrets.token_bytes(12))

    async def generation_owners(self) -> list[tuple[str, str | None]]:
        """(key, owner) of every proxy's generation but this one's (None: no owner in the key, as
        in the one generation of older versions)."""
        out: list[tuple[str, str | None]] = []
        for key, _ in await self.kv.kv_scan(META_NS, GENERATIONS):
            if key != self.generation_key:
                rest = key[len(GENERATIONS) + 1 :]
                out.append((key, rest.rsplit("/", 1)[0] if "/" in rest else None))
        return out

    async def delete_generation(self, key: str | None = None) -> None:
        """Delete a generation (this proxy's when None)."""
        await self.kv.kv_delete(META_NS, key or self.generation_key)
