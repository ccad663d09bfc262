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
from datetime import datetime

from .event import CORE, OPTIONAL, SPECVERSION, AttrValue

INT32 = (-(2**31), 2**31 - 1)

_NAME = re.compile(r"^[a-z0-9]+\Z", re.ASCII)  # \Z: `$` would accept a trailing newline
_TIME = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-]([0-9]{2}):([0-9]{2}))\Z",
    re.ASCII,
)
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# After the date: a time of day whose fields are in range (no leap second), `Z` or an offset in range.
_CLOCK = re.compile(
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])",
    re.ASCII,
)
_OK_DATES: set[str] = set()  # "YYYY-MM-DD" prefixes of times that passed the full check
_TIME_SHAPE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2})",
    re.ASCII,
)
_MEDIA_TYPE = re.compile(
    rf'^{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|"(?:[^"\\\x00-\x1f\x7f]|\\.)*"))*[ \t]*\Z',
    re.ASCII,
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")

# Values already found valid, so that the hot path skips the regexes. Bounded: cleared when full.
_CACHE_MAX = 4096
_OK_MEDIA_TYPES: set[str] = set()
_OK_NAMES: set[str] = set()  # extension names
_REQUIRED = frozenset(("specversion", "id", "source", "type"))
_RESERVED = frozenset(("data", "data_base64"))


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
    # Fast path: the exact RFC 3339 shape, then the C parser for the calendar and the ranges. It
    # refuses a leap second (:60) and a lower-case `z`, which the full check below accepts.
    if value[:10] in _OK_DATES and _CLOCK.fullmatch(value, 10) is not None:
        return None  # a date seen valid before, and a time of day in range
    if _TIME_SHAPE.fullmatch(value) is not None and (value[-1] == "Z" or value[-2:] <= "59"):
        try:
            datetime.fromisoformat(value)
            _remember(_OK_DATES, value[:10])
            return None
        except ValueError:
            pass
    m = _TIME.match(value)
    if m is None:
        return f"time {value!r} is not an RFC 3339 timestamp"
    year, month, day, hour, minute, second, _, _, oh, om = m.groups()
    # Two-digit fields compare as strings exactly as their numbers do.
    if not "01" <= month <= "12" or day < "01" or (day > "28" and int(day) > _days(int(year), int(month))):
        return f"time {value!r} has no such date"
    if hour > "23" or minute > "59" or second > "60":
        return f"time {value!r} has no such time of day"
    if oh is not None and (oh > "23" or om > "59"):
        return f"time {value!r} has an offset out of range"
    return None


def _days(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def check_media_type(value: str) -> str | None:
    """RFC 2046 / RFC 9110 media type: `type/subtype` with optional `; name=value` parameters."""
    if value in _OK_MEDIA_TYPES:
        return None
    if not _MEDIA_TYPE.match(value):
        return f"{value!r} is not an RFC 2046 media type"
    _remember(_OK_MEDIA_TYPES, value)
    return None


def _remember(cache: set[str], value: str) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache.add(value)


def valid_fast(attrs: dict[str, AttrValue]) -> bool:
    """True when the attributes are certainly valid; False means "run the full checks", which
    then find the problems (or accept a rare valid form this shortcut does not cover, such as a
    value with a non-printable but allowed character). Sound by construction: `str.isprintable()`
    is False for every character `_CONTROL` matches and for every whitespace but the ASCII space,
    so each shortcut below implies the full check's verdict."""
    if attrs.get("specversion") != SPECVERSION:
        return False
    i, s, t = attrs.get("id"), attrs.get("source"), attrs.get("type")
    if i.__class__ is not str or s.__class__ is not str or t.__class__ is not str:
        return False
    if not i or not s or not t or " " in s or not (i + s + t).isprintable():  # type: ignore[operator]
        return False
    if len(attrs) == 4:
        return True
    for name, v in attrs.items():
        if name in _REQUIRED:
            continue
        if v.__class__ is str:
            if name == "time":
                if check_time(v) is not None:  # type: ignore[arg-type]
                    return False
            elif name == "datacontenttype":
                if v not in _OK_MEDIA_TYPES and (not v or check_media_type(v) is not None):  # type: ignore[arg-type]
                    return False
            elif name == "subject":
                if not v or not v.isprintable():  # type: ignore[union-attr]
                    return False
            elif name == "dataschema":
                return False  # rare: the full check
            else:  # an extension
                if name not in _OK_NAMES:
                    if not _NAME.match(name) or name in _RESERVED:
                        return False
                    _remember(_OK_NAMES, name)
                if not v.isprintable():  # type: ignore[union-attr]
                    return False
        else:  # only extensions may be integers or booleans
            if name in CORE:
                return False
            if v.__class__ is int:
                if not INT32[0] <= v <= INT32[1]:  # type: ignore[operator]
                    return False
            elif v.__class__ is not bool:
                return False
            if name not in _OK_NAMES:
                if not _NAME.match(name) or name in _RESERVED:
                    return False
                _remember(_OK_NAMES, name)
    return True


def check_attributes(attrs: dict[str, AttrValue], index: int | None = None) -> list[Problem]:
    """Every problem of a set of context attributes (nulls already dropped)."""
    if valid_fast(attrs):
        return []
    return full_check(attrs, index)


def full_check(attrs: dict[str, AttrValue], index: int | None = None) -> list[Problem]:
    """check_attributes without the shortcut for common valid events (for tests)."""
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
