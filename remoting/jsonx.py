"""JSON as RocketMQ's fastjson writes and reads it.

- `dumps(obj, unquoted_int_keys=...)`: compact JSON with object keys sorted (fastjson's order).
  Integer dict keys are written unquoted (`{0:"127.0.0.1:10911"}`) when `unquoted_int_keys` is
  set: what the Java name server sends clients older than 4.9.4 (`version` < 401) for
  `HashMap<Long, String>` fields such as `brokerAddrs`, and what ali-ons (JSON2.parse) and the
  C++ client (jsoncpp) accept. Otherwise they are quoted, as standard JSON requires.
- `loads(text)`: standard JSON plus fastjson's bare numeric keys.
- `wants_standard_json(cmd)`: the name server's rule for choosing between the two."""

from __future__ import annotations

import json
import re
from typing import Any

from .codes import V4_9_4

_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def _enc(obj: Any, unquoted: bool, out: list[str]) -> None:
    if isinstance(obj, dict):
        if not obj:
            out.append("{}")
            return
        out.append("{")
        first = True
        for k in sorted(obj, key=lambda k: (isinstance(k, str), k if isinstance(k, str) else int(k))):
            if not first:
                out.append(",")
            first = False
            if isinstance(k, int) and not isinstance(k, bool):
                out.append(str(k) if unquoted else f'"{k}"')
            else:
                out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _enc(obj[k], unquoted, out)
        out.append("}")
    elif isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj) if isinstance(obj, set | frozenset) else obj
        out.append("[")
        for i, v in enumerate(items):
            if i:
                out.append(",")
            _enc(v, unquoted, out)
        out.append("]")
    else:
        out.append(json.dumps(obj, ensure_ascii=False))


def dumps(obj: Any, *, unquoted_int_keys: bool = False) -> str:
    """Compact JSON, keys sorted; int keys unquoted when `unquoted_int_keys`."""
    out: list[str] = []
    _enc(obj, unquoted_int_keys, out)
    return "".join(out)


def dumps_bytes(obj: Any, *, unquoted_int_keys: bool = False) -> bytes:
    return dumps(obj, unquoted_int_keys=unquoted_int_keys).encode()


def loads(text: str | bytes) -> Any:
    """Parse JSON that may carry fastjson's bare numeric object keys."""
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # Quote bare numeric keys outside of strings.
    parts: list[str] = []
    pos = 0
    for m in _STRINGS.finditer(text):
        parts.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos : m.start()]))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:]))
    return json.loads("".join(parts))


def wants_standard_json(version: int, ext_fields: dict[str, str]) -> bool:
    """The Java name server sends standard JSON to clients at or above 4.9.4 (version 401) and to
    those that ask with `acceptStandardJsonOnly=true`; older clients get fastjson's raw output."""
    if version >= V4_9_4:
        return True
    return ext_fields.get("acceptStandardJsonOnly", "").strip().lower() == "true"
