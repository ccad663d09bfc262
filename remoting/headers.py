"""Lenient reading of request extFields (what Java's `decodeCommandCustomHeader` does, minus its
strictness): values arrive as strings, JSON numbers or booleans ("1"/"0", "true"/"false"); unknown
keys are ignored; a missing required field raises `HeaderError` (-> a response with its code).

SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE carry the send header under one-letter names; `send_header`
maps both forms onto the long names."""

from __future__ import annotations

from .codes import ResponseCode

# SendMessageRequestHeaderV2 short names -> SendMessageRequestHeader fields.
SEND_V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}
_TRUE = frozenset({"true", "1", "yes", "on"})


class HeaderError(ValueError):
    """A request header field is missing or malformed; `code` is the response code to send."""

    def __init__(self, message: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Ext:
    """Typed, lenient access to one request's extFields."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def __contains__(self, name: str) -> bool:
        v = self.fields.get(name)
        return v is not None and v != ""

    def str(self, name: str, default: str | None = None) -> str:
        v = self.fields.get(name)
        if v is None:
            if default is None:
                raise HeaderError(f"the request has no field {name}")
            return default
        return v

    def int(self, name: str, default: int | None = None) -> int:
        v = self.fields.get(name)
        if v is None or v.strip() == "" or v == "null":
            if default is None:
                raise HeaderError(f"the request has no field {name}")
            return default
        t = v.strip()
        try:
            return int(t)
        except ValueError:
            pass
        try:
            f = float(t)
        except ValueError:
            if t.lower() in ("true", "false"):
                return int(t.lower() == "true")
            raise HeaderError(f"field {name} is not a number: {v!r}") from None
        if not f.is_integer():
            raise HeaderError(f"field {name} is not an integer: {v!r}")
        return int(f)

    def bool(self, name: str, default: bool = False) -> bool:
        """true/false/1/0 (Java's parseBoolean would read "1" as false; clients mean true)."""
        v = self.fields.get(name)
        if v is None or v.strip() == "":
            return default
        return v.strip().lower() in _TRUE

    def opt_int(self, name: str) -> int | None:
        return self.int(name, default=None) if name in self else None


def send_header(fields: dict[str, str]) -> Ext:
    """SEND_MESSAGE's long-named fields, from either the long or the V2 short names."""
    if "b" in fields and "topic" not in fields:
        return Ext({SEND_V2_NAMES.get(k, k): v for k, v in fields.items()})
    return Ext(fields)
