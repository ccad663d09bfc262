"""RocketMQ 5 gRPC adapter: `apache.rocketmq.v2.MessagingService` over grpc.aio, on MessagingProcessor."""

from adapters.grpc.server import GrpcAdapter

__all__ = ["GrpcAdapter"]
