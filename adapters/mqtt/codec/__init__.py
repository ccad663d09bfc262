"""Sans-IO MQTT codec for MQTT 3.1, 3.1.1 and 5.0 (server and client side), in the style of h11.

Pure functions and a per-connection state machine over bytes; no sockets, no asyncio, no threads:
the transport feeds received bytes to a `Decoder` and writes the bytes the encoders return.

    from adapters.mqtt.codec import Decoder, MQTTCodecError, encode, encode_puback

    dec = Decoder(max_packet_size=1 << 20)        # server side: first packet must be CONNECT
    try:
        dec.feed(data)
        for packet in dec:                        # Connect, Publish, Puback, Subscribe, ...
            ...                                   # dec.version: 3, 4 or 5 once CONNECT is out
    except MQTTCodecError as e:                   # e.reason (5.0 code), e.action, e.response()
        transport.write(e.response()); transport.close()

Why hand-written: no maintained Python package decodes both 3.1.1 and 5.0 on the server side,
sans-IO, with the limits a server must enforce (packet size before buffering, fixed-header
flags, UTF-8 and topic rules, per-packet property validation) and with error results that say
whether to answer with CONNACK or DISCONNECT. Checked on PyPI: amqtt's codec is 3.1.1 only and
reads from asyncio streams; paho-mqtt's packet code is client-side and interleaved with its
socket loop; `mqttproto` and its fork `moat-lib-mqtt` are sans-IO but MQTT 5.0 only; `mqtt5` is a
Rust extension, 5.0 only; `mqtt-codec` is 3.1.1 only and unmaintained since 2019. The hot path
also has to be fast (the server budget is ~20 µs of CPU per QoS 1 message in total), which wants
a single-pass parser with integer indexing and slicing over `bytes`, precomputed fixed packets
(PINGRESP, DISCONNECT) and length prefixes, and dedicated PUBLISH/PUBACK encoders rather than a
generic field-by-field framework. See bench/mqtt_codec_bench.py for the figures.

Modules: constants (versions, PacketType, ReasonCode, ConnackReturnCode), errors (MQTTCodecError,
ErrorAction), packets (dataclasses), properties (PropertyId, validation tables), wire (primitives,
UTF-8 policy), decoder (Decoder, decode_packet), encoder (encode and fast encoders), aliases
(`OutboundAliases`, server-to-client topic aliases), topics (topic
validation, `topic_matches`, `parse_shared`, `TopicTrie`).
"""

from .aliases import OutboundAliases
from .constants import (
    MAX_PACKET_SIZE,
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    ConnackReturnCode,
    PacketType,
    ReasonCode,
    connack_code,
)
from .decoder import Decoder, decode_packet
from .encoder import (
    DISCONNECT_V3,
    PINGREQ,
    PINGRESP,
    encode,
    encode_auth,
    encode_connack,
    encode_connect,
    encode_disconnect,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
    encode_suback,
    encode_subscribe,
    encode_unsuback,
    encode_unsubscribe,
)
from .errors import ErrorAction, MQTTCodecError
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import PropertyId, PropertyType, decode_properties, encode_properties
from .topics import TopicTrie, parse_shared, topic_matches, validate_topic_filter, validate_topic_name
from .wire import validate_text

__all__ = [
    "MAX_PACKET_SIZE",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "ConnackReturnCode",
    "PacketType",
    "ReasonCode",
    "connack_code",
    "OutboundAliases",
    "Decoder",
    "decode_packet",
    "DISCONNECT_V3",
    "PINGREQ",
    "PINGRESP",
    "encode",
    "encode_auth",
    "encode_connack",
    "encode_connect",
    "encode_disconnect",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_pubrec",
    "encode_pubrel",
    "encode_suback",
    "encode_subscribe",
    "encode_unsuback",
    "encode_unsubscribe",
    "ErrorAction",
    "MQTTCodecError",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "Packet",
    "Pingreq",
    "Pingresp",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "PropertyId",
    "PropertyType",
    "decode_properties",
    "encode_properties",
    "TopicTrie",
    "parse_shared",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
    "validate_text",
]
