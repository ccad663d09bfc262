"""One slotted dataclass per MQTT control packet, shared by 3.1, 3.1.1 and 5.0.

Fields a version does not have keep their defaults there (e.g. `properties` stays empty and
`reason_code` 0 in 3.1.1). `properties` dicts are keyed by `PropertyId` (see properties.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .constants import MQTT_3_1_1, PacketType

Properties = dict[Any, Any]


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)  # 5.0 Will Properties


@dataclass(slots=True)
class Connect:
    packet_type: ClassVar[int] = PacketType.CONNECT
    client_id: str = ""
    protocol_level: int = MQTT_3_1_1  # 3 (MQTT 3.1), 4 (3.1.1) or 5 (5.0)
    clean_start: bool = True  # "Clean Session" in 3.1/3.1.1
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)
    protocol_name: str | None = None  # None: the name that goes with protocol_level


@dataclass(slots=True)
class Connack:
    packet_type: ClassVar[int] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0  # 5.0 reason code, or the 3.1/3.1.1 return code
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    packet_type: ClassVar[int] = PacketType.PUBLISH
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # present iff qos > 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Puback:
    packet_type: ClassVar[int] = PacketType.PUBACK
    packet_id: int = 0
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrec:
    packet_type: ClassVar[int] = PacketType.PUBREC
    packet_id: int = 0
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrel:
    packet_type: ClassVar[int] = PacketType.PUBREL
    packet_id: int = 0
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubcomp:
    packet_type: ClassVar[int] = PacketType.PUBCOMP
    packet_id: int = 0
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0  # maximum QoS
    no_local: bool = False  # 5.0
    retain_as_published: bool = False  # 5.0
    retain_handling: int = 0  # 5.0: 0 send at subscribe, 1 only if new, 2 never


@dataclass(slots=True)
class Subscribe:
    packet_type: ClassVar[int] = PacketType.SUBSCRIBE
    packet_id: int = 0
    subscriptions: list[Subscription] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    packet_type: ClassVar[int] = PacketType.SUBACK
    packet_id: int = 0
    reason_codes: list[int] = field(default_factory=list)  # 3.1.1 return codes or 5.0 reason codes
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_type: ClassVar[int] = PacketType.UNSUBSCRIBE
    packet_id: int = 0
    topic_filters: list[str] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    packet_type: ClassVar[int] = PacketType.UNSUBACK
    packet_id: int = 0
    reason_codes: list[int] = field(default_factory=list)  # 5.0 only (empty in 3.1.1)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    packet_type: ClassVar[int] = PacketType.PINGREQ


@dataclass(slots=True)
class Pingresp:
    packet_type: ClassVar[int] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    packet_type: ClassVar[int] = PacketType.DISCONNECT
    reason_code: int = 0  # 5.0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    packet_type: ClassVar[int] = PacketType.AUTH
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
