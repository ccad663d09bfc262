"""Topic names, topic filters, shared subscriptions and matching (MQTT 3.1.1 4.7, 5.0 4.7 and 4.8.2).

Pure functions, no I/O:

- `validate_topic_name(name)`: a PUBLISH topic: non-empty, no `+` or `#`, no U+0000, at most
  65535 UTF-8 bytes.
- `validate_topic_filter(filter)`: `#` only as the whole last level, `+` only as a whole level,
  `$share/<ShareName>/<filter>` with a non-empty ShareName free of `/`, `+`, `#` and a valid,
  non-empty inner filter.
- `parse_shared(filter)`: `(share_name, inner_filter)` for a shared subscription, None otherwise.
- `topic_matches(filter, topic)`: one filter against one topic. A filter whose first level is a
  wildcard does not match a topic beginning with `$` (5.0 4.7.2, 3.1.1 [MQTT-4.7.2-1]).
- `TopicTrie`: many filters, one topic: a trie over levels, with `+` and `#` children, so a match
  costs a walk down the topic's levels instead of a scan of all filters.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

SHARE_PREFIX = "$share/"


def validate_topic_name(name: str) -> bool:
    if not name or "+" in name or "#" in name or "\x00" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= 0xFFFF
    except UnicodeEncodeError:  # lone surrogate
        return False


def _filter_levels_ok(filt: str) -> bool:
    if "+" not in filt and "#" not in filt:
        return True
    levels = filt.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#" or i != last:
                return False
        elif "+" in level and level != "+":
            return False
    return True


def validate_topic_filter(filt: str, allow_shared: bool = True) -> bool:
    if not filt or "\x00" in filt:
        return False
    try:
        if len(filt.encode("utf-8")) > 0xFFFF:
            return False
    except UnicodeEncodeError:
        return False
    if filt.startswith(SHARE_PREFIX):
        if not allow_shared:
            return False
        try:
            parse_shared(filt)
        except ValueError:
            return False
        return True
    return _filter_levels_ok(filt)


def parse_shared(filt: str) -> tuple[str, str] | None:
    """Split `$share/<name>/<filter>` into (name, filter); None if `filt` is not a shared filter.

    Raises ValueError if it starts with `$share/` but is not a valid shared subscription."""
    if not filt.startswith(SHARE_PREFIX):
        return None
    name, sep, inner = filt[len(SHARE_PREFIX) :].partition("/")
    if not name or "+" in name or "#" in name:
        raise ValueError(f"invalid share name in {filt!r}")
    if not sep or not inner:
        raise ValueError(f"shared subscription {filt!r} has no topic filter")
    if not _filter_levels_ok(inner):
        raise ValueError(f"invalid topic filter in {filt!r}")
    return name, inner


def topic_matches(filt: str, topic: str) -> bool:
    """Does topic filter `filt` match topic name `topic`? A shared filter matches by its inner filter."""
    if filt.startswith(SHARE_PREFIX):
        shared = parse_shared(filt)
        assert shared is not None
        filt = shared[1]
    if "+" not in filt and "#" not in filt:
        return filt == topic
    if topic[:1] == "$" and filt[0] in "+#":
        return False
    f = filt.split("/")
    t = topic.split("/")
    nt = len(t)
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= nt or (level != "+" and level != t[i]):
            return False
    return len(f) == nt


T = TypeVar("T", bound=Hashable)


_NONE: Mapping[Any, Any] = MappingProxyType({})


class _Node:
    __slots__ = ("children", "plus", "hash", "items")

    def __init__(self) -> None:
        # both stay the shared read-only `_NONE` until written (a leaf has no children, an inner
        # node of `dev/<i>/cmd` no items: ~128 B less per subscription)
        self.children: Mapping[str, _Node] = _NONE
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.items: Mapping[Hashable, None] = _NONE  # an insertion-ordered set

    def empty(self) -> bool:
        return not self.items and not self.children and self.plus is None and self.hash is None


class TopicTrie(Generic[T]):
    """A set of (topic filter, item) pairs matched against topic names.

    `add("a/+/c", item)`, `discard("a/+/c", item)`, `match("a/b/c") -> [items]` (an item appears once
    per filter of its that matches). Items are any hashable values (e.g. a client id, or a
    (client id, subscription) tuple). Shared subscriptions are the caller's business: pass the inner
    filter from `parse_shared` and keep the group in the item; a `$share/...` filter is refused.
    """

    __slots__ = ("_root", "_count")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _path(self, filt: str) -> list[str]:
        if filt.startswith(SHARE_PREFIX):
            raise ValueError("add the inner filter of a shared subscription (see parse_shared)")
        if not validate_topic_filter(filt, allow_shared=False):
            raise ValueError(f"invalid topic filter {filt!r}")
        return filt.split("/")

    def add(self, filt: str, item: T) -> bool:
        """Add the pair; False if it was already there."""
        node = self._root
        for level in self._path(filt):
            if level == "+":
                nxt = node.plus
                if nxt is None:
                    nxt = node.plus = _Node()
            elif level == "#":
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = _Node()
            else:
                nxt = node.children.get(level)
                if nxt is None:
                    if node.children is _NONE:
                        node.children = {}
                    # one string for a level many filters share (`cmd` of every `dev/<i>/cmd`)
                    nxt = node.children[sys.intern(level)] = _Node()  # type: ignore[index]
            node = nxt
        if item in node.items:
            return False
        if node.items is _NONE:
            node.items = {}
        node.items[item] = None  # type: ignore[index]
        self._count += 1
        return True

    def discard(self, filt: str, item: T) -> bool:
        """Remove the pair; False if it was not there. Empty branches are pruned."""
        node = self._root
        trail: list[tuple[_Node, str]] = []
        for level in self._path(filt):
            if level == "+":
                nxt = node.plus
            elif level == "#":
                nxt = node.hash
            else:
                nxt = node.children.get(level)
            if nxt is None:
                return False
            trail.append((node, level))
            node = nxt
        if item not in node.items:
            return False
        del node.items[item]  # type: ignore[attr-defined]
        if not node.items:
            node.items = _NONE
        self._count -= 1
        while trail and node.empty():
            parent, level = trail.pop()
            if level == "+":
                parent.plus = None
            elif level == "#":
                parent.hash = None
            else:
                del parent.children[level]  # type: ignore[attr-defined]
                if not parent.children:
                    parent.children = _NONE
            node = parent
        return True

    def match(self, topic: str) -> list[T]:
        """Items of every filter matching `topic` (wildcards skip `$` topics at the first level)."""
        levels = topic.split("/")
        n = len(levels)
        out: list[T] = []
        root = self._root
        if topic[:1] == "$":
            first = root.children.get(levels[0])
            if first is None:
                return out
            stack = [(first, 1)]
        else:
            stack = [(root, 0)]
        while stack:
            node, i = stack.pop()
            h = node.hash
            if h is not None:
                out.extend(h.items)  # type: ignore[arg-type]
            if i == n:
                if node.items:
                    out.extend(node.items)  # type: ignore[arg-type]
                continue
            c = node.children.get(levels[i])
            if c is not None:
                stack.append((c, i + 1))
            p = node.plus
            if p is not None:
                stack.append((p, i + 1))
        return out

    def __iter__(self) -> Iterator[tuple[str, T]]:
        """All (filter, item) pairs."""
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            for item in node.items:
                yield "/".join(path), item  # type: ignore[misc]
            if node.hash is not None:
                stack.append((node.hash, [*path, "#"]))
            if node.plus is not None:
                stack.append((node.plus, [*path, "+"]))
            for level, child in node.children.items():
                stack.append((child, [*path, level]))
