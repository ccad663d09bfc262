"""Connection and publish-rate limits shared by every listener (docs/limits.md).

Protocol-neutral: token buckets, connection counters per listener, per user and a connection-rate
bucket per source address. Each adapter asks `Limiter` at its accept and publish points and answers
with its own protocol's backpressure (CONNACK 0x97, connection.close 530, HTTP 503/429, gRPC 42900,
paused reads); every refusal or throttle is counted in `Limiter.refusals` for /metrics.

Hand-written rather than a rate-limiting library: the buckets sit on the message path, where a call
into a generic limiter (locks, clocks per call, async APIs) would cost more than the arithmetic
itself; with limits off an adapter holds no meter at all (one attribute check per publish)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gateway.limits")

DEFAULT_MAX_CONNECTIONS = 100_000
LOG_EVERY_S = 60.0  # a limit's warning is logged at most this often
ADDRESS_TABLE_MAX = 65_536  # per-address rate buckets kept; full (idle) ones are dropped beyond it
HARD_QUOTA_S = 5.0  # a stream publisher more than this many seconds of rate in debt is over its hard quota

# the `limit` label of gateway_limit_refusals_total
MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_USER = "max_connections_per_user"
CONNECTION_RATE = "connection_rate"
FD_RESERVE = "fd_reserve"  # the connection would hold one of the descriptors kept for the store
PUBLISH_RATE = "publish_rate"


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """0 switches a limit off. Rates are per second; `connection_burst` is a number of connections
    (0: as many as `max_connection_rate`, at least 1); `publish_burst` is seconds of rate a client or
    user may send at once (its buckets hold rate × publish_burst)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS  # per listener
    max_connections_per_user: int = 0  # over all listeners
    max_connection_rate: float = 0.0  # new connections per second per source address
    connection_burst: int = 0
    publish_rate_msgs: float = 0.0  # per client connection and, separately, per user
    publish_rate_bytes: float = 0.0  # body bytes; same scopes
    publish_burst: float = 1.0

    @property
    def publish_limited(self) -> bool:
        return self.publish_rate_msgs > 0 or self.publish_rate_bytes > 0


class TokenBucket:
    """`rate` tokens per second up to `capacity`. `take` always takes (the level may go negative:
    debt) and says how long until the debt is repaid; `try_take` takes only what is there."""

    __slots__ = ("rate", "capacity", "level", "stamp")

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = max(capacity, 1.0)
        self.level = self.capacity
        self.stamp = time.monotonic()

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, n: float, now: float) -> float:
        """Take `n`; seconds until the level is back to 0 (0.0 when there was enough)."""
        self._refill(now)
        self.level -= n
        return -self.level / self.rate if self.level < 0 else 0.0

    def try_take(self, n: float, now: float) -> float:
        """Take `n` if there is enough (0.0), else take nothing and return the seconds to wait."""
        self._refill(now)
        if self.level >= n:
            self.level -= n
            return 0.0
        return (min(n, self.capacity) - self.level) / self.rate

    def debt_after(self, n: float, now: float) -> float:
        """Seconds of debt taking `n` would leave (nothing is taken)."""
        self._refill(now)
        return max(0.0, (n - self.level) / self.rate)


class PublishMeter:
    """The message and byte buckets of one scope (a client connection, or a user)."""

    __slots__ = ("msgs", "bytes")

    def __init__(self, s: LimitSettings) -> None:
        b = s.publish_burst
        self.msgs = TokenBucket(s.publish_rate_msgs, s.publish_rate_msgs * b) if s.publish_rate_msgs else None
        self.bytes = (
            TokenBucket(s.publish_rate_bytes, s.publish_rate_bytes * b) if s.publish_rate_bytes else None
        )

    def take(self, msgs: int, nbytes: int, now: float) -> float:
        wait = 0.0
        if self.msgs is not None:
            wait = self.msgs.take(msgs, now)
        if self.bytes is not None:
            wait = max(wait, self.bytes.take(nbytes, now))
        return wait

    def debt_after(self, msgs: int, nbytes: int, now: float) -> float:
        d = 0.0
        if self.msgs is not None:
            d = self.msgs.debt_after(msgs, now)
        if self.bytes is not None:
            d = max(d, self.bytes.debt_after(nbytes, now))
        return d


