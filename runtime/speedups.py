"""The switch of the optional compiled hot path above the store (docs/store.md, "Compiled hot
path"): the MQTT codec, the gRPC delivery encoder and the store node protocol's message lists each
load their `_speedups` extension through `load`, and the AMQP codec its `_encode_speedups` and
`_decode_speedups`; `load` gives None (their pure Python) when `GATEWAY_PURE_PYTHON` is set to
anything but empty or `0`, or when the extension is not built.
(The store reads the same variable itself: it imports no other package of the project.)"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "GATEWAY_PURE_PYTHON"


def load(name: str) -> ModuleType | None:
    """The compiled module `name`, or None: disabled by GATEWAY_PURE_PYTHON, or not built."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
