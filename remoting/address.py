"""Host and port of a remoting address as RocketMQ writes them (`host:port`, `[v6]:port`)."""

from __future__ import annotations


def parse_host_port(text: str, default_port: int = 0) -> tuple[str, int]:
    """`"1.2.3.4:5"` / `"[::1]:5"` / `"host"` -> (host, port)."""
    text = (text or "").strip()
    if not text:
        return "127.0.0.1", default_port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    try:
        return host or "127.0.0.1", int(port) if port else default_port
    except ValueError:
        return host, default_port
