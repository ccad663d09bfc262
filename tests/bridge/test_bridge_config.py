"""The pure parts of bridges: `[[bridge]]` parsing (in the gateway's TOML and in `gateway bridge`'s
file), topic filters and prefix remapping, the routing key rule, the link's backoff and lag."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from bridge.config import parse_bridge, parse_bridges, resolve
from bridge.link import LinkState
from bridge.topics import TopicRule, from_routing_key, matches, remap, to_routing_key
from gateway.config import load
from runtime import ConfigError

MQTT = {"url": "mqtt://far.example:1884"}
GW = {"url": "gateway:mqtt"}


def test_endpoint_urls_and_defaults(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("from-file\nignored\n")
    b = parse_bridge(
        {
            "name": "a",
            "from": {"url": "mqtts://u:p%40ss@far.example", "password_file": str(pw), "ca_file": "ca.pem"},
            "to": {"url": "amqps://h/vh", "exchange": "x", "routing_key": "k"},
            "topic": ["s/#"],
        }
    )
    src, dst = b.source, b.sink
    assert (src.protocol, src.host, src.port, src.tls, src.username) == (
        "mqtt",
        "far.example",
        8883,
        True,
        "u",
    )
    assert src.password() == "from-file"  # the file wins over the URL, first line only
    assert (dst.protocol, dst.port, dst.tls, dst.vhost, dst.exchange, dst.routing_key) == (
        "amqp",
        5671,
        True,
        "vh",
        "x",
        "k",
    )
    assert dst.password() is None and dst.mandatory and b.inflight == 100
    assert "p@ss" not in repr(src)  # the URL's password is not in the repr


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "a", "from": MQTT, "to": GW}, "needs at least one"),
        ({"name": "a", "from": {"url": "http://x"}, "to": GW, "topic": ["#"]}, "url must be"),
        (
            {"name": "a", "from": {"url": "gateway:grpc"}, "to": MQTT, "topic": ["#"]},
            "gateway:mqtt or gateway:amqp",
        ),
        ({"name": "a", "from": {"url": "amqp://h"}, "to": GW}, "needs a queue"),
        ({"name": "a", "from": MQTT, "to": GW, "topic": [{"filter": "a/#/b"}]}, "'#' must be"),
        ({"name": "a", "from": MQTT, "to": GW, "topic": ["#"], "bogus": 1}, "unknown key"),
        ({"name": "a", "from": MQTT | {"queue": "q"}, "to": GW, "topic": ["#"]}, "not for mqtt endpoints"),
        ({"name": "a", "from": MQTT, "to": MQTT | {"qos": 2}, "topic": ["#"]}, "qos must be"),
        ({"name": "a", "from": GW, "to": {"url": "gateway:amqp"}, "topic": ["#"]}, "another broker"),
        ({"name": "a b", "from": MQTT, "to": GW, "topic": ["#"]}, "name must be"),
        (
            {"name": "a", "from": {"url": "mqtt://h", "ca_file": "x"}, "to": GW, "topic": ["#"]},
            "need an mqtts",
        ),
    ],
)
def test_bad_entries_are_refused(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_bridge(raw)


def test_names_unique_and_password_file_unreadable(tmp_path):
    entry = {"name": "a", "from": MQTT, "to": GW, "topic": ["#"]}
    with pytest.raises(ConfigError, match="unique"):
        parse_bridges([entry, entry])
    b = parse_bridge(entry | {"from": MQTT | {"password_file": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match="cannot read password_file"):
        b.source.password()


def test_resolve_gateway_endpoints():
    b = parse_bridge({"name": "a", "from": MQTT, "to": GW, "topic": ["#"]})
    r = resolve(b, "127.0.0.1", {"mqtt": 11883})
    assert (r.sink.host, r.sink.port, r.source.port) == ("127.0.0.1", 11883, 1884)
    with pytest.raises(ConfigError, match="no mqtt listener"):
        resolve(b, "127.0.0.1", {"amqp": 5672})


def test_gateway_toml_takes_bridge_tables(tmp_path):
    toml = tmp_path / "gw.toml"
    toml.write_text(
        'mqtt_port = 1999\n[[bridge]]\nname = "up"\nfrom = { url = "gateway:mqtt" }\n'
        'to = { url = "amqp://cloud:5672", exchange = "amq.topic" }\n[[bridge.topic]]\nfilter = "t/#"\n'
    )
    s = load(toml_path=toml)
    assert s.mqtt_port == 1999 and [b.name for b in s.bridge] == ["up"]
    assert s.bridge[0].rules == (TopicRule("t/#"),)
    toml.write_text('[[bridge]]\nname = "up"\nfrom = { url = "gateway:mqtt" }\n')
    with pytest.raises(ConfigError, match="table with a url"):
        load(toml_path=toml)


def test_bridge_command_refuses_a_bad_file(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text("mqtt_port = 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bridge", "--config", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "only [[bridge]] entries" in r.stderr


def test_filters_and_remap():
    assert matches("a/+/c", "a/b/c") and not matches("a/+/c", "a/b/d")
    assert matches("a/#", "a") and matches("a/#", "a/b/c") and not matches("#", "$SYS/x")
    rules = (TopicRule("sensors/#", 1, "site1/", "plant/"), TopicRule("#", 1, "", "other/"))
    assert remap(rules, "site1/sensors/t") == "plant/sensors/t"
    assert remap(rules, "x/y") == "other/x/y"  # the first matching rule wins
    assert remap((TopicRule("a/#"),), "b") is None and remap((), "b") == "b"
    assert to_routing_key("a/b.c") == "a.b/c" and from_routing_key("a.b/c") == "a/b.c"


def test_backoff_is_exponential_jittered_and_capped():
    st = LinkState("l", "s", "d", reconnect_min_s=0.1, reconnect_max_s=1.0)
    rng = random.Random(7)
    delays = [st.failed("x", float(i), rng) for i in range(8)]
    for i, d in enumerate(delays):
        top = min(1.0, 0.1 * 2**i)
        assert top / 2 <= d <= top
    st.connected(100.0)
    assert st.failed("y", 100.0 + st.healthy_s, rng) <= 0.1  # a healthy connection resets it


def test_lag_and_counters():
    st = LinkState("l", "s", "d")
    st.connected(0.0)
    for t in (1.0, 2.0, 3.0):
        st.on_received(t, redelivered=t == 3.0)
    st.source_backlog = 10
    assert (st.inflight, st.lag_messages, st.lag_seconds(5.0)) == (3, 13, 4.0)
    st.on_forwarded(5.0)
    st.on_forwarded(5.0, dropped=True)
    snap = st.snapshot(6.0)
    assert (snap["forwarded"], snap["dropped"], snap["redelivered"], snap["lag_seconds"]) == (1, 1, 1, 3.0)
    st.failed("gone", 7.0)
    assert st.inflight == 0 and st.state == "backoff" and st.last_error == "gone"
