"""Topic names, filters, shared subscriptions, matching and the subscription trie."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.mqtt.codec import (
    TopicTrie,
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

# (filter, topic, matches) — the examples of spec 3.1.1 4.7.1 / 5.0 4.7.1 and the `$` rules of 4.7.2.
MATCH_TABLE = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+", "sport", True),
    ("+", "/sport", False),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/tennis", True),
    ("sport/+/player1", "sport/tennis/player1", True),
    ("sport/+/player1", "sport//player1", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a/b", "A/b", False),  # case sensitive
    ("a//b", "a//b", True),
    ("+/+/+", "a/b", False),
    ("a/#", "a", True),
    ("a/#", "ab", False),
    ("a/+/#", "a", False),
    ("a/+/#", "a/x", True),
    ("ü/+", "ü/€", True),
    # `$` topics: not matched by a wildcard at the first level (4.7.2)
    ("#", "$SYS/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS", "$SYS", True),
    ("a/$b/#", "a/$b/c", True),
    ("a/+", "a/$b", True),  # `$` matters only at the first level
    ("#", "a$", True),
    # shared subscriptions match by their inner filter
    ("$share/g/sport/#", "sport/tennis", True),
    ("$share/g/+", "x", True),
    ("$share/g/#", "$SYS/x", False),
]


@pytest.mark.parametrize(("filt", "topic", "expected"), MATCH_TABLE)
def test_topic_matches_table(filt: str, topic: str, expected: bool) -> None:
    assert topic_matches(filt, topic) is expected


@pytest.mark.parametrize(("filt", "topic", "expected"), MATCH_TABLE)
def test_trie_agrees_with_table(filt: str, topic: str, expected: bool) -> None:
    trie: TopicTrie[str] = TopicTrie()
    shared = parse_shared(filt)
    trie.add(shared[1] if shared else filt, "sub")
    assert (trie.match(topic) == ["sub"]) is expected


@pytest.mark.parametrize("name", ["a", "a/b", "/", "//", "a b", "$SYS/x", "ü€𝄞", "a" * 65535, "\x01control"])
def test_valid_topic_names(name: str) -> None:
    assert validate_topic_name(name)


@pytest.mark.parametrize("name", ["", "a/+", "#", "a#", "a\x00b", "\ud800", "é" * 40000])
def test_invalid_topic_names(name: str) -> None:
    assert not validate_topic_name(name)


VALID_FILTERS = [
    *("#", "+", "a/#", "a/+/b", "+/+", "/", "/#", "+/#", "$SYS/#", "a//b"),
    *("$share/g/#", "$share/g/a/+", "$share/group-1/$SYS/#", "$share"),
]
INVALID_FILTERS = [
    *("", "a/#/b", "a#", "#a", "a/b#", "a+", "+a", "a/+b/c", "##", "++", "a\x00"),
    *("$share/", "$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/g#/a", "$share/g/a#"),
]


@pytest.mark.parametrize("filt", VALID_FILTERS)
def test_valid_filters(filt: str) -> None:
    assert validate_topic_filter(filt)


@pytest.mark.parametrize("filt", INVALID_FILTERS)
def test_invalid_filters(filt: str) -> None:
    assert not validate_topic_filter(filt)


def test_parse_shared() -> None:
    assert parse_shared("a/b") is None
    assert parse_shared("$share") is None
    assert parse_shared("$sharex/a") is None
    assert parse_shared("$share/g/a/b") == ("g", "a/b")
    assert parse_shared("$share/g//") == ("g", "/")
    assert parse_shared("$share/consumers/$SYS/#") == ("consumers", "$SYS/#")
    for bad in (
        "$share/",
        "$share/g",
        "$share/g/",
        "$share//a",
        "$share/+/a",
        "$share/a#/b",
        "$share/g/a/#/x",
    ):
        with pytest.raises(ValueError):
            parse_shared(bad)
    assert not validate_topic_filter("$share/g/a", allow_shared=False)


def test_trie_many_filters() -> None:
    trie: TopicTrie[tuple[str, int]] = TopicTrie()
    filters = ["a/b/c", "a/+/c", "a/#", "#", "+/b/+", "a/b/c/#", "x/y", "$SYS/#", "+/+/+", "a/b"]
    for i, f in enumerate(filters):
        assert trie.add(f, (f, i))
    assert not trie.add("a/#", ("a/#", 2))  # already there
    assert len(trie) == len(filters)
    for topic in ["a/b/c", "a/b", "a", "x/y", "$SYS/up", "q/b/r", "a/b/c/d", "", "/", "a//c"]:
        got = sorted(f for f, _ in trie.match(topic))
        want = sorted(f for f in filters if topic_matches(f, topic))
        assert got == want, topic
    assert sorted(trie) == sorted((f, (f, i)) for i, f in enumerate(filters))


def test_trie_several_items_per_filter_and_discard() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/+", "c1")
    trie.add("a/+", "c2")
    trie.add("a/b", "c1")
    assert sorted(trie.match("a/b")) == ["c1", "c1", "c2"]  # c1 once per matching filter
    assert trie.discard("a/+", "c1")
    assert not trie.discard("a/+", "c1")
    assert not trie.discard("never/added", "c1")
    assert sorted(trie.match("a/b")) == ["c1", "c2"]
    assert trie.discard("a/+", "c2") and trie.discard("a/b", "c1")
    assert len(trie) == 0 and trie.match("a/b") == []
    assert trie._root.empty()  # pruned back to an empty root


def test_trie_rejects_invalid_and_shared_filters() -> None:
    trie: TopicTrie[str] = TopicTrie()
    with pytest.raises(ValueError):
        trie.add("a/#/b", "x")
    with pytest.raises(ValueError):
        trie.add("$share/g/a", "x")


_level = st.sampled_from(["a", "b", "", "$x", "c"])
_topic = st.lists(_level, min_size=1, max_size=4).map("/".join)
_filter_level = st.sampled_from(["a", "b", "", "$x", "+"])


@st.composite
def _filters(draw) -> str:
    levels = draw(st.lists(_filter_level, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "+"


@given(st.lists(_filters(), max_size=20), st.lists(_topic, min_size=1, max_size=10))
def test_trie_equals_linear_scan(filters: list[str], topics: list[str]) -> None:
    trie: TopicTrie[str] = TopicTrie()
    for f in filters:
        trie.add(f, f)
    for t in topics:
        assert sorted(trie.match(t)) == sorted({f for f in filters if topic_matches(f, t)})


@given(_filters(), _topic)
def test_matches_against_a_regex_model(filt: str, topic: str) -> None:
    """An independent model: translate the filter to a regular expression."""
    import re

    parts = filt.split("/")
    if parts[-1] == "#":
        head = parts[:-1]
        pattern = "/".join("[^/]*" if p == "+" else re.escape(p) for p in head)
        rx = "(?:/.*)?" if not head else pattern + "(?:/.*)?"
        rx = ".*" if not head else rx
    else:
        rx = "/".join("[^/]*" if p == "+" else re.escape(p) for p in parts)
    expected = re.fullmatch(rx, topic, re.S) is not None
    if topic.startswith("$") and filt[0] in "+#":
        expected = False
    assert topic_matches(filt, topic) is expected
