"""The sans-IO codec, validation and store mapping, with no I/O; cross-checked against the SDK."""

from __future__ import annotations

import base64
import json

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event, from_structured_event
from cloudevents.core.bindings.http import to_binary_event as sdk_to_binary
from cloudevents.core.v1.event import CloudEvent

from adapters.cloudevents import codec
from adapters.cloudevents.event import Event
from adapters.cloudevents.mapping import attributes_of, from_message, rfc3339_ms, to_message
from adapters.cloudevents.validate import check_media_type, check_time
from messaging_processor import Message

MIN = {"specversion": "1.0", "id": "e-1", "source": "https://example.com/src", "type": "io.example.t"}
STRUCT = [("content-type", codec.STRUCTURED)]
BATCH = [("content-type", codec.BATCH)]


def structured(obj) -> list[Event]:
    return codec.decode(STRUCT, json.dumps(obj).encode())


def binary(headers: dict[str, str], body: bytes = b"") -> list[Event]:
    return codec.decode([(k.lower(), v) for k, v in headers.items()], body)


BIN = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/src", "ce-type": "io.example.t"}


# ----------------------------------------------------------------------------- JSON format vectors
VALID = {
    "minimal": MIN,
    "null optional attributes": {
        **MIN,
        "datacontenttype": None,
        "dataschema": None,
        "subject": None,
        "time": None,
    },
    "all core attributes": {
        **MIN,
        "datacontenttype": "text/plain",
        "dataschema": "https://example.com/schema",
        "subject": "tests",
        "time": "2018-04-05T17:31:00Z",
    },
    "time with nanoseconds": {**MIN, "time": "2018-04-05T17:31:00.000000000Z"},
    "time with positive offset": {**MIN, "time": "2018-04-05T18:31:00+01:00"},
    "time with negative offset": {**MIN, "time": "2018-04-05T16:31:00-01:00"},
    "leap day": {**MIN, "time": "2024-02-29T00:00:00Z"},
    "relative source": {**MIN, "source": "#fragment"},
    "text data": {**MIN, "datacontenttype": "text/plain", "data": "Simple text"},
    "every extension type": {
        **MIN,
        "extinteger": 10,
        "extboolean": True,
        "extstring": "text",
        "exturi": "https://example.com",
        "exttimestamp": "2023-03-31T15:12:00Z",
        "extbinary": "TWE=",
    },
    "media type with parameters": {**MIN, "datacontenttype": 'application/json; charset="utf-8"'},
}

INVALID = {
    "no specversion": ({k: v for k, v in MIN.items() if k != "specversion"}, "specversion"),
    "no id": ({k: v for k, v in MIN.items() if k != "id"}, "id"),
    "no type": ({k: v for k, v in MIN.items() if k != "type"}, "type"),
    "no source": ({k: v for k, v in MIN.items() if k != "source"}, "source"),
    "time garbage": ({**MIN, "time": "lunchtime"}, "time"),
    "time to the minute": ({**MIN, "time": "2018-04-05T18:31Z"}, "time"),
    "time offset X": ({**MIN, "time": "2018-04-05T18:31:00X"}, "time"),
    "time offset out of range": ({**MIN, "time": "2018-04-05T18:31:00+25:00"}, "time"),
    "time offset not numeric": ({**MIN, "time": "2018-04-05T18:31:00+xx:00"}, "time"),
    "time offset hour only": ({**MIN, "time": "2018-04-05T18:31:00+05"}, "time"),
    "no such day": ({**MIN, "time": "2023-02-29T00:00:00Z"}, "time"),
    "empty id": ({**MIN, "id": ""}, "id"),
    "empty type": ({**MIN, "type": ""}, "type"),
    "empty source": ({**MIN, "source": ""}, "source"),
    "empty specversion": ({**MIN, "specversion": ""}, "specversion"),
    "unknown specversion": ({**MIN, "specversion": "0.9"}, "specversion"),
    "specversion 0.3": ({**MIN, "specversion": "0.3"}, "specversion"),
    "non RFC 2046 datacontenttype": ({**MIN, "datacontenttype": "xyz"}, "datacontenttype"),
    "empty datacontenttype": ({**MIN, "datacontenttype": ""}, "datacontenttype"),
    "empty dataschema": ({**MIN, "dataschema": ""}, "dataschema"),
    "relative dataschema": ({**MIN, "dataschema": "/schema"}, "dataschema"),
    "empty subject": ({**MIN, "subject": ""}, "subject"),
    "numeric id": ({**MIN, "id": 25}, "id"),
    "object id": ({**MIN, "id": {"xyz": "abc"}}, "id"),
    "capitalized extension": ({**MIN, "MyExtension": "bad"}, "MyExtension"),
    "punctuated extension": ({**MIN, "my.extension": "bad"}, "my.extension"),
    "float extension": ({**MIN, "myext": 1.5}, "myext"),
    "extension over int32": ({**MIN, "myext": 2**31}, "myext"),
    "object extension": ({**MIN, "myext": {"a": 1}}, "myext"),
    "data and data_base64": ({**MIN, "data": "text", "data_base64": "eyAieHl6IjogMTIzIH0="}, "data"),
    "bad base64": ({**MIN, "data_base64": "not base64!"}, "data_base64"),
}


