"""MQTT 3.1.1 / 5.0 adapter. The sans-IO codec is in `adapters.mqtt.codec`; the server lands with issue 4."""
