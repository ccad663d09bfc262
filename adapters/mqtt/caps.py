"""Per-listener MQTT caps (docs/limits.md "MQTT"): client id length, topic length and levels,
retained messages (count and bytes) and offline session backlog, with the checks that answer
them with MQTT's own reason codes (0x85 client identifier not valid, 0x90 / 0x8F topic name /
filter invalid, 0x97 quota exceeded)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MqttCaps:
    max_client_id_length: int = 65535  # bytes of a client id (the MQTT spec's own bound)
    max_topic_length: int = 65535  # bytes of a topic name or filter
    max_topic_levels: int = 128  # '/'-separated levels of a topic name or filter (EMQX's default)
    max_retained_messages: int = 0  # retained messages kept (0: no cap)
    max_retained_bytes: int = 0  # bytes of retained payloads kept (0: no cap)
    max_queued_messages: int = 0  # offline session backlog per session (0: no cap; offline_queue.py)
    max_queued_bytes: int = 0  # the same in payload bytes (0: no cap)
    queue_full_policy: str = "drop-oldest"  # or "refuse-new" (keep the oldest)

    def client_id_ok(self, client_id: str) -> bool:
        n = len(client_id)
        return n <= self.max_client_id_length and (
            n * 4 <= self.max_client_id_length or len(client_id.encode()) <= self.max_client_id_length
        )

    def topic_ok(self, topic: str) -> bool:
        """Whether a topic name or filter is within the length and level caps."""
        n = len(topic)
        if n > self.max_topic_length or topic.count("/") >= self.max_topic_levels:
            return False
        return n * 4 <= self.max_topic_length or len(topic.encode()) <= self.max_topic_length


DEFAULT_CAPS = MqttCaps()