@pytest.mark.parametrize("obj", VALID.values(), ids=VALID.keys())
def test_valid_structured_events_decode(obj):
    (ev,) = structured(obj)
    assert ev.attributes == {k: v for k, v in obj.items() if v is not None and k != "data"}


@pytest.mark.parametrize(("obj", "attribute"), INVALID.values(), ids=INVALID.keys())
def test_invalid_structured_events_name_the_attribute(obj, attribute):
    with pytest.raises(codec.InvalidEvents) as e:
        structured(obj)
    assert attribute in [p.attribute for p in e.value.problems]
    assert e.value.status == 400


def test_batches():
    assert codec.decode(BATCH, b"[]") == []
    evs = codec.decode(BATCH, json.dumps([MIN, {**MIN, "id": "e-2"}]).encode())
    assert [e.id for e in evs] == ["e-1", "e-2"]
    for bad, index in (
        ([MIN, {**MIN, "specversion": "0.9"}], 1),  # mixed specversions
        ([{k: v for k, v in MIN.items() if k != "id"}], 0),  # an invalid member
        (["not an object", MIN], 0),  # a non-object member
    ):
        with pytest.raises(codec.InvalidEvents) as e:
            codec.decode(BATCH, json.dumps(bad).encode())
        assert [p.index for p in e.value.problems] == [index]
    with pytest.raises(codec.InvalidEvents):
        codec.decode(BATCH, json.dumps(MIN).encode())  # not an array
    with pytest.raises(codec.TooManyEvents):
        codec.decode(BATCH, json.dumps([MIN] * 3).encode(), max_events=2)


@pytest.mark.parametrize(
    ("content_type", "mode"),
    [
        ("application/json", "binary"),
        (None, "binary"),
        ("application/cloudevents+json; charset=UTF-8", "structured"),
        ("Application/CloudEvents+JSON", "structured"),
        ("application/cloudevents-batch+json", "batch"),
    ],
)
def test_mode_comes_from_content_type_alone(content_type, mode):
    assert codec.content_mode(content_type) == mode


@pytest.mark.parametrize(
    "ct", ["application/cloudevents+avro", "application/cloudevents", "application/cloudevents-batch+xml"]
)
def test_unknown_event_formats_are_415(ct):
    with pytest.raises(codec.UnsupportedFormat) as e:
        codec.decode([("content-type", ct)], b"{}")
    assert e.value.status == 415


def test_structured_mode_ignores_extra_ce_headers():
    # The SDK's from_http_event would parse this as binary; the binding says structured.
    (ev,) = codec.decode([*STRUCT, ("ce-id", "from-header")], json.dumps(MIN).encode())
    assert ev.id == "e-1"


