"""The states of an MQTT connection's session (session.py) and what CONNECT announces."""

CONNECTING, AUTHORIZING, CONNECTED, CLOSED = range(4)
TOPIC_ALIAS_MAXIMUM = 64  # inbound aliases this server accepts (resolved by the codec)
