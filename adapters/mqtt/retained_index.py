"""The retained messages' index: every retained path, in a trie over its levels, with where its
record is in the compacted topic `%MQTT_RETAINED%` (queue, offset), its size, store time and
expiry; never the body.

A subscription's filter walks the trie (a literal level: one child; `+`: every child; `#`: every
path below), so finding the retained messages of `dev/+/state` costs the paths it visits, not
every path the server holds; the records found are then read from the store by position
(retained.py). The index is built at start from the topic's records and kept in step by reading
the records appended since (`apply` in offset order per queue): a value sets or replaces its
path, an empty one (the tombstone) clears it. Compaction keeps a path's latest record at its queue
offset, so positions stay valid across compactions and restarts.

A path's records are all in one queue (the store routes a compacted topic's records by key), but
after the topic gains queues an older record may sit in another one: the newest by store time
wins, as in the store's own `latest`.
"""

from __future__ import annotations

from collections.abc import Iterator

# An entry: where a retained path's record is, and what deciding on it without reading it needs.
# A plain tuple of ints (not a NamedTuple): the collector does not track it, nor a node holding
# only such tuples, so a million indexed paths add next to nothing to a full garbage collection.
Entry = tuple[int, int, int, int, int]  # (queue, offset, payload bytes, store time ms, expiry epoch ms or 0)
QUEUE, OFFSET, SIZE, TS, EXPIRY_AT = range(5)


def entry(queue: int, offset: int, size: int, ts: int, expiry_at: int) -> Entry:
    """An index entry (size 0: a tombstone, which clears its path)."""
    return (queue, offset, size, ts, expiry_at)


# A node is a dict: level -> child, where a child is either a node (levels below it exist) or the
# Entry of a path that ends there and has nothing below (most paths: the leaf costs no dict).
# A node whose own path is also retained holds that Entry under the key NUL, which no topic
# level can be (MQTT forbids U+0000 in topic names).
_SELF = "\x00"
_Node = dict  # dict[str, "_Node | Entry"]


class RetainedIndex:
    """Retained path -> Entry, matched by topic filter."""

    __slots__ = ("_root", "_count", "total_bytes")

    def __init__(self) -> None:
        self._root: _Node = {}
        self._count = 0
        self.total_bytes = 0  # payload bytes of every indexed path

    def __len__(self) -> int:
        return self._count

    # ------------------------------------------------------------------ updates
    def get(self, path: str) -> Entry | None:
        node: _Node | Entry = self._root
        for level in path.split("/"):
            if not isinstance(node, dict):
                return None
            node = node.get(level)  # type: ignore[assignment]
            if node is None:
                return None
        if isinstance(node, dict):
            return node.get(_SELF)
        return node

    def apply(self, path: str, entry: Entry) -> None:
        """A record of `path` read from the topic: a value (size > 0) sets the path unless a newer
        record (by store time, from another queue) is indexed; a tombstone (size 0) clears it."""
        old = self.get(path)
        if old is not None and old[QUEUE] != entry[QUEUE] and old[TS] > entry[TS]:
            return  # an older record of another queue (the topic gained queues since)
        if entry[SIZE]:
            self._set(path, entry, old)
        elif old is not None:
            self._remove(path, old)

    def _set(self, path: str, entry: Entry, old: Entry | None) -> None:
        levels = path.split("/")
        node = self._root
        for level in levels[:-1]:
            child = node.get(level)
            if child is None:
                child = node[level] = {}
            elif not isinstance(child, dict):
                child = node[level] = {_SELF: child}  # a leaf that now has paths below it
            node = child
        last = levels[-1]
        here = node.get(last)
        if isinstance(here, dict):
            here[_SELF] = entry
        else:
            node[last] = entry
        if old is None:
            self._count += 1
        else:
            self.total_bytes -= old[SIZE]
        self.total_bytes += entry[SIZE]

    def _remove(self, path: str, old: Entry) -> None:
        levels = path.split("/")
        trail: list[tuple[_Node, str]] = []
        node = self._root
        for level in levels[:-1]:
            trail.append((node, level))
            node = node[level]
        last = levels[-1]
        here = node[last]
        if isinstance(here, dict):
            del here[_SELF]
            if not here:
                del node[last]
        else:
            del node[last]
        while trail and not node:  # prune emptied inner nodes
            parent, level = trail.pop()
            del parent[level]
            node = parent
        self._count -= 1
        self.total_bytes -= old[SIZE]

    # ------------------------------------------------------------------ matching
    def match(self, filt: str) -> Iterator[tuple[str, Entry]]:
        """(path, entry) of every indexed path that `filt` (a valid, non-shared filter) matches;
        a filter whose first level is a wildcard skips `$` paths (MQTT 4.7.2)."""
        levels = filt.split("/")
        n = len(levels)
        stack: list[tuple[_Node | Entry, int, str]] = [(self._root, 0, "")]
        while stack:
            node, i, prefix = stack.pop()
            if i == n:
                e = node.get(_SELF) if isinstance(node, dict) else node
                if e is not None:
                    yield prefix, e
                continue
            if not isinstance(node, dict):
                if levels[i] == "#" and i == n - 1:
                    yield prefix, node  # `a/#` matches `a` itself
                continue
            level = levels[i]
            sep = "/" if i else ""
            if level == "#":
                if i and _SELF in node:
                    yield prefix, node[_SELF]  # the parent level itself
                yield from _below(node, prefix, sep, skip_dollar=i == 0)
            elif level == "+":
                for name, child in node.items():
                    if name == _SELF or (i == 0 and name[:1] == "$"):
                        continue
                    stack.append((child, i + 1, prefix + sep + name))
            else:
                child = node.get(level)
                if child is not None:
                    stack.append((child, i + 1, prefix + sep + level))


def _below(node: _Node, prefix: str, sep: str, skip_dollar: bool) -> Iterator[tuple[str, Entry]]:
    """Every path strictly below `node` (whose path is `prefix`)."""
    stack: list[tuple[_Node | Entry, str]] = []
    for name, child in node.items():
        if name == _SELF or (skip_dollar and name[:1] == "$"):
            continue
        stack.append((child, prefix + sep + name))
    while stack:
        child, path = stack.pop()
        if isinstance(child, dict):
            for name, sub in child.items():
                if name == _SELF:
                    yield path, sub
                else:
                    stack.append((sub, path + "/" + name))
        else:
            yield path, child