# ----------------------------------------------------------------------------- binary mode
def test_binary_mode_decodes_percent_encoding_and_keeps_content_type():
    hdrs = {
        **BIN,
        "ce-subject": "Euro%20%E2%82%AC%20%F0%9F%98%80",
        "Content-Type": "application/json; charset=utf-8",
    }
    (ev,) = binary(hdrs, b'{"a": 1}')
    assert ev.attributes["subject"] == "Euro € 😀"
    assert ev.datacontenttype == "application/json; charset=utf-8"
    assert ev.data == b'{"a": 1}' and ev.data_form is None


def test_binary_quoted_header_values_are_unescaped():
    (ev,) = binary({**BIN, "ce-subject": '"a \\"quoted\\" value%21"'})
    assert ev.attributes["subject"] == 'a "quoted" value!'


@pytest.mark.parametrize(
    ("headers", "attribute"),
    [
        ({k: v for k, v in BIN.items() if k != "ce-specversion"}, "specversion"),
        ({**BIN, "ce-id": ""}, "id"),
        ({**BIN, "ce-specversion": "0.3"}, "specversion"),
        ({**BIN, "ce-time": "lunchtime"}, "time"),
        ({**BIN, "ce-my-ext": "x"}, "my-ext"),
        ({**BIN, "ce-subject": "%C0%A0"}, "subject"),  # overlong UTF-8
        ({**BIN, "ce-subject": "50%"}, "subject"),  # bad percent-encoding
        ({**BIN, "ce-subject": "%zz"}, "subject"),
        ({**BIN, "ce-subject": '"unterminated'}, "subject"),
        ({**BIN, "ce-subject": "bad\u00e9"}, "subject"),  # raw non-ASCII
        ({**BIN, "ce-datacontenttype": "text/plain"}, "datacontenttype"),
        ({**BIN, "Content-Type": "not a media type"}, "datacontenttype"),
    ],
)
def test_invalid_binary_events(headers, attribute):
    with pytest.raises(codec.InvalidEvents) as e:
        binary(headers)
    assert attribute in [p.attribute for p in e.value.problems]


def test_repeated_ce_header_is_invalid():
    with pytest.raises(codec.InvalidEvents, match="repeated"):
        codec.decode([(k, v) for k, v in BIN.items()] + [("ce-id", "again")], b"")


def test_header_encoding_round_trip():
    for value in ["plain", "Euro € 😀", 'q"uo%te', "tab\tand space"]:
        enc = codec.encode_header_value(value)
        assert enc.isascii() and " " not in enc and '"' not in enc
        assert codec.decode_header_value(enc) == value
    assert codec.encode_header_value("Euro € 😀") == "Euro%20%E2%82%AC%20%F0%9F%98%80"


# ----------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    "ok", ["1985-04-12T23:20:50.52Z", "1996-12-19T16:39:57-08:00", "1990-12-31T23:59:60Z"]
)
def test_rfc3339_accepts(ok):
    assert check_time(ok) is None


@pytest.mark.parametrize("ok", ["text/plain", "application/vnd.a+json;charset=utf-8", 'a/b; q="x;y"'])
def test_media_types(ok):
    assert check_media_type(ok) is None
    assert check_media_type(ok + ";") is not None


# ----------------------------------------------------------------------------- mapping
def roundtrip(ev: Event) -> Event:
    m = to_message("t", ev)
    m.message_id = "MID"
    return from_message(m)


@pytest.mark.parametrize("obj", VALID.values(), ids=VALID.keys())
def test_structured_events_round_trip_exactly_through_the_store(obj):
    (ev,) = structured(obj)
    out = roundtrip(ev)
    expected = {k: v for k, v in obj.items() if v is not None}
    assert out.to_json() == expected


