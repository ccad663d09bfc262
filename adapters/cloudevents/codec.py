"""HTTP protocol binding 1.0.2 (sans-IO): request headers + body -> events, events -> headers + body.

The content mode comes from `Content-Type` alone (`application/cloudevents-batch+json` batched,
`application/cloudevents+json` structured, another `application/cloudevents...` 415, anything else
binary). The SDK's `from_http_event` chooses the mode by the presence of `ce-` headers instead, and
misparses a structured event that also carries `ce-` headers (the binding allows them), so this
module parses both modes itself and validates every event with `validate.check_attributes`.

Header values are decoded as the binding says: first a double-quoted string is unescaped, then one
round of percent-decoding, and the bytes must be valid UTF-8 (`%C0%A0` is rejected). Values must
arrive as ASCII (anything else must be percent-encoded)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Sequence
from typing import Literal
from urllib.parse import quote, unquote_to_bytes

import orjson

from .event import Event, canonical, dump_json, dump_parsed_json, is_json_type
from .validate import Problem, check_attributes, full_check, valid_fast

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
Mode = Literal["binary", "structured", "batch"]

_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_NEEDS_ENCODING = re.compile(r"[^\x21\x23\x24\x26-\x7e]")
_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')


class CodecError(Exception):
    """The request cannot be turned into events; `status` is the HTTP status to answer."""

    status = 400
    kind = "invalid_event"

    def __init__(self, problems: list[Problem] | str) -> None:
        self.problems = [Problem(problems)] if isinstance(problems, str) else problems
        super().__init__("; ".join(_describe(p) for p in self.problems[:5]))


class InvalidEvents(CodecError):
    """400: malformed JSON, missing or invalid attributes."""


class UnsupportedFormat(CodecError):
    """415: an event format other than JSON (`application/cloudevents+avro`, ...)."""

    status = 415
    kind = "unsupported_format"


class TooManyEvents(CodecError):
    """413: a batch with more events than one request may carry."""

    status = 413
    kind = "body_too_large"


def _describe(p: Problem) -> str:
    where = f"event {p.index}: " if p.index is not None else ""
    return where + p.detail


# ----------------------------------------------------------------------------- header values
def decode_header_value(raw: str) -> str:
    """A `ce-*` header value -> the attribute string; ValueError when it is not validly encoded."""
    v = raw
    if not v.isascii():
        raise ValueError("header value must be ASCII (other characters must be percent-encoded)")
    if v.startswith('"'):
        if len(v) < 2 or not v.endswith('"'):
            raise ValueError("unterminated quoted string")
        v = _unquote(v[1:-1])
    if "%" in v:
        if _BAD_PERCENT.search(v):
            raise ValueError("invalid percent-encoding")
        try:
            v = unquote_to_bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("percent-encoded bytes are not valid UTF-8") from None
    return v


def _unquote(s: str) -> str:
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            if i + 1 >= n:
                raise ValueError("unterminated quoted string")
            out.append(s[i + 1])
            i += 2
            continue
        if c == '"':
            raise ValueError("unescaped double quote in a quoted string")
        out.append(c)
        i += 1
    return "".join(out)


def encode_header_value(value: str) -> str:
    """Percent-encode space, `"`, `%` and everything outside printable ASCII (UTF-8 bytes, upper-case hex)."""
    return quote(value, safe=_SAFE) if _NEEDS_ENCODING.search(value) else value


# ----------------------------------------------------------------------------- decoding
def content_mode(content_type: str | None) -> Mode:
    """The content mode a `Content-Type` selects; UnsupportedFormat for other event formats."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if not base.startswith("application/cloudevents"):
        return "binary"
    if base == STRUCTURED:
        return "structured"
    if base == BATCH:
        return "batch"
    raise UnsupportedFormat(f"event format {base!r} is not supported (only {STRUCTURED} and {BATCH})")


def decode(headers: Sequence[tuple[str, str]], body: bytes, *, max_events: int = 1024) -> list[Event]:
    """The events of one request. `headers` are (lower-case name, value) pairs as received.
    Raises InvalidEvents (400), UnsupportedFormat (415) or TooManyEvents (413)."""
    content_type = None
    for name, value in headers:
        if name == "content-type":
            content_type = value
            break
    mode = content_mode(content_type)
    if mode == "binary":
        return [decode_binary(headers, body)]
    obj, fast = _load_json(body)
    if mode == "structured":
        if not isinstance(obj, dict):
            raise InvalidEvents("a structured event must be a JSON object")
        return [_raise_if_invalid(*_from_json(obj, None, fast))]
    if not isinstance(obj, list):
        raise InvalidEvents("a batch must be a JSON array")
    if len(obj) > max_events:
        raise TooManyEvents(f"a batch may carry at most {max_events} events, got {len(obj)}")
    events: list[Event] = []
    problems: list[Problem] = []
    for i, member in enumerate(obj):
        if member.__class__ is not dict:
            problems.append(Problem("batch members must be JSON objects", None, i))
            continue
        ev, errs = _from_json(member, i, fast)
        if errs:
            problems.extend(errs)
        events.append(ev)
    if problems:
        raise InvalidEvents(problems)
    return events


