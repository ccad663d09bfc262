"""The descriptor reserve's rule (adapters/limits.py, `Limiter.in_fd_reserve`): a connection whose
socket got a descriptor at or above the ceiling is aborted and counted; the reserve is at most a
quarter of the limit. The process-level behaviour is in tests/gateway/test_os_limits.py."""

from __future__ import annotations

import socket

from adapters.limits import FD_RESERVE, Limiter


class Transport:
    """The two transport calls the rule makes, over a real socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.aborted = False

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None

    def abort(self) -> None:
        self.aborted = True


def test_a_descriptor_of_the_reserve_is_refused_and_one_below_is_not():
    with socket.socket() as s:
        fd = s.fileno()
        lim = Limiter()
        assert lim.set_fd_reserve(100, 40) == 25  # at most a quarter of the limit
        assert lim.fd_ceiling == 75
        assert lim.set_fd_reserve(fd + 100, 10) == 10  # ceiling fd + 90: the socket is below it
        below = Transport(s)
        assert not lim.in_fd_reserve("mqtt", below) and not below.aborted
        assert lim.set_fd_reserve(fd + 1, 1) == 1  # the socket's own descriptor is the reserve
        at = Transport(s)
        assert lim.in_fd_reserve("amqp", at) and at.aborted
        assert lim.refusals[("amqp", FD_RESERVE)] == 1
        assert lim.refusals[("mqtt", FD_RESERVE)] == 0


def test_no_reserve_refuses_nothing():
    with socket.socket() as s:
        lim = Limiter()
        assert lim.set_fd_reserve(s.fileno(), 0) == 0
        assert lim.fd_ceiling is None
        t = Transport(s)
        assert not lim.in_fd_reserve("mqtt", t) and not t.aborted
