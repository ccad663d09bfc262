"""An exchange's routing tables (routing.py): a bind adds to them as they are (no rebuild from every
binding), an unbind rebuilds them; after any sequence of binds and unbinds they are what a rebuild
from the bindings gives, and every match is the reference match over the bindings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import encode_table
from adapters.amqp.routing import Binding, Exchange, headers_match, topic_matches

KEYS = ["a", "b", "a.b", "a.*", "#", "b.#"]
DESTS = ["q1", "q2", "q3"]
ARGS = [{}, {"x-match": "any", "h": "1"}, {"x-match": "all", "h": "1", "g": "2"}]

ops = st.lists(
    st.tuples(
        st.booleans(),  # bind (True) or unbind
        st.sampled_from(KEYS),
        st.sampled_from(DESTS + ["exchange"]),
        st.integers(0, len(ARGS) - 1),
    ),
    max_size=30,
)


def reference(ex: Exchange, rk: str, headers: dict[str, str]) -> set[object]:
    """The destinations of a message by the bindings alone."""
    out: set[object] = set()
    for b in ex.bindings.values():
        if ex.type == "headers":
            mode = str(b.args.get("x-match", "all"))
            want = {k: v for k, v in b.args.items() if not k.startswith("x-")}
            hit = headers_match(mode.startswith("any"), want, headers)
        else:
            hit = {
                "fanout": True,
                "direct": b.routing_key == rk,
                "topic": topic_matches(b.routing_key.split("."), rk.split(".")),
            }[ex.type]
        if hit:
            out.add(b.dest)
    return out


@given(kind=st.sampled_from(["direct", "fanout", "topic", "headers"]), steps=ops)
@settings(max_examples=300, deadline=None)
def test_tables_after_binds_and_unbinds_are_a_rebuild_and_match_the_bindings(kind, steps) -> None:
    ex = Exchange("/", "x", kind)
    other = Exchange("/", "e2", "fanout")
    watched: list[int | None] = []
    ex.watch = watched.append
    added = 0
    for bind, rk, dest, a in steps:
        target = other if dest == "exchange" else dest
        key = f"{rk}|{dest}|{a}"
        if bind:
            added += ex.bind(Binding(ex, target, rk, dict(ARGS[a]), key), made_at=7)
        else:
            ex.unbind(key)
        direct, headers, queues_only = dict(ex._direct), list(ex._headers), ex.queues_only
        ex._rebuild()
        assert (direct, headers, queues_only) == (ex._direct, ex._headers, ex.queues_only)
        for rk2 in KEYS:
            for hs in ({}, {"h": "1"}, {"h": "1", "g": "2"}):
                raw = _properties_with_headers(hs)
                assert set(ex.match(rk2, raw)) == reference(ex, rk2, hs)
    assert watched.count(7) == added  # each new binding is reported with the time it was made


def _properties_with_headers(headers: dict[str, str]) -> bytes:
    """Raw basic content properties holding only `headers` (flag bit 13)."""
    return (1 << 13).to_bytes(2, "big") + encode_table(headers)
