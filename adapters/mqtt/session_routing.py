"""Which persistent sessions a message goes to: the subscription index of all persistent sessions,
online or offline, and the dispatch rule built on it (issue 48 item 1; docs/mqtt.md "Persistent
sessions at scale").

One `TopicTrie` over the non-shared filters of every persistent session maps a published path to
the sessions whose filters match it, at a cost that depends on the trie's depth and on what
matches, not on how many sessions there are. It is the rule "which sessions get this message" of
the multi-dispatch design: the MQTT adapter hands `sessions_for` to the processor's neutral
dispatch hook, which names the session queues a message goes to. Shared subscriptions are not in
it (a share delivers to one member: shared.py); a No Local subscription leaves out the session's
own messages (`mqtt.client_id`, mapping.py).

`SessionRoutes` is that rule wired in: it holds the index and each session's queue (its own store
topic, `%SQ%<group>`), and its `dispatch` is the MQTT adapter's dispatcher on the processor
(messaging_processor/dispatch.py), so every send, of every protocol, also stores a message in the
queues of the sessions it matches, in the same write. A session reads only its queue (fanout.py).
In one process the registry sees every persistent session and keeps the index whole; under
`--workers` each worker also applies the others' changes from the feed (session_feed.py). CLUSTER
mode's stores take one topic per write, so there sessions get no queue and read their store topics
as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from messaging_processor import Message

from .codec import TopicTrie
from .mapping import P_CLIENT, P_TOPIC, path_of

if TYPE_CHECKING:
    from .persistence import SessionState
    from .subscription import Sub

SESSION_QUEUE_PREFIX = "%SQ%"


def session_queue(group: str) -> str:
    """The store topic of the persistent session whose consumer group is `group`."""
    return SESSION_QUEUE_PREFIX + group


# (client id, no local): one trie item per (session, filter); the flag travels with the item so a
# match needs no second lookup
_Item = tuple[str, bool]


class SessionIndex:
    """Which persistent sessions a path is for: `update` a session's filters whenever they change
    (SUBSCRIBE, UNSUBSCRIBE, restore at start), `drop` it when it ends, `sessions_for` a path."""

    __slots__ = ("_trie", "_filters")

    def __init__(self) -> None:
        self._trie: TopicTrie[_Item] = TopicTrie()
        self._filters: dict[str, dict[str, bool]] = {}  # client id -> its filters -> no local

    def __len__(self) -> int:
        """Sessions indexed (those with at least one non-shared subscription)."""
        return len(self._filters)

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._filters

    def update(self, client_id: str, subs: Iterable[Sub]) -> None:
        """Make `subs` the session's subscriptions in the index (shared ones are left out)."""
        want = {s.filter: s.nl for s in subs if s.share is None}
        have = self._filters.get(client_id, {})
        trie = self._trie
        for f, nl in have.items():
            if want.get(f) != nl:
                trie.discard(f, (client_id, nl))
        for f, nl in want.items():
            if have.get(f) != nl:
                trie.add(f, (client_id, nl))
        if want:
            self._filters[client_id] = want
        else:
            self._filters.pop(client_id, None)

    def drop(self, client_id: str) -> None:
        """The session ended (expired, discarded, Clean Start): it matches nothing any more."""
        for f, nl in self._filters.pop(client_id, {}).items():
            self._trie.discard(f, (client_id, nl))

    def sessions_for(self, path: str, publisher: str | None = None) -> set[str]:
        """The client ids of the sessions a message on `path` goes to (`publisher`: the client id
        of an MQTT publisher with a No Local subscription, if any)."""
        out: set[str] = set()
        for cid, nl in self._trie.match(path):
            if not (nl and cid == publisher):
                out.add(cid)
        return out

    def sessions_for_message(self, msg: Message) -> set[str]:
        """`sessions_for` of a stored message (its MQTT path, or the one another protocol's message
        is presented under)."""
        return self.sessions_for(path_of(msg), msg.properties.get(P_CLIENT))


class SessionRoutes:
    """The index of the sessions that have a queue, and the dispatcher that names their queues."""

    __slots__ = ("index", "queues", "feed")

    def __init__(self) -> None:
        self.index = SessionIndex()
        self.queues: dict[str, str] = {}  # client id -> its queue (sessions with one)
        # tells the other proxies of a change (session_feed.py; --workers), or None (one process)
        self.feed: Callable[[SessionState, bool], Awaitable[None]] | None = None

    def __len__(self) -> int:
        return len(self.queues)

    def update(self, st: SessionState) -> None:
        """The session's subscriptions changed (or it was restored): index them."""
        if st.queue is not None:
            self.set(st.client_id, st.queue, st.subs.values())

    def set(self, client_id: str, queue: str, subs: Iterable[Sub]) -> None:
        """Index a session's queue and subscriptions (none: it ended)."""
        self.queues[client_id] = queue
        self.index.update(client_id, subs)
        if client_id not in self.index:  # (no non-shared filter: nothing goes to it)
            self.queues.pop(client_id, None)

    async def changed(self, st: SessionState, ended: bool = False) -> None:
        """A session's filters changed or it `ended`: index that here and tell the other proxies."""
        if st.queue is None:
            return
        if ended:
            self.drop(st.client_id)
        else:
            self.update(st)
        if self.feed is not None:
            await self.feed(st, ended)

    def drop(self, client_id: str) -> None:
        """The session ended: nothing more goes to its queue."""
        self.queues.pop(client_id, None)
        self.index.drop(client_id)

    def dispatch_paths(self, path: str) -> list[str]:
        """The queues a message on MQTT `path` goes to (what `dispatch` names; for tests, tools)."""
        return [self.queues[c] for c in self.index.sessions_for(path) if c in self.queues]

    def dispatch(self, msg: Message) -> list[str]:
        """The queues a message about to be stored also goes to (the processor's dispatcher)."""
        if not self.index or msg.topic[0] == "%":  # (none indexed; the gateway's own topics)
            return []
        props = msg.properties
        path = props.get(P_TOPIC) or (f"{msg.topic}/{msg.tag}" if msg.tag else msg.topic)
        queues = self.queues
        return [queues[c] for c in self.index.sessions_for(path, props.get(P_CLIENT)) if c in queues]


__all__ = ["SESSION_QUEUE_PREFIX", "SessionIndex", "SessionRoutes", "session_queue"]
