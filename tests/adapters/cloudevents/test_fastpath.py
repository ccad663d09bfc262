"""The ingest hot path's shortcuts give the same verdicts and results as the full code they skip:
`check_attributes` (shortcut for common valid events) against `full_check`, the fast RFC 3339 path
of `check_time` against the regular-expression check, `dump_json` against the stdlib encoder, and
`to_message` without `ce._data` for JSON data of a JSON media type against the event it came from."""

from __future__ import annotations

import json
import random
import re

import pytest

from adapters.cloudevents import codec
from adapters.cloudevents.event import Event, dump_json
from adapters.cloudevents.mapping import P_DATA, from_message, to_message
from adapters.cloudevents.validate import _days, check_attributes, check_media_type, check_time, full_check

MIN = {"specversion": "1.0", "id": "e-1", "source": "/src", "type": "io.example.t"}

# Values that probe each shortcut's edge: control characters (C0, DEL, C1), Unicode whitespace and
# other non-printable characters, the ASCII space, empty strings, non-strings.
STRINGS = [
    "x",
    "a b",
    "",
    " ",
    "tab\there",
    "nl\n",
    "del\x7f",
    "c1\x85",
    "c1\x9f",
    "nbsp\xa0",
    "ls\u2028",
    "shy\xad",
    "zwsp\u200b",
    "ünïcödé",
    "emoji\U0001f600",
    "%41",
    "https://example.com/a b",
]
OTHERS = [None, 0, 1, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, True, False, 1.5, {"a": 1}, ["x"]]
TIMES = [
    "2018-04-05T17:31:00Z",
    "2018-04-05t17:31:00z",
    "2018-04-05T17:31:00.123456789Z",
    "2018-04-05T17:31:60Z",
    "2018-04-05T17:31:61Z",
    "2018-04-05T24:00:00Z",
    "2018-04-05T23:60:00Z",
    "2018-02-29T00:00:00Z",
    "2024-02-29T00:00:00Z",
    "2018-04-31T00:00:00Z",
    "2018-13-01T00:00:00Z",
    "2018-00-01T00:00:00Z",
    "2018-04-00T00:00:00Z",
    "0000-01-01T00:00:00Z",
    "2018-04-05T17:31:00+23:59",
    "2018-04-05T17:31:00+24:00",
    "2018-04-05T17:31:00-05:60",
    "2018-04-05T17:31:00+05",
    "2018-04-05T17:31:00+0500",
    "2018-04-05 17:31:00Z",
    "2018-04-05T17:31Z",
    "20180405T173100Z",
    "2018-04-05T17:31:00,5Z",
    "2018-04-05T17:31:00.Z",
    "2018-04-05T17:31:00",
    "２０１８-04-05T17:31:00Z",
    "2018-W14-4T17:31:00Z",
]
MEDIA = ["application/json", "text/plain; charset=utf-8", 'a/b; c="d e"', "xyz", "", "a/b;", "text/plain "]


def _reference_time(value: str) -> bool:
    """The RFC 3339 rule written out independently (the regular expression + calendar)."""
    m = re.fullmatch(
        r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|([+-])(\d{2}):(\d{2}))",
        value,
        re.ASCII,
    )
    if not m:
        return False
    y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
    if not 1 <= mo <= 12 or not 1 <= d <= _days(y, mo) or h > 23 or mi > 59 or s > 60:
        return False
    return m.group(9) is None or (int(m.group(10)) <= 23 and int(m.group(11)) <= 59)


@pytest.mark.parametrize("value", TIMES)
def test_check_time_fast_path_agrees_with_the_rule(value):
    assert (check_time(value) is None) == _reference_time(value)


def test_check_time_agrees_with_the_rule_once_dates_are_known_valid():
    # A date that passed the full check once takes a shortcut after: every time of day and offset
    # on it must still get the rule's verdict.
    clocks = [
        f"T{h}:{m}:{s}{frac}{tz}"
        for h in ("00", "09", "19", "23", "24", "29", "7")
        for m, s in (("00", "00"), ("59", "59"), ("60", "00"), ("00", "60"), ("00", "61"), ("5", "00"))
        for frac in ("", ".5", ".", ".123456789")
        for tz in ("Z", "z", "+23:59", "+24:00", "-00:60", "-19:30", "+05", "")
    ]
    dates = ["2018-04-05", "2024-02-29", "2018-02-29", "2018-04-31"]
    values = [*TIMES, "2018-04-05T17:31:00Z\n", "2018-04-05t17:31:00Z"]
    values += [d + c for d in dates for c in clocks]
    for _ in range(2):  # the second pass finds every valid date remembered
        for value in values:
            assert (check_time(value) is None) == _reference_time(value), value


def test_a_trailing_newline_is_not_part_of_a_valid_value():
    # Python's `$` also matches before a final newline; the checks anchor at the very end.
    from adapters.cloudevents.models import duration_ms
    from adapters.cloudevents.validate import check_name

    assert check_time("2018-04-05T17:31:00Z\n") is not None
    assert check_time("2018-04-05T17:31:00.5+01:00\n") is not None
    assert check_media_type("application/json\n") is not None
    assert check_name("ext\n") is not None and check_name("ext") is None
    with pytest.raises(ValueError):
        duration_ms("PT1S\n")
    assert duration_ms("PT1S") == 1000


