"""MQTT 3.1 / 3.1.1 / 5.0 adapter: `MqttAdapter` (server.py) over the sans-IO codec (codec/), a
per-connection session state machine (session.py), the shared broker state (broker.py, composed of
registry.py, subscriptions.py, shared.py, fanout.py, retained.py, publish.py) and the MQTT <-> store
message mapping (mapping.py). See docs/mqtt.md."""

from .caps import MqttCaps
from .server import MqttAdapter

__all__ = ["MqttAdapter", "MqttCaps"]
