"""Name server for RocketMQ clients: topic route and broker address lookups."""
