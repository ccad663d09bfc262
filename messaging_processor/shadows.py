"""Device shadows: one JSON document per (compacted topic T, key K) holding a device's `reported`
and `desired` state, updated by RFC 7396 JSON merge patches with a version that grows by one per
update (docs/shadows.md).

The document is the latest record of key K in T (so it survives restarts and compaction, and
CLUSTER proxies all read the same one):

    {"state": {"reported": {...}, "desired": {...}}, "version": n, "timestamp": ms}

stored with property `shadow.version` and path (`mqtt.topic`) `T/K/shadow`, so MQTT subscribers of
`T/K/shadow` receive every new document. A change of `desired` is also sent to path
`T/K/shadow/desired` (the whole desired state, not a delta: compaction keeps only the latest record
per path, so each one must stand alone). Devices reach the service over MQTT through
`device_request` (`T/K/shadow/update`, `T/K/shadow/get`), HTTP clients through gateway/http/shadows.py.

Writers of one (T, K) are serialized by an asyncio.Lock per key in this process: in CLUSTER mode
two proxies may interleave (docs/shadows.md). The merge patch is hand-written: RFC 7396 is ten lines
and the libraries that offer it (json-merge-patch, jsonmerge) would be a dependency for them."""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from store import Message

from .errors import ErrorKind, ProcessorError
from .model import Action, ClientContext, Identity, Resource
from .processor import MessagingProcessor
from .properties import P_PATH

P_VERSION = "shadow.version"
SECTIONS = ("desired", "reported")
MAX_KEY_LENGTH = 128
SHADOW_IDENTITY = Identity("$shadows", mechanism="internal")
_CTX = ClientContext("shadow", client_id="$shadows", identity=SHADOW_IDENTITY)
_NEGATIVE_TTL = 5.0  # seconds a "not a compacted topic" answer is remembered (MQTT publish path)


class ShadowError(Exception):
    """A shadow request refused; `kind` names why (also the problem+json `kind`)."""

    kind = "shadow_error"

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.kind


class NoShadowTopic(ShadowError):
    """The topic does not exist (`exists` False) or is not compacted."""

    kind = "not_a_shadow_topic"

    def __init__(self, message: str, exists: bool) -> None:
        super().__init__(message)
        self.exists = exists


class ShadowNotFound(ShadowError):
    kind = "shadow_not_found"


class InvalidShadowRequest(ShadowError):
    kind = "invalid_shadow_request"


class NotAShadow(ShadowError):
    """Key K of T holds a record that is not a shadow document (written by some other producer)."""

    kind = "not_a_shadow"


class VersionConflict(ShadowError):
    """The expected version is not the current one (`current`: 0 when there is no shadow)."""

    kind = "version_conflict"

    def __init__(self, message: str, current: int) -> None:
        super().__init__(message)
        self.current = current


@dataclass(frozen=True, slots=True)
class Shadow:
    topic: str
    key: str
    state: dict[str, Any]
    version: int
    timestamp: int

    def document(self) -> dict[str, Any]:
        """The JSON document (what GET answers and the store holds)."""
        return {"state": self.state, "version": self.version, "timestamp": self.timestamp}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: `patch` applied to `target` (neither is modified); null members delete."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def check_key(key: str) -> None:
    """A shadow key is one MQTT topic level: not empty, no `/`, `+`, `#`, whitespace or control."""
    if (
        not key
        or len(key) > MAX_KEY_LENGTH
        or any(c in "/+#" or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key)
    ):
        raise InvalidShadowRequest(
            f"illegal shadow key {key[:MAX_KEY_LENGTH]!r}: 1..{MAX_KEY_LENGTH} characters, "
            "no '/', '+', '#', whitespace or control characters"
        )


