"""The answers to inbound QoS 1 and 2 PUBLISHes, from the reason codes the Publisher returned
(sans-IO: reason codes in, packet bytes out). MQTT 3.1.1 has no negative PUBACK or PUBREC: a
publish the ACL denies is acknowledged and dropped (as Mosquitto does), any other refusal closes
the connection (None here)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from .codec import MQTT_5, ReasonCode, encode_puback, encode_pubrec
from .codec.constants import VALID_REASON_CODES, PacketType

_PUBACK_CODES = VALID_REASON_CODES[PacketType.PUBACK]  # (PUBREC has the same)

Mark = Callable[[Any, Any, str, int, bool], Awaitable[None]]  # persistence.qos2_mark


class Publishing(Protocol):
    """What `answer` reads of the session whose PUBLISH it answers."""

    version: int
    awaiting_rel: set[int] | frozenset[int]
    pstate: Any  # its persistent session, or None
    broker: Any  # .processor


def puback(version: int, pid: int, rc: int) -> bytes | None:
    """The PUBACK of packet `pid` answered `rc`; None: close the connection instead. A refusal no
    PUBACK may carry (e.g. 0x95, a body over the processor's limit) is answered 0x80."""
    if rc >= 0x80 and version != MQTT_5:
        return encode_puback(pid) if rc == ReasonCode.NOT_AUTHORIZED else None
    return encode_puback(pid, rc if rc in _PUBACK_CODES else ReasonCode.UNSPECIFIED_ERROR, version)


def pubacks(version: int, rcs: Sequence[int], acks: Sequence[tuple[int, int]]) -> bytes | None:
    """The PUBACKs of a batch: `acks` are (index into `rcs`, packet id); None: close instead."""
    if not any(rcs):  # all stored (the common case): plain PUBACKs
        return b"".join([encode_puback(pid) for _, pid in acks])
    out = []
    for i, pid in acks:
        b = puback(version, pid, rcs[i])
        if b is None:
            return None
        out.append(b)
    return b"".join(out)


def denied_qos2(version: int, pid: int, rc: int) -> bytes | None:
    """A 3.1.1 QoS 2 PUBLISH refused with `rc`: the PUBREC of a denied one, else None (close)."""
    return encode_pubrec(pid, 0, version) if rc == ReasonCode.NOT_AUTHORIZED else None


async def answer(
    s: Publishing, send: Awaitable[int], qos: int, pid: int, mark: Mark
) -> tuple[bytes | None, None]:
    """The reply (PUBACK or PUBREC) to one PUBLISH of `s` once its `send` answered; a stored QoS 2
    packet id is marked first (`mark`: persistence.qos2_mark), so that it outlives a restart."""
    rc = await send
    v = s.version
    if qos == 1:
        return puback(v, pid, rc), None
    if rc >= 0x80:
        if v != MQTT_5:
            if rc != ReasonCode.NOT_AUTHORIZED and pid in s.awaiting_rel:
                s.awaiting_rel.discard(pid)  # type: ignore[union-attr]
            return denied_qos2(v, pid, rc), None  # (a denied one then completes normally)
        if pid in s.awaiting_rel:
            s.awaiting_rel.discard(pid)  # type: ignore[union-attr]
    st = s.pstate
    if rc < 0x80 and st is not None:
        await mark(s.broker.processor, st, "i", pid, True)
    return encode_pubrec(pid, rc if rc in _PUBACK_CODES else ReasonCode.UNSPECIFIED_ERROR, v), None
