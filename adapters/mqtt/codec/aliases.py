"""Server-to-client topic aliases (MQTT 5.0, 3.3.2.3.4): one table per connection, sans-IO.

A 5.0 client announces in CONNECT how many aliases it accepts (Topic Alias Maximum; 0 or absent:
none). The first PUBLISH on a topic carries the topic and a new alias; later ones carry an empty
topic and the alias alone. When every alias is taken, the least recently used one is reassigned to
the new topic (sent with the topic again, which rebinds it at the client, 3.3.2-12): a client with a
small maximum then still saves the topic bytes on the topics it receives most. The table is small
(at most 65535 entries) and kept in recency order by a dict (pop and reinsert on use), which needs
no library.
"""

from __future__ import annotations


class OutboundAliases:
    """The topic aliases this server has given one client, least recently used first."""

    __slots__ = ("maximum", "_by_topic", "_free", "_next")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum  # the client's Topic Alias Maximum (> 0)
        self._by_topic: dict[str, int] = {}
        self._free: list[int] = []  # numbers given back by `forget`
        self._next = 1  # the lowest number never used

    def assign(self, topic: str) -> tuple[int, bool]:
        """The alias for `topic` and whether the client already knows it (then send an empty topic
        name); a new alias reuses the least recently used one's number when the table is full."""
        table = self._by_topic
        alias = table.pop(topic, 0)
        if alias:
            table[topic] = alias
            return alias, True
        if self._free:
            alias = self._free.pop()
        elif self._next <= self.maximum:
            alias = self._next
            self._next += 1
        else:
            alias = table.pop(next(iter(table)))
        table[topic] = alias
        return alias, False

    def forget(self, topic: str) -> None:
        """Undo a new assignment whose PUBLISH was not sent (the client never learnt it)."""
        alias = self._by_topic.pop(topic, 0)
        if alias:
            self._free.append(alias)

    def __len__(self) -> int:
        return len(self._by_topic)