def _random_attrs(rng: random.Random) -> dict:
    attrs = dict(MIN)
    for name in rng.sample(["id", "source", "type", "specversion"], rng.randint(0, 2)):
        choice = rng.random()
        if choice < 0.15:
            del attrs[name]
        elif choice < 0.8:
            attrs[name] = rng.choice(STRINGS)
        else:
            attrs[name] = rng.choice(OTHERS)
    for name in rng.sample(["subject", "time", "datacontenttype", "dataschema"], rng.randint(0, 4)):
        pool = {"time": TIMES, "datacontenttype": MEDIA}.get(name, STRINGS)
        attrs[name] = rng.choice(pool) if rng.random() < 0.85 else rng.choice(OTHERS[1:])
    for _ in range(rng.randint(0, 3)):
        name = rng.choice(["ext", "ext2", "Ext", "my-ext", "data", "data_base64", "x1", "é"])
        attrs[name] = rng.choice(STRINGS + OTHERS[1:])
    return attrs


def test_check_attributes_shortcut_agrees_with_the_full_check():
    rng = random.Random(20240501)
    accepted = 0
    for _ in range(20_000):
        attrs = _random_attrs(rng)
        fast, full = check_attributes(attrs), full_check(attrs)
        assert fast == full, attrs
        accepted += not full
    assert 500 < accepted < 19_500  # both verdicts were exercised


def test_dump_json_matches_the_stdlib_encoder():
    enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    rng = random.Random(7)
    atoms = [
        0,
        -1,
        2**70,
        1.5,
        1e300,
        float("nan"),
        float("inf"),
        True,
        False,
        None,
        "",
        'é\u2028"\\\x00',
        "x" * 50,
    ]
    for _ in range(2000):
        value = rng.choice(atoms)
        for _ in range(rng.randint(0, 3)):
            value = (
                {rng.choice("abc"): value, "k": rng.choice(atoms)}
                if rng.random() < 0.5
                else [value, rng.choice(atoms)]
            )
        assert dump_json(value) == enc.encode(value).encode()


@pytest.mark.parametrize(
    ("obj", "marked"),
    [
        ({**MIN, "data": {"a": [1, "é"]}}, False),
        ({**MIN, "datacontenttype": "application/json", "data": "text"}, False),
        ({**MIN, "datacontenttype": "application/vnd.x+json; charset=utf-8", "data": 5}, False),
        ({**MIN, "datacontenttype": "text/plain", "data": {"a": 1}}, True),  # JSON data, non-JSON type
        ({**MIN, "datacontenttype": "text/plain", "data": "hello"}, True),
        ({**MIN, "datacontenttype": "application/json", "data_base64": "AAE="}, True),
        ({**MIN, "data": ""}, False),
        ({**MIN, "data": 0}, False),
    ],
)
def test_json_data_mark_is_kept_only_where_the_media_type_does_not_say_it(obj, marked):
    (ev,) = codec.decode([("content-type", codec.STRUCTURED)], json.dumps(obj).encode())
    msg = to_message("t", ev)
    assert (P_DATA in msg.properties) is marked
    back = from_message(msg)
    assert (
        back.to_json()
        == Event(ev.attributes, ev.data, ev.data_form).to_json()
        == {
            **{k: v for k, v in obj.items()},
        }
    )


def test_batch_data_keeps_its_json_value_on_both_parsers():
    """Batches are parsed by orjson unless they hold long digit runs (orjson would turn integers
    beyond 64 bits into floats) or something only the stdlib accepts: the data is the same JSON value
    either way, big integers exact."""
    rng = random.Random(3)
    datas = [
        {"big": 2**70, "neg": -(2**65)},
        {"f": [rng.uniform(-1e-9, 1e-9) for _ in range(20)], "e": 2.5e-7, "s": 'é\u2028"\\'},
        [1, 2.0, None, True, {"n": {"m": []}}],
        {"edge": 2**63 - 1, "low": -(2**63)},
    ]
    members = [
        {"specversion": "1.0", "id": f"i{i}", "source": "/s", "type": "t", "data": d}
        for i, d in enumerate(datas)
    ]
    body = json.dumps(members).encode()
    headers = [("content-type", "application/cloudevents-batch+json")]
    for b in (body, body.replace(b"2.5e-07", b"2.5e-7")):
        events = codec.decode(headers, b)
        assert [json.loads(ev.data) for ev in events] == datas
    assert json.loads(codec.decode(headers, body)[0].data)["big"] == 2**70  # exact, not a float
    nan = b'[{"specversion":"1.0","id":"n","source":"/s","type":"t","data":{"x":NaN}}]'
    [ev] = codec.decode(headers, nan)  # the stdlib's leniency as before: NaN stays NaN
    assert ev.data == b'{"x":NaN}'
