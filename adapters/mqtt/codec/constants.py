"""Wire constants of MQTT 3.1, 3.1.1 and 5.0: versions, packet types, reason codes."""

from __future__ import annotations

from enum import IntEnum

MQTT_3_1 = 3  # protocol level of MQTT 3.1 ("MQIsdp")
MQTT_3_1_1 = 4  # protocol level of MQTT 3.1.1 ("MQTT")
MQTT_5 = 5  # protocol level of MQTT 5.0 ("MQTT")

PROTOCOL_NAMES = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}

#: Largest value a four-byte Variable Byte Integer can hold (also the largest Remaining Length).
MAX_VBI = 268_435_455
#: Largest possible packet: 1 type byte + 4 length bytes + MAX_VBI.
MAX_PACKET_SIZE = MAX_VBI + 5


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5.0 only (reserved in 3.1.1)


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (spec 2.4). Several names share a value, as in the spec's table."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackReturnCode(IntEnum):
    """MQTT 3.1 / 3.1.1 CONNACK return codes (3.1.1 table 3.1)."""

    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


#: 3.1.1 SUBACK failure return code.
SUBACK_FAILURE_V3 = 0x80

#: The 5.0 reason codes that have a 3.1.1 CONNACK return code equivalent.
V5_TO_V3_CONNACK = {
    ReasonCode.SUCCESS: ConnackReturnCode.ACCEPTED,
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnackReturnCode.IDENTIFIER_REJECTED,
    ReasonCode.SERVER_UNAVAILABLE: ConnackReturnCode.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_BUSY: ConnackReturnCode.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_SHUTTING_DOWN: ConnackReturnCode.SERVER_UNAVAILABLE,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED: ConnackReturnCode.NOT_AUTHORIZED,
    ReasonCode.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
    ReasonCode.BAD_AUTHENTICATION_METHOD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
}


def connack_code(reason: int, version: int) -> int:
    """The CONNACK code to put on the wire for `reason` (a 5.0 reason code) in `version`.

    For 3.1/3.1.1 a reason without an equivalent maps to 3 (Server unavailable)."""
    if version == MQTT_5:
        return int(reason)
    return int(V5_TO_V3_CONNACK.get(reason, ConnackReturnCode.SERVER_UNAVAILABLE))


_R = ReasonCode
#: Reason codes each 5.0 packet may carry (spec 3.x.2.1 tables).
VALID_REASON_CODES: dict[int, frozenset[int]] = {
    PacketType.CONNACK: frozenset(
        {
            0x00,
            0x80,
            0x81,
            0x82,
            0x83,
            0x84,
            0x85,
            0x86,
            0x87,
            0x88,
            0x89,
            0x8A,
            0x8C,
            0x90,
            0x95,
            0x97,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9F,
        }
    ),
    PacketType.PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREL: frozenset({0x00, 0x92}),
    PacketType.PUBCOMP: frozenset({0x00, 0x92}),
    PacketType.SUBACK: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    PacketType.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    PacketType.DISCONNECT: frozenset(
        {
            0x00,
            0x04,
            0x80,
            0x81,
            0x82,
            0x83,
            0x87,
            0x89,
            0x8B,
            0x8D,
            0x8E,
            0x8F,
            0x90,
            0x93,
            0x94,
            0x95,
            0x96,
            0x97,
            0x98,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9E,
            0x9F,
            0xA0,
            0xA1,
            0xA2,
        }
    ),
    PacketType.AUTH: frozenset({0x00, 0x18, 0x19}),
}
#: 3.1.1 SUBACK return codes.
VALID_SUBACK_V3 = frozenset({0x00, 0x01, 0x02, 0x80})
del _R
