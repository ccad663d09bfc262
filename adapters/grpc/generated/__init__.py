"""Generated from adapters/grpc/proto (apache/rocketmq-apis v2.1.2) by `python -m adapters.grpc.regen`. Do not edit."""