def test_data_forms_round_trip():
    cases = [
        ({**MIN, "data": {"a": [1, 2.5, None]}}, "data"),
        ({**MIN, "datacontenttype": "application/json", "data": "a JSON string"}, "data"),
        ({**MIN, "datacontenttype": "text/plain", "data": ""}, "data"),
        ({**MIN, "datacontenttype": "text/plain", "data": 42}, "data"),
        (
            {**MIN, "datacontenttype": "application/json", "data_base64": base64.b64encode(b"{}").decode()},
            "data_base64",
        ),
        ({**MIN, "data_base64": ""}, "data_base64"),
    ]
    for obj, member in cases:
        (ev,) = structured(obj)
        out = roundtrip(ev).to_json()
        assert out == obj and member in out


def test_binary_data_is_shown_by_media_type():
    def shown(ct, body):
        h = {**BIN, "content-type": ct} if ct else BIN
        return roundtrip(binary(h, body)[0]).to_json()

    assert shown("application/json", b'{"a":1}')["data"] == {"a": 1}
    assert shown("text/plain; charset=utf-8", "héllo".encode())["data"] == "héllo"
    assert shown("application/octet-stream", b"\x00\x01")["data_base64"] == "AAE="
    assert shown("application/json", b"not json")["data_base64"] == base64.b64encode(b"not json").decode()
    assert "data" not in shown(None, b"") and "data_base64" not in shown(None, b"")


def test_foreign_messages_get_synthesized_attributes():
    mqtt = Message(
        "devices",
        b"21.5",
        properties={"mqtt.topic": "devices/42/telemetry", "mqtt.qos": "1", "mqtt.content_type": "text/plain"},
        message_id="M1",
        born_timestamp=1_700_000_000_123,
    )
    assert attributes_of(mqtt) == {
        "specversion": "1.0",
        "id": "M1",
        "source": "/gateway/mqtt/devices",
        "type": "mqtt.publish",
        "subject": "devices/42/telemetry",
        "time": "2023-11-14T22:13:20.123Z",
        "datacontenttype": "text/plain",
    }
    rmq = attributes_of(Message("orders", b"x", tag="new", message_id="M2", store_timestamp=5))
    assert rmq["type"] == "org.apache.rocketmq.message" and rmq["subject"] == "new"
    assert rmq["source"] == "/gateway/rocketmq/orders" and rmq["time"] == rfc3339_ms(5)
    assert check_time(rmq["time"]) is None


def test_encoded_events_parse_with_the_sdk():
    (ev,) = structured(
        {
            **MIN,
            "time": "2018-04-05T17:31:00Z",
            "ext": 7,
            "datacontenttype": "application/json",
            "data": {"k": "v"},
        }
    )
    headers, body = codec.encode_binary(ev)
    sdk = from_binary_event(HTTPMessage(dict(headers), body))
    assert (sdk.get_id(), sdk.get_type(), sdk.get_extension("ext"), sdk.get_data()) == (
        "e-1",
        "io.example.t",
        "7",
        {"k": "v"},
    )
    sdk2 = from_structured_event(HTTPMessage({"content-type": codec.STRUCTURED}, codec.encode_structured(ev)))
    assert sdk2.get_extension("ext") == 7 and sdk2.get_time().year == 2018


def test_sdk_binary_events_decode():
    sdk = CloudEvent({"type": "t", "source": "/s", "id": "i", "subject": "ä b"}, {"x": 1})
    msg = sdk_to_binary(sdk)
    (ev,) = codec.decode([(k.lower(), v) for k, v in msg.headers.items()], msg.body)
    assert ev.attributes["subject"] == "ä b" and json.loads(ev.data) == {"x": 1}


def test_the_partitionkey_extension_is_the_message_key():
    (ev,) = codec.decode(BATCH, json.dumps([{**MIN, "partitionkey": "device-7"}]).encode())
    msg = to_message("T", ev)
    assert msg.keys == ("device-7",)
    assert msg.properties["ce.partitionkey"] == "device-7"  # and the event leaves as it came
    (plain,) = codec.decode(BATCH, json.dumps([MIN]).encode())
    assert to_message("T", plain).keys == ()
