"""The subscription index of all persistent sessions (adapters/mqtt/session_routing.py)."""

from __future__ import annotations

import os

from adapters.mqtt.mapping import P_CLIENT, to_message
from adapters.mqtt.session_routing import SessionIndex
from adapters.mqtt.subscription import make_sub

SESSIONS = int(os.environ.get("MQTT_INDEX_SESSIONS", "10000"))


def subs(*filters: str, nl: bool = False):
    return [make_sub(None, f, 1, False, nl) for f in filters]


def test_a_path_goes_only_to_the_sessions_whose_filters_match_it():
    idx = SessionIndex()
    for i in range(SESSIONS):
        idx.update(f"c{i}", subs(f"dev/{i}/cmd"))
    idx.update("fleet", subs("dev/+/telemetry"))
    assert len(idx) == SESSIONS + 1
    assert idx.sessions_for("dev/7/cmd") == {"c7"}
    assert idx.sessions_for("dev/7/telemetry") == {"fleet"}
    assert idx.sessions_for("dev/7/cmd/extra") == set()
    assert idx.sessions_for("other/7/cmd") == set()


def test_root_wildcards_match_every_path_but_system_ones():
    idx = SessionIndex()
    idx.update("all", subs("#"))
    idx.update("second", subs("+/state"))
    assert idx.sessions_for("a/state") == {"all", "second"}
    assert idx.sessions_for("$SYS/state") == set()


def test_changing_and_dropping_a_sessions_filters():
    idx = SessionIndex()
    idx.update("c", subs("a/#", "b/1"))
    idx.update("c", subs("b/1", "c/+"))  # a/# unsubscribed, c/+ subscribed
    assert idx.sessions_for("a/x") == set()
    assert idx.sessions_for("b/1") == {"c"}
    assert idx.sessions_for("c/2") == {"c"}
    idx.update("c", [])
    assert len(idx) == 0 and idx.sessions_for("b/1") == set()
    idx.update("d", subs("b/1"))
    idx.drop("d")
    idx.drop("never-indexed")
    assert idx.sessions_for("b/1") == set()


def test_shared_subscriptions_are_not_indexed():
    idx = SessionIndex()
    idx.update("c", subs("$share/g/a/b"))
    assert len(idx) == 0 and idx.sessions_for("a/b") == set()


def test_no_local_leaves_out_the_sessions_own_messages_only():
    idx = SessionIndex()
    idx.update("me", subs("chat/#", nl=True))
    idx.update("you", subs("chat/#"))
    assert idx.sessions_for("chat/1", publisher="me") == {"you"}
    assert idx.sessions_for("chat/1", publisher="you") == {"me", "you"}
    idx.update("me", subs("chat/#"))  # the same filter without No Local
    assert idx.sessions_for("chat/1", publisher="me") == {"me", "you"}


def test_a_stored_message_is_matched_by_its_mqtt_path_and_publisher():
    idx = SessionIndex()
    idx.update("me", subs("dev/1/cmd", nl=True))
    idx.update("you", subs("dev/1/cmd"))
    m = to_message("dev/1/cmd", b"on", 1, False, None)
    assert idx.sessions_for_message(m) == {"me", "you"}
    m.properties[P_CLIENT] = "me"
    assert idx.sessions_for_message(m) == {"you"}