# orjson turns integers beyond 64 bits into floats: bodies with a run of 18+ digits go to the stdlib.
# (Digits -> "0", everything else -> " ", then a substring search: ~10x faster than a regex.)
_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_LONG_RUN = b"0" * 18


def _load_json(body: bytes) -> tuple[object, bool]:
    """(value, parsed by orjson). orjson on the hot path; the stdlib (exact big integers, NaN, its
    own error messages) for bodies with long digit runs and for whatever orjson refuses."""
    if _LONG_RUN not in body.translate(_DIGITS_ONLY):
        try:
            return orjson.loads(body), True
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body), False
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidEvents(f"malformed JSON: {e}") from None


def _raise_if_invalid(ev: Event, problems: list[Problem]) -> Event:
    if problems:
        raise InvalidEvents(problems)
    return ev


def decode_binary(headers: Iterable[tuple[str, str]], body: bytes) -> Event:
    """Binary mode: `ce-*` headers are the attributes, Content-Type is `datacontenttype`."""
    attrs: dict[str, str | int | bool] = {}
    problems: list[Problem] = []
    content_type: str | None = None
    for name, value in headers:
        if name == "content-type":
            content_type = value.strip() or None
            continue
        if not name.startswith("ce-"):
            continue
        attr = name[3:]
        if attr == "datacontenttype":
            why = "ce-datacontenttype must not be present in binary mode (Content-Type carries it)"
            problems.append(Problem(why, attr))
            continue
        if attr in attrs:
            problems.append(Problem(f"header ce-{attr} is repeated", attr))
            continue
        try:
            attrs[attr] = decode_header_value(value)
        except ValueError as e:
            problems.append(Problem(f"ce-{attr}: {e}", attr))
    if content_type is not None:
        attrs["datacontenttype"] = content_type
    problems.extend(check_attributes(attrs))
    if problems:
        raise InvalidEvents(problems)
    return Event(attrs, body or None)


def from_json(obj: dict[str, object], index: int | None = None) -> tuple[Event, list[Problem]]:
    """A JSON-format event object -> (event, problems). `null` members count as absent."""
    return _from_json(dict(obj), index)


def _from_json(obj: dict[str, object], index: int | None, fast: bool = False) -> tuple[Event, list[Problem]]:
    """from_json on an object of our own (from json.loads): it becomes the event's attributes.
    The common case (valid attributes, JSON data) is the hot path of batched ingest."""
    data = obj.pop("data", None)
    b64 = obj.pop("data_base64", None)
    if None in obj.values():
        obj = {k: v for k, v in obj.items() if v is not None}
    attrs: dict[str, str | int | bool] = obj  # type: ignore[assignment]  # checked below
    problems: list[Problem] = [] if valid_fast(attrs) else full_check(attrs, index)
    if b64 is None:
        if data is None:
            return Event(attrs), problems
        if data.__class__ is str:
            ct = attrs.get("datacontenttype")
            if ct.__class__ is str and not is_json_type(ct):  # type: ignore[arg-type]
                return Event(attrs, data.encode(), "text"), problems  # type: ignore[attr-defined]
        return Event(attrs, (dump_parsed_json if fast else dump_json)(data), "json"), problems
    ev = Event(attrs)
    if data is not None:
        problems.append(Problem("data and data_base64 are mutually exclusive", "data", index))
    elif b64.__class__ is not str:
        problems.append(Problem("data_base64 must be a string", "data_base64", index))
    else:
        try:
            ev.data = base64.b64decode(b64, validate=True)  # type: ignore[arg-type]
            ev.data_form = "binary"
        except (binascii.Error, ValueError):
            problems.append(Problem("data_base64 is not valid base64", "data_base64", index))
    return ev, problems


def decode_reply(headers: Sequence[tuple[str, str]], body: bytes) -> Event | None:
    """The CloudEvent a webhook answered with, or None when the response carries none (a binary
    response needs `ce-specversion`). Raises CodecError for an invalid event or a batch."""
    content_type = next((v for k, v in headers if k == "content-type"), None)
    mode = content_mode(content_type)
    if mode == "binary" and not any(k == "ce-specversion" for k, _ in headers):
        return None
    events = decode(headers, body, max_events=1)
    if mode == "batch" or len(events) != 1:
        raise InvalidEvents("a reply must be one event")
    return events[0]


# ----------------------------------------------------------------------------- encoding
def encode_binary(ev: Event) -> tuple[list[tuple[str, str]], bytes]:
    """Binary mode: (headers, body). `datacontenttype` becomes Content-Type."""
    headers: list[tuple[str, str]] = []
    for k, v in ev.attributes.items():
        if k == "datacontenttype":
            headers.append(("content-type", str(v)))
        else:
            headers.append(("ce-" + k, encode_header_value(canonical(v))))
    return headers, ev.data or b""


def encode_structured(ev: Event) -> bytes:
    return dump_json(ev.to_json())


def encode_batch(events: Iterable[Event]) -> bytes:
    return dump_json([ev.to_json() for ev in events])
