"""What a consumer wants from a topic: `Filter` (tags and/or a predicate over the message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .message import Message, tag_hash


@dataclass(slots=True, frozen=True)
class Filter:
    """What a consumer wants: tags (None = all) and/or a predicate over the decoded message.

    `skip`, with a predicate: called with a consume queue entry's hash (`message.entry_hash`: the
    tag's, else the path's), True passes the entry over unread. It is the consumer's own memory of
    what its predicate rejected (e.g. paths no binding matches) and must agree with the predicate.
    """

    tags: frozenset[str] | None = None
    predicate: Callable[[Message], bool] | None = None
    skip: Callable[[int], bool] | None = field(default=None, compare=False)
    # derived: the consume queue tag hashes it accepts (None: any), to skip entries unread; and
    # whether it takes every message (then nobody needs to call `matches`)
    hashes: frozenset[int] | None = field(init=False, repr=False, compare=False)
    takes_all: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hashes = None if self.tags is None else frozenset(tag_hash(t) for t in self.tags)
        object.__setattr__(self, "hashes", hashes)
        object.__setattr__(self, "takes_all", self.tags is None and self.predicate is None)
        if self.skip is not None and self.predicate is None:
            raise ValueError("skip needs a predicate")

    @classmethod
    def from_expression(cls, expr: str | None) -> Filter:
        """RocketMQ tag expression: `*`, empty, or `TagA || TagB`."""
        if not expr or expr.strip() == "*":
            return ALL
        return cls(tags=frozenset(t.strip() for t in expr.split("||") if t.strip()))

    def matches(self, msg: Message) -> bool:
        if self.tags is not None and msg.tag not in self.tags:
            return False
        return self.predicate is None or self.predicate(msg)


ALL = Filter()
