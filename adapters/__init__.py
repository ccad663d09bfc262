"""Protocol adapters (MQTT, AMQP 0-9-1, CloudEvents HTTP, RocketMQ gRPC and remoting)."""
