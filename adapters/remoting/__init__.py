"""RocketMQ 4.x remoting adapter: `RemotingAdapter` (server.py) answers name-server and broker
requests of 4.x clients over the sans-IO codec (codec/), one handler module per concern
(handlers/), with long polling (hold.py), batched sends (batcher.py), client bookkeeping
(clients.py) and the 4.x <-> store message mapping (mapping.py). See docs/remoting.md."""

from .server import RemotingAdapter

__all__ = ["RemotingAdapter"]