class ClientMeter:
    """A client's publish budget: its own buckets and its user's (shared by all the user's clients).
    `take` (stream protocols: charge, then pause reading for the returned seconds) and `try_take`
    (request protocols: refuse with the returned Retry-After seconds, nothing charged)."""

    __slots__ = ("own", "user")

    def __init__(self, own: PublishMeter, user: PublishMeter | None) -> None:
        self.own = own
        self.user = user

    def take(self, msgs: int, nbytes: int) -> float:
        now = time.monotonic()
        wait = self.own.take(msgs, nbytes, now)
        if self.user is not None:
            wait = max(wait, self.user.take(msgs, nbytes, now))
        return wait

    def debt_after(self, msgs: int, nbytes: int) -> float:
        now = time.monotonic()
        d = self.own.debt_after(msgs, nbytes, now)
        if self.user is not None:
            d = max(d, self.user.debt_after(msgs, nbytes, now))
        return d

    def try_take(self, msgs: int, nbytes: int) -> float:
        wait = self.debt_after(msgs, nbytes)
        if wait == 0.0:
            self.take(msgs, nbytes)
        return wait


class Limiter:
    """The limits of one gateway process: one per process, handed to every adapter."""

    def __init__(self, settings: LimitSettings | None = None) -> None:
        self.settings = s = settings or LimitSettings()
        self.refusals: Counter = Counter()  # (protocol, limit) -> refused or throttled
        self.connections: Counter = Counter()  # listener -> open connections
        self.opens: Counter = Counter()  # listener -> connections accepted (ever)
        self.closes: Counter = Counter()  # listener -> connections ended (ever)
        self.user_connections: Counter = Counter()  # user -> open connections (all listeners)
        self._addresses: dict[str, TokenBucket] = {}
        self._users: dict[str, PublishMeter] = {}
        self._conn_burst = s.connection_burst or max(1, int(s.max_connection_rate))
        # connections get no descriptor numbered this high (set_fd_reserve; None: no reserve)
        self.fd_ceiling: int | None = None
        self._fd_warned = -LOG_EVERY_S

    # ------------------------------------------------------------------ connections
    def set_fd_reserve(self, fd_limit: int, reserve: int) -> int:
        """Keep the top `reserve` descriptors of `fd_limit` (at most a quarter of it) from
        connections, for the store's files; returns the reserve in force (0: none)."""
        reserve = min(reserve, fd_limit // 4)
        self.fd_ceiling = fd_limit - reserve if reserve > 0 else None
        return reserve

    def in_fd_reserve(self, listener: str, transport: asyncio.BaseTransport) -> bool:
        """Whether a connection just accepted on `listener` holds a descriptor of the reserve: then
        it is closed at once, without an answer (its descriptor is what the reserve keeps free),
        counted in `refusals` and logged (once a minute). The kernel gives a new socket the lowest
        free descriptor, so one numbered `fd_ceiling` or more means every one below is taken, and
        no connection ever holds a descriptor of the reserve for longer than this call."""
        if self.fd_ceiling is None:
            return False
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < self.fd_ceiling:
            return False
        transport.abort()  # type: ignore[attr-defined]
        self.refusals[(listener, FD_RESERVE)] += 1
        now = time.monotonic()
        if now - self._fd_warned >= LOG_EVERY_S:
            self._fd_warned = now
            log.warning(
                "connections refused: descriptor %d is in the reserve kept for the store's files (%d "
                "and up); open connections stay, new ones are taken again once some close",
                fd,
                self.fd_ceiling,
            )
        return True

    def accept(self, listener: str, address: str) -> str | None:
        """A connection from `address` (host, no port) arrives on `listener`: None and counted
        (call `closed` when it ends), else the limit it is over (counted in `refusals`)."""
        s = self.settings
        if s.max_connection_rate > 0 and not self._address_ok(address):
            self.refusals[(listener, CONNECTION_RATE)] += 1
            return CONNECTION_RATE
        if s.max_connections and self.connections[listener] >= s.max_connections:
            self.refusals[(listener, MAX_CONNECTIONS)] += 1
            return MAX_CONNECTIONS
        self.connections[listener] += 1
        self.opens[listener] += 1
        return None

    def closed(self, listener: str) -> None:
        self.connections[listener] -= 1
        self.closes[listener] += 1

    def _address_ok(self, address: str) -> bool:
        b = self._addresses.get(address)
        now = time.monotonic()
        if b is None:
            if len(self._addresses) >= ADDRESS_TABLE_MAX:
                self._prune_addresses(now)
            b = self._addresses[address] = TokenBucket(self.settings.max_connection_rate, self._conn_burst)
        return b.try_take(1, now) == 0.0

    def _prune_addresses(self, now: float) -> None:
        for a, b in list(self._addresses.items()):
            b._refill(now)
            if b.level >= b.capacity:
                del self._addresses[a]
        if len(self._addresses) >= ADDRESS_TABLE_MAX:  # every address busy: forget the oldest half
            for a in list(self._addresses)[: ADDRESS_TABLE_MAX // 2]:
                del self._addresses[a]

    def login(self, listener: str, user: str | None) -> bool:
        """A connection authenticated as `user`: True and counted (call `logout`), False when the
        user is at `max_connections_per_user` (counted in `refusals`). Anonymous ones are not counted."""
        limit = self.settings.max_connections_per_user
        if not limit or not user:
            return True
        if self.user_connections[user] >= limit:
            self.refusals[(listener, MAX_CONNECTIONS_PER_USER)] += 1
            return False
        self.user_connections[user] += 1
        return True

    def logout(self, user: str | None) -> None:
        if self.settings.max_connections_per_user and user:
            n = self.user_connections[user] - 1
            if n > 0:
                self.user_connections[user] = n
            else:
                del self.user_connections[user]

    # ------------------------------------------------------------------ publish rates
    def meter(self, user: str | None) -> ClientMeter | None:
        """A new client's publish meter (None when publish rates are off: nothing to check)."""
        s = self.settings
        if not s.publish_limited:
            return None
        return ClientMeter(PublishMeter(s), self.user_meter(user))

    def user_meter(self, user: str | None) -> PublishMeter | None:
        if not user:
            return None
        m = self._users.get(user)
        if m is None:
            if len(self._users) >= ADDRESS_TABLE_MAX:
                self._users.clear()  # users' buckets refill in publish_burst s: a reset costs little
            m = self._users[user] = PublishMeter(self.settings)
        return m


def host_of(peer: object) -> str:
    """The host part of a transport's `peername` (a tuple), or "" when unknown."""
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class ReadThrottle:
    """Publish-rate backpressure for a stream connection: `charge` bills what was just read and,
    when the client is in debt, pauses reading until the debt is repaid and half a burst saved
    (`pause`/`resume` stop and restart the socket, and may tell the client, e.g. AMQP's
    connection.blocked). `over_hard_quota` says whether a publish would leave more than
    HARD_QUOTA_S seconds of debt (MQTT 5.0 refuses those with 0x97)."""

    __slots__ = ("meter", "limiter", "protocol", "pause", "resume", "paused", "_timer", "_loop")

    def __init__(
        self,
        meter: ClientMeter,
        limiter: Limiter,
        protocol: str,
        pause: Callable[[], object],
        resume: Callable[[], object],
    ) -> None:
        self.meter = meter
        self.limiter = limiter
        self.protocol = protocol
        self.pause = pause
        self.resume = resume
        self.paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def over_hard_quota(self, msgs: int, nbytes: int) -> bool:
        if self.meter.debt_after(msgs, nbytes) > HARD_QUOTA_S:
            self.limiter.refusals[(self.protocol, PUBLISH_RATE)] += 1
            return True
        return False

    def charge(self, msgs: int, nbytes: int) -> None:
        wait = self.meter.take(msgs, nbytes)
        if wait <= 0.0:
            return
        if self.paused:  # read anyway (another pause/resume user resumed it): pause again
            self.pause()
            return
        self.paused = True
        self.limiter.refusals[(self.protocol, PUBLISH_RATE)] += 1
        self.pause()
        # paused until the debt is repaid and half a burst saved: a client at its limit toggles
        # about twice per burst, not once per message
        self._timer = self._loop.call_later(wait + self.limiter.settings.publish_burst / 2, self._repaid)

    def _repaid(self) -> None:
        self._timer = None
        wait = self.meter.take(0, 0)
        if wait > 0.0:
            self._timer = self._loop.call_later(wait, self._repaid)
            return
        self.paused = False
        self.resume()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
