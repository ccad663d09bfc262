"""AMQP 0-9-1 adapter (RabbitMQ-compatible). So far only the sans-IO wire codec (codec/)."""
