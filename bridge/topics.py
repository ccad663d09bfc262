"""Topic filters, prefix remapping and the topic <-> routing key rule: pure functions.

A message's name inside a bridge is its MQTT topic; an AMQP routing key is the same string with
`/` and `.` swapped (RabbitMQ's MQTT plugin and the gateway's `amq.topic` do the same). A rule
(`[[bridge.topic]]`) is Mosquitto's bridge `topic` line: the source subscribes to
`from_prefix + filter`, and a message `from_prefix + rest` is written as `to_prefix + rest`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicRule:
    filter: str = "#"
    qos: int = 1  # the subscription's QoS (MQTT source)
    from_prefix: str = ""
    to_prefix: str = ""

    @property
    def subscription(self) -> str:
        return self.from_prefix + self.filter


def check_filter(flt: str) -> None:
    """ValueError unless `flt` is a valid MQTT topic filter."""
    if not flt:
        raise ValueError("empty topic filter")
    levels = flt.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"'#' must be a whole last level in filter {flt!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must be a whole level in filter {flt!r}")


def matches(flt: str, topic: str) -> bool:
    """MQTT filter matching (`+` one level, `#` the rest, zero levels included)."""
    f_levels, t_levels = flt.split("/"), topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return not (i == 0 and topic.startswith("$"))
        if i >= len(t_levels):
            return False
        if f == "+":
            if i == 0 and t_levels[0].startswith("$"):
                return False
            continue
        if f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


def remap(rules: tuple[TopicRule, ...], topic: str) -> str | None:
    """The destination topic of `topic` by the first rule whose prefix and filter match; `topic`
    unchanged when there are no rules; None when rules exist and none matches (not forwarded)."""
    if not rules:
        return topic
    for r in rules:
        if topic.startswith(r.from_prefix) and matches(r.filter, topic[len(r.from_prefix) :]):
            return r.to_prefix + topic[len(r.from_prefix) :]
    return None


_SWAP = str.maketrans("/.", "./")


def to_routing_key(topic: str) -> str:
    """`a/b.c` -> `a.b/c` (`/` and `.` swapped, as RabbitMQ's MQTT plugin does)."""
    return topic.translate(_SWAP)


def from_routing_key(key: str) -> str:
    return key.translate(_SWAP)