def parse_update(body: Any) -> tuple[dict[str, Any], int | None]:
    """(state merge patch, expected version or None) of an update body
    `{"state": {"desired": {...}|null, "reported": {...}|null}, "version": n}` (bytes or parsed)."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):
            raise InvalidShadowRequest("the update is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidShadowRequest("the update must be a JSON object")
    extra = set(body) - {"state", "version"}
    if extra:
        raise InvalidShadowRequest(f"unknown update members {sorted(extra)}: use state and version")
    state = body.get("state")
    if not isinstance(state, dict) or not state:
        raise InvalidShadowRequest('the update needs "state": {"desired": ..., "reported": ...}')
    for name, v in state.items():
        if name not in SECTIONS:
            raise InvalidShadowRequest(f'unknown state section {name!r}: use "desired" and "reported"')
        if v is not None and not isinstance(v, dict):
            raise InvalidShadowRequest(f"state.{name} must be an object or null")
    version = body.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise InvalidShadowRequest("version must be a non-negative integer")
    return state, version


def _json(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


_services: weakref.WeakKeyDictionary[MessagingProcessor, ShadowService] = weakref.WeakKeyDictionary()


class ShadowService:
    """Shadows over one processor. Use `for_processor` so that the HTTP port and the MQTT adapter
    share one instance (and its per-key locks)."""

    def __init__(self, processor: MessagingProcessor) -> None:
        self.processor = processor
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._compacted: set[str] = set()
        self._not_compacted: dict[str, float] = {}  # topic -> monotonic time of the answer

    @classmethod
    def for_processor(cls, processor: MessagingProcessor) -> ShadowService:
        """The one service of `processor` (made on first use)."""
        s = _services.get(processor)
        if s is None:
            s = _services[processor] = cls(processor)
        return s

    # ------------------------------------------------------------------ reads
    async def get(self, ctx: ClientContext, topic: str, key: str) -> Shadow:
        """The shadow of (topic, key); ShadowNotFound when there is none."""
        await self._check(ctx, topic, key, Action.SUBSCRIBE, "shadow")
        shadow = await self._load(topic, key)
        if shadow is None:
            raise ShadowNotFound(f"no shadow {key!r} in topic {topic}")
        return shadow

    async def list(self, ctx: ClientContext, topic: str) -> list[Shadow]:
        """Every shadow of `topic` that `ctx` may read, by key."""
        await self._check_topic(topic)
        out = []
        for m in await self.processor.latest_items(topic):
            if P_VERSION not in m.properties or not m.keys:
                continue  # desired notifications, device messages: other records of the topic
            try:
                await self.processor.authorize(
                    ctx.identity, Action.SUBSCRIBE, Resource("topic", f"{topic}/{m.keys[0]}/shadow")
                )
                out.append(_decode(topic, m.keys[0], m))
            except (ProcessorError, NotAShadow):
                continue
        return out

    # ------------------------------------------------------------------ writes
    async def update(
        self,
        ctx: ClientContext,
        topic: str,
        key: str,
        patch: Any,
        expected_version: int | None = None,
    ) -> Shadow:
        """Merge `patch` (`{"state": {...}, "version": n}`, parsed or bytes) into the shadow's
        state; version + 1 (1 for a new shadow). `expected_version` (or the patch's `version`)
        must be the current version (0: the shadow must not exist), else VersionConflict. A change
        of `desired` is sent to `T/K/shadow/desired`. Returns the new shadow."""
        await self._check(ctx, topic, key, Action.PUBLISH, "shadow/update")
        state_patch, body_version = parse_update(patch)
        if body_version is not None and expected_version is not None and body_version != expected_version:
            raise InvalidShadowRequest("the body's version and the expected version differ")
        expected = expected_version if expected_version is not None else body_version
        async with self._lock(topic, key):
            current = await self._load(topic, key)
            version = current.version if current else 0
            if expected is not None and expected != version:
                raise VersionConflict(
                    f"shadow {key!r} is at version {version}, not {expected}", current=version
                )
            old_state = current.state if current else {}
            new = Shadow(topic, key, merge_patch(old_state, state_patch), version + 1, _now_ms())
            doc_path = f"{topic}/{key}/shadow"
            msgs = [
                Message(
                    topic,
                    _json(new.document()),
                    keys=(key,),
                    properties={P_VERSION: str(new.version), P_PATH: doc_path},
                )  # the store keeps a key's records in one queue (store/compaction.py)
            ]
            if new.state.get("desired") != old_state.get("desired"):
                desired = {"state": new.state.get("desired", {}), "version": new.version}
                desired["timestamp"] = new.timestamp
                msgs.append(self._notice(topic, f"{doc_path}/desired", desired))
            await self._send(topic, msgs)
        return new

    async def delete(
        self, ctx: ClientContext, topic: str, key: str, expected_version: int | None = None
    ) -> None:
        """Delete the shadow (a tombstone of key K, also sent to path `T/K/shadow` with an empty
        body). A later update starts again at version 1."""
        await self._check(ctx, topic, key, Action.PUBLISH, "shadow/update")
        async with self._lock(topic, key):
            current = await self._load(topic, key, foreign_ok=True)
            if current is None:
                raise ShadowNotFound(f"no shadow {key!r} in topic {topic}")
            if expected_version is not None and expected_version != current.version:
                raise VersionConflict(
                    f"shadow {key!r} is at version {current.version}, not {expected_version}",
                    current=current.version,
                )
            tomb = Message(topic, b"", keys=(key,), properties={P_PATH: f"{topic}/{key}/shadow"})
            await self._send(topic, [tomb])

    # ------------------------------------------------------------------ MQTT devices
    async def is_shadow_topic(self, topic: str) -> bool:
        """Whether `topic` is a compacted topic (remembered; a "no" for a few seconds)."""
        if topic in self._compacted:
            return True
        seen = self._not_compacted.get(topic)
        if seen is not None and time.monotonic() - seen < _NEGATIVE_TTL:
            return False
        try:
            await self._check_topic(topic)
        except NoShadowTopic:
            if len(self._not_compacted) > 10_000:
                self._not_compacted.clear()
            self._not_compacted[topic] = time.monotonic()
            return False
        return True

    async def device_request(self, ctx: ClientContext, topic: str, path: str, body: bytes) -> bool:
        """Serve an MQTT PUBLISH to `T/K/shadow/update` (body: an update) or `T/K/shadow/get`
        (body ignored) when T (`topic`, the store topic) is compacted: answers go to
        `.../get/accepted` (the document) or `.../<op>/rejected` (`{"code", "kind", "message"}`);
        an accepted update is the new document on `T/K/shadow`. False: not a shadow request (store
        the PUBLISH as usual). Raises the ShadowError (after the rejected answer) or ProcessorError."""
        parts = path.split("/")
        if len(parts) != 4 or parts[2] != "shadow" or parts[3] not in ("update", "get") or parts[0] != topic:
            return False
        if not await self.is_shadow_topic(topic):
            return False
        key, op = parts[1], parts[3]
        base = f"{topic}/{key}/shadow/{op}"
        try:
            if op == "update":
                await self.update(ctx, topic, key, body)
            else:
                shadow = await self.get(ctx, topic, key)
                await self._send(topic, [self._notice(topic, f"{base}/accepted", shadow.document())])
        except ShadowError as e:
            reply: dict[str, Any] = {"code": status_of(e), "kind": e.kind, "message": e.message}
            if isinstance(e, VersionConflict):
                reply["version"] = e.current
            await self._send(topic, [self._notice(topic, f"{base}/rejected", reply)])
            raise
        return True

    # ------------------------------------------------------------------ internals
    async def _check(self, ctx: ClientContext, topic: str, key: str, action: Action, suffix: str) -> None:
        """The caller may `action` path `T/K/<suffix>` (first: nothing is answered to those who may
        not), the key is legal, the topic compacted."""
        await self.processor.authorize(ctx.identity, action, Resource("topic", f"{topic}/{key}/{suffix}"))
        check_key(key)
        await self._check_topic(topic)

    async def _check_topic(self, topic: str) -> None:
        if topic in self._compacted:
            return
        t = await self.processor.store.get_topic(topic)
        if t is None:
            raise NoShadowTopic(f"topic {topic} does not exist", exists=False)
        if not t.compacted:
            raise NoShadowTopic(
                f"topic {topic} is not compacted: shadows need a compacted topic", exists=True
            )
        self._compacted.add(topic)
        self._not_compacted.pop(topic, None)

    async def _load(self, topic: str, key: str, foreign_ok: bool = False) -> Shadow | None:
        m = await self.processor.latest(topic, key)
        if m is None:
            return None
        if foreign_ok and P_VERSION not in m.properties:
            return Shadow(topic, key, {}, 0, m.store_timestamp)
        return _decode(topic, key, m)

    async def _send(self, topic: str, msgs: list[Message]) -> None:
        try:
            await self.processor.send(_CTX, msgs, auto_create=False, receipts=False)
        except ProcessorError as e:
            if e.kind is ErrorKind.TOPIC_NOT_FOUND:  # deleted meanwhile: forget what we knew
                self._compacted.discard(topic)
            raise

    @staticmethod
    def _notice(topic: str, path: str, doc: Mapping[str, Any]) -> Message:
        """A message to MQTT path `path` (no key: its compaction key, and so its queue, is the path)."""
        return Message(topic, _json(doc), properties={P_PATH: path})

    def _lock(self, topic: str, key: str) -> _KeyLock:
        return _KeyLock(self._locks, (topic, key))


class _KeyLock:
    """An asyncio.Lock per key, dropped when nobody holds or waits for it."""

    def __init__(self, locks: dict[tuple[str, str], tuple[asyncio.Lock, int]], key: tuple[str, str]) -> None:
        self.locks = locks
        self.key = key

    async def __aenter__(self) -> None:
        lock, users = self.locks.get(self.key) or (asyncio.Lock(), 0)
        self.locks[self.key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.locks[self.key][0].release()
        self._release_user()

    def _release_user(self) -> None:
        lock, users = self.locks[self.key]
        if users <= 1:
            del self.locks[self.key]
        else:
            self.locks[self.key] = (lock, users - 1)


def _decode(topic: str, key: str, m: Message) -> Shadow:
    if P_VERSION not in m.properties:
        raise NotAShadow(f"key {key!r} of topic {topic} holds a record that is not a shadow document")
    try:
        doc = json.loads(m.body)
        return Shadow(topic, key, doc["state"], int(doc["version"]), int(doc["timestamp"]))
    except (ValueError, KeyError, TypeError):
        raise NotAShadow(f"the shadow document of key {key!r} of topic {topic} is unreadable") from None


def status_of(e: ShadowError) -> int:
    """The HTTP status that goes with a ShadowError (also the `code` of MQTT rejected answers)."""
    if isinstance(e, NoShadowTopic):
        return 404 if not e.exists else 409
    return {ShadowNotFound: 404, InvalidShadowRequest: 400, VersionConflict: 409, NotAShadow: 409}.get(
        type(e), 400
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
