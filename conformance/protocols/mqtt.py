"""MQTT 3.1.1 / 5.0 scenarios, run with three independent client implementations: Eclipse Paho
Python (``paho``), MQTT.js (``mqttjs``) and the Debian ``mosquitto_pub`` / ``mosquitto_sub`` tools
(``mosquitto``, libmosquitto, driven by a Python script).

Scripts: conformance/clients/python/paho_scenarios.py, conformance/clients/node/mqttjs_scenarios.js,
conformance/clients/mosquitto/scenarios.py. Every MQTT topic a scenario uses starts with the run's
unique prefix (``config["prefix"]``, e.g. ``cf081502ab12-qosv5-paho``), so the scenarios of one run,
of concurrent jobs and of earlier runs never see each other's messages (root wildcard subscribers
filter by it). A scenario named ``<name>_v311`` / ``<name>_v5`` runs with that protocol version
(``params["version"]`` 4 / 5).
"""

from __future__ import annotations

from conformance.runner import Scenario

CLIENTS = ("paho", "mqttjs", "mosquitto")
V311, V5 = 4, 5
VERSIONS = {V311: "v311", V5: "v5"}
# Negative checks ("X must not arrive") wait this long after the positive ones were met.
QUIET_S = 0.5


def _both(name: str, summary: str, v5: str = "", *, timeout: float = 30, **params) -> list[Scenario]:
    """The scenario in MQTT 3.1.1 and in 5.0 (two rows); ``v5`` names what 5.0 checks on top."""
    return [
        Scenario(
            f"{name}_{tag}",
            f"[{'5.0' if v == V5 else '3.1.1'}] {summary}" + (f"; {v5}" if v == V5 and v5 else ""),
            CLIENTS,
            params={"version": v, "quiet_s": QUIET_S, **params},
            timeout=timeout,
        )
        for v, tag in VERSIONS.items()
    ]


_scenarios = [
    *_both(
        "connect",
        "CONNACK 0 / session present 0, empty client id accepted, round trip, a second connection with "
        "the same client id takes over, normal DISCONNECT",
        "Assigned Client Identifier, takeover DISCONNECT 0x8E",
    ),
    *_both(
        "qos",
        "QoS 0/1/2 publish -> subscribe: granted QoS, every payload once and in order (binary, empty, "
        "64 KiB), delivered QoS = min(publish, subscription) both ways",
        count=10,
    ),
    *_both(
        "retained",
        "retained message delivered on subscribe with retain 1, live copy with retain 0, an empty "
        "retained publish is delivered and clears it",
        "retain handling 2, retain as published",
    ),
    *_both(
        "wildcards",
        "'+' and '#' filters ('a/#' matches 'a'); '#' and '+/a/temp' do not match '$' topics, '$x/#' does",
    ),
    *_both(
        "will",
        "will published once on an abnormal disconnect (socket / process killed), not on a normal DISCONNECT",
        "will published on DISCONNECT 0x04",
    ),
    *_both(
        "shared",
        "$share/<group>/<filter>: two members split QoS 1 messages (none twice, none lost, both get "
        "some); a plain subscriber still gets all",
        count=20,
    ),
    Scenario(
        "properties_v5",
        "[5.0] request/response: user properties (order, repeats, UTF-8), content type, payload "
        "format, message expiry, response topic + correlation data round trip",
        CLIENTS,
        params={"version": V5, "quiet_s": QUIET_S},
        timeout=30,
    ),
    Scenario(
        "cross_protocol",
        "[3.1.1 + 5.0] MQTT publish to <sensors>/devN/temp -> RocketMQ 5 SimpleConsumer on topic "
        "<sensors> (mqtt.* properties); RocketMQ Producer -> MQTT subscribers of <orders>/# get "
        "<orders>/<tag> and <orders> (no tag) at QoS 1",
        CLIENTS,
        topics={"sensors": {}, "orders": {}},
        groups={"sensors": {}},
        params={"quiet_s": QUIET_S},
        timeout=60,
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _scenarios}

__all__ = ["CLIENTS", "SCENARIOS"]
