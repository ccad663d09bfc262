"""What every gateway process (`gateway start`, `gateway store`, `gateway namesrv`) shares to
start: the settings error, the accepted event loops and log levels, and turning those two settings
into an event loop factory and a log configuration. Imports nothing from the project."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

EVENT_LOOPS = ("uvloop", "asyncio")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConfigError(ValueError):
    """Raised for an unreadable config file, an unknown key or an invalid value."""


def loop_factory(event_loop: str, log: logging.Logger) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The `asyncio.Runner` loop factory of an `event_loop` setting (None: asyncio's default).
    uvloop falls back to the default loop, with a warning, where it is not installed."""
    if event_loop != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed; using the default asyncio event loop")
        return None
    return uvloop.new_event_loop


def setup_logging(level: str, tag: str | None = None) -> None:
    """One line per record on stderr: `<time> <LEVEL> <logger>: <message>` (`<time> <tag> <LEVEL>
    ...` with a `tag`: which worker of `gateway start --workers` logged it)."""
    fmt = LOG_FORMAT if tag is None else LOG_FORMAT.replace(" %(levelname)s", f" {tag} %(levelname)s", 1)
    logging.basicConfig(level=level.upper(), format=fmt)


__all__ = ["EVENT_LOOPS", "LOG_FORMAT", "LOG_LEVELS", "ConfigError", "loop_factory", "setup_logging"]
