"""The adapter's own CloudEvent value: context attributes plus raw data bytes.

Not the SDK's `CloudEvent`: that class invents `id` and `time` when they are missing, parses `time`
into a datetime (losing the exact string) and runs its validation on every construction. The gateway
keeps attribute values as received (the RFC 3339 string of `time`, extension integers and booleans
as JSON gave them) so that an event leaves exactly as it came in."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Literal

import orjson

AttrValue = str | int | bool
DataForm = Literal["json", "text", "binary"]

SPECVERSION = "1.0"
REQUIRED = ("specversion", "id", "source", "type")
OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
CORE = frozenset(REQUIRED + OPTIONAL)

_FLAGS = re.ASCII | re.IGNORECASE
_JSON_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9\-.]+\+)?json\s*(;.*)?$", _FLAGS)
_TEXT_TYPE = re.compile(r"^(text/[^;]+|application/([a-zA-Z0-9\-.]+\+)?xml)\s*(;.*)?$", _FLAGS)


def is_json_type(content_type: str | None) -> bool:
    """Whether data of this media type is JSON (absent counts as JSON, per the JSON format)."""
    if content_type is None:
        return True
    known = _JSON_TYPES.get(content_type)
    if known is None:
        known = _JSON_TYPE.match(content_type) is not None
        if len(_JSON_TYPES) >= 1024:
            _JSON_TYPES.clear()
        _JSON_TYPES[content_type] = known
    return known


_JSON_TYPES: dict[str, bool] = {}  # media type -> is_json_type, the values seen (bounded)


def is_text_type(content_type: str | None) -> bool:
    return content_type is not None and _TEXT_TYPE.match(content_type) is not None


def canonical(value: AttrValue) -> str:
    """An attribute's canonical string form (booleans as `true`/`false`)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return value if isinstance(value, str) else str(value)


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
try:  # the C encoder made once: JSONEncoder.encode builds one per call, a third of its cost
    from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]

    _C_ENCODE = (
        c_make_encoder(None, _ENCODER.default, c_encode_basestring, None, ":", ",", False, False, True)
        if c_make_encoder is not None and c_encode_basestring is not None
        else None
    )
except ImportError:  # pragma: no cover - CPython always has _json
    _C_ENCODE = None


def dump_json(value: object) -> bytes:
    """Compact UTF-8 JSON (non-ASCII characters as UTF-8, not escaped), byte for byte as the
    stdlib writes it (NaN and infinities included)."""
    cls = value.__class__
    if _C_ENCODE is not None and (cls is dict or cls is list):
        return "".join(_C_ENCODE(value, 0)).encode()
    return _ENCODER.encode(value).encode()


def dump_parsed_json(value: object) -> bytes:
    """dump_json for a value orjson parsed (finite floats, integers within 64 bits): orjson's
    output, the same JSON value (exponents may be written shorter: 2.5e-7, not 2.5e-07)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return dump_json(value)


@dataclass(slots=True)
class Event:
    """A CloudEvent 1.0. `attributes` holds every context attribute (specversion included);
    `data` is None when the event has no data. `data_form` says how `data` appears in the JSON
    format (`data` as a JSON value, `data` as a string, or `data_base64`); None infers it from
    `datacontenttype` (see `json_data`)."""

    attributes: dict[str, AttrValue]
    data: bytes | None = None
    data_form: DataForm | None = None

    @property
    def id(self) -> str:
        return str(self.attributes.get("id", ""))

    @property
    def source(self) -> str:
        return str(self.attributes.get("source", ""))

    @property
    def type(self) -> str:
        return str(self.attributes.get("type", ""))

    @property
    def datacontenttype(self) -> str | None:
        v = self.attributes.get("datacontenttype")
        return v if isinstance(v, str) else None

    def json_data(self) -> tuple[str, object] | None:
        """The JSON format's data member: ("data", value) or ("data_base64", text); None without data.

        Without an explicit form: JSON media types (or none) give the parsed JSON value, text types
        the UTF-8 string, anything else, or bytes that do not parse / decode, `data_base64`."""
        data = self.data
        if data is None:
            return None
        form = self.data_form
        if form is None:
            ct = self.datacontenttype
            form = "json" if is_json_type(ct) else "text" if is_text_type(ct) else "binary"
        if form == "json":
            try:
                return "data", json.loads(data)
            except ValueError:
                pass
        elif form == "text":
            try:
                return "data", data.decode()
            except UnicodeDecodeError:
                pass
        return "data_base64", base64.b64encode(data).decode("ascii")

    def to_json(self) -> dict[str, object]:
        """The event as a JSON-format object (specversion first, then the other attributes, then data)."""
        out: dict[str, object] = {"specversion": SPECVERSION}
        for k, v in self.attributes.items():
            if k != "specversion":
                out[k] = v
        d = self.json_data()
        if d is not None:
            out[d[0]] = d[1]
        return out
