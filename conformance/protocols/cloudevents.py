"""HTTP / CloudEvents scenarios (CloudEvents 1.0.2 over the gateway's HTTP port), run with the
CloudEvents Python SDK (``cloudevents`` 2.2.0) and httpx 0.28 as client ``cloudevents``.

The script is conformance/clients/python/cloudevents_scenarios.py; the test vectors it sends are
conformance/vectors/cloudevents-json.json (JSON event format: valid / invalid events and batches,
covering the cases of the language-neutral set of github.com/cloudevents/conformance) and
cloudevents-http-binary.json (binary content mode of the HTTP binding). Topics are created by the
runner; consumer groups of the pull API are created on first use.
"""

from __future__ import annotations

from pathlib import Path

from conformance.runner import Names, Scenario

CLIENTS = ("cloudevents",)
VECTORS = Path(__file__).resolve().parent.parent / "vectors"
MIB = 1024 * 1024
MAX_BODY = 4 * MIB  # the gateway's default max_body_size
REQUEST_LIMIT = -(-MAX_BODY * 4 // 3) + 64 * 1024  # adapters/cloudevents/ingest.py request_limit()
MAX_BATCH = 1024


def _params(extra: dict | None = None):
    def build(names: Names) -> dict:
        return {
            "vectors_dir": str(VECTORS),
            "missing_topic": names.topic("missing"),
            "request_limit": REQUEST_LIMIT,
            "max_batch": MAX_BATCH,
            **(extra or {}),
        }

    return build


_scenarios = [
    Scenario(
        "json_format_vectors",
        "JSON format test vectors: 16 valid events + 5 valid batches stored (202) and pulled back "
        "unchanged; 32 invalid events (alone and in a batch), 3 invalid batches, 6 invalid bodies "
        "refused with 400/415 problem+json naming the attribute / index, nothing of them stored",
        CLIENTS,
        topics={"main": {}},
        groups={"main": {}},
        params=_params(),
        timeout=60,
    ),
    Scenario(
        "binary_binding",
        "binary mode vectors: percent-encoding, quoted strings, Content-Type as datacontenttype, "
        "extensions as strings (9 valid, 14 invalid -> 400); 405 + Allow, OPTIONS handshake, 404 "
        "unknown topic, 413 request and batch limits",
        CLIENTS,
        topics={"main": {}},
        groups={"main": {}},
        params=_params(),
        timeout=60,
    ),
    Scenario(
        "sdk_roundtrip",
        "events written by the SDK in binary, structured and batch mode (JSON, text and binary data, "
        "typed extensions) are read back by the SDK from the pull API identical; structured pop / 204",
        CLIENTS,
        topics={"main": {}},
        groups={"main": {}},
        params=_params(),
        timeout=45,
    ),
    Scenario(
        "pull",
        "pop with receipt handles, ack (an invalid handle reported per handle), nack with "
        "invisible_time_ms 0 redelivers, long polling returns an event published while waiting",
        CLIENTS,
        topics={"main": {}},
        groups={"main": {}},
        params=_params(),
        timeout=45,
    ),
    Scenario(
        "push_webhook",
        "push subscription to an SDK-reading webhook: OPTIONS handshake, binary deliveries with "
        "WebHook-Request-Origin, 503 retried after the linear back-off, 400 dead-lettered with "
        "knativeerror* extensions, a reply event ingested (knativebrokerttl 254) and delivered",
        CLIENTS,
        topics={"main": {}},
        params=_params(),
        timeout=60,
    ),
    Scenario(
        "cross_protocol",
        "MQTT 5 publishes (Paho) pulled over HTTP as valid CloudEvents with the synthesized attributes; "
        "an event POSTed over HTTP reaches an MQTT subscriber as its data, at QoS 1",
        CLIENTS,
        topics={"sensors": {}, "orders": {}},
        groups={"sensors": {}},
        params=_params(),
        timeout=45,
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _scenarios}

__all__ = ["CLIENTS", "SCENARIOS"]
