"""Strict CloudEvents 1.0.2 attribute checks (sans-IO: values in, problems out).

Hand-written because the `cloudevents` SDK 2.2 is lenient exactly where a gateway must not be: it
invents `id`, `specversion` and `time`, accepts `0.3`, raises a bare ValueError for a bad `time`
(and only after `dateutil` accepted forms RFC 3339 forbids, e.g. `2018-04-05T18:31Z`), does not
check `datacontenttype` against RFC 2046 nor `dataschema` for an absolute URI, and rejects `null`
optional attributes that the JSON format allows."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

from .event import CORE, OPTIONAL, SPECVERSION, AttrValue

INT32 = (-(2**31), 2**31 - 1)

_NAME = re.compile(r"^[a-z0-9]+$", re.ASCII)
_TIME = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-]([0-9]{2}):([0-9]{2}))$",
    re.ASCII,
)
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(
    rf'^{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|"(?:[^"\\\x00-\x1f\x7f]|\\.)*"))*[ \t]*$',
    re.ASCII,
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason an event (or request) is invalid; `index` is the position in a batch."""

    detail: str
    attribute: str | None = None
    index: int | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"detail": self.detail}
        if self.attribute is not None:
            out["attribute"] = self.attribute
        if self.index is not None:
            out["index"] = self.index
        return out


def check_name(name: str) -> str | None:
    """Attribute and extension names: lower-case ASCII letters and digits only."""
    if not _NAME.match(name):
        return f"attribute name {name!r} must consist of a-z and 0-9 only"
    return None


def check_time(value: str) -> str | None:
    """RFC 3339 `date-time`: seconds required, offset `Z` or `+hh:mm`, calendar-valid fields."""
    m = _TIME.match(value)
    if m is None:
        return f"time {value!r} is not an RFC 3339 timestamp"
    year, month, day, hour, minute, second, _, _, oh, om = m.groups()
    month_n, day_n = int(month), int(day)
    if (
        not 1 <= month_n <= 12
        or day_n < 1
        or (day_n > 28 and day_n > calendar.monthrange(int(year), month_n)[1])
    ):
        return f"time {value!r} has no such date"
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:
        return f"time {value!r} has no such time of day"
    if oh is not None and (int(oh) > 23 or int(om) > 59):
        return f"time {value!r} has an offset out of range"
    return None


def check_media_type(value: str) -> str | None:
    """RFC 2046 / RFC 9110 media type: `type/subtype` with optional `; name=value` parameters."""
    if not _MEDIA_TYPE.match(value):
        return f"{value!r} is not an RFC 2046 media type"
    return None


def check_attributes(attrs: dict[str, AttrValue], index: int | None = None) -> list[Problem]:
    """Every problem of a set of context attributes (nulls already dropped)."""
    out: list[Problem] = []

    def bad(attribute: str, detail: str) -> None:
        out.append(Problem(detail, attribute, index))

    sv = attrs.get("specversion")
    if sv is None:
        bad("specversion", "specversion is required")
    elif sv != SPECVERSION:
        bad("specversion", f"specversion must be {SPECVERSION!r}, got {sv!r}")
    for name in ("id", "source", "type"):
        v = attrs.get(name)
        if v is None:
            bad(name, f"{name} is required")
        elif not isinstance(v, str):
            bad(name, f"{name} must be a string")
        elif not v:
            bad(name, f"{name} must not be empty")
        elif _CONTROL.search(v):
            bad(name, f"{name} contains control characters")
    src = attrs.get("source")
    if isinstance(src, str) and src and _SPACE_OR_CONTROL.search(src):
        bad("source", "source must be a URI-reference (no spaces or control characters)")
    for name in OPTIONAL:
        if name not in attrs:
            continue
        v = attrs[name]
        if not isinstance(v, str):
            bad(name, f"{name} must be a string")
            continue
        if not v:
            bad(name, f"{name} must not be empty when present")
            continue
        err = None
        if name == "time":
            err = check_time(v)
        elif name == "datacontenttype":
            err = check_media_type(v)
        elif name == "dataschema" and (not _SCHEME.match(v) or _SPACE_OR_CONTROL.search(v)):
            err = f"dataschema {v!r} is not an absolute URI"
        elif _CONTROL.search(v):
            err = f"{name} contains control characters"
        if err:
            bad(name, err)
    for name, v in attrs.items():
        if name in CORE:
            continue
        err = check_name(name)
        if err is None and name in ("data", "data_base64"):
            err = f"{name!r} is reserved"
        if err is None:
            if isinstance(v, bool):
                pass
            elif isinstance(v, int):
                if not INT32[0] <= v <= INT32[1]:
                    err = f"extension {name} is outside the 32-bit integer range"
            elif isinstance(v, str):
                if _CONTROL.search(v):
                    err = f"extension {name} contains control characters"
            else:
                err = f"extension {name} must be a string, an integer or a boolean"
        if err:
            bad(name, err)
    return out
