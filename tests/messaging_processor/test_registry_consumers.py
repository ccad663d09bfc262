"""The client registry's consumer list: registered consuming clients (gRPC, 4.x) plus what each
adapter's report gives, filtered by group and by topic ("*": a consumer of every topic)."""

from __future__ import annotations

from messaging_processor import ClientInfo, ClientKind
from messaging_processor.registry import ClientRegistry, ConsumerRow


def test_consumers_merge_registered_clients_and_reports():
    reg = ClientRegistry()
    reg.register(ClientInfo("p-1", "grpc", ClientKind.PRODUCER, topics=frozenset({"t"})))  # not a consumer
    reg.register(ClientInfo("c-1", "grpc", ClientKind.SIMPLE_CONSUMER, group="G", topics=frozenset({"t"})))
    live = [ConsumerRow("amqp", "a-1", "q", frozenset({"q"}), details={"channel": 1, "unacked": 2})]
    report = live.copy
    reg.add_consumer_report(report)
    reg.add_consumer_report(
        lambda: [ConsumerRow("mqtt", "m-1", "", frozenset({"*"}), details={"filter": "#"})]
    )
    assert [(r.protocol, r.client_id) for r in reg.consumers()] == [
        ("grpc", "c-1"),
        ("amqp", "a-1"),
        ("mqtt", "m-1"),
    ]
    assert reg.consumers()[0].details == {"kind": "simple_consumer"}
    assert [r.client_id for r in reg.consumers(group="q")] == ["a-1"]
    assert [r.client_id for r in reg.consumers(topic="t")] == ["c-1", "m-1"]  # m-1 reads every topic
    live.clear()  # the report is asked each time: what the adapter has now
    assert [r.client_id for r in reg.consumers(group="q")] == []
    reg.remove_consumer_report(report)
    assert [r.client_id for r in reg.reported_consumers()] == ["m-1"]
    assert reg.list() == [reg.get("grpc", "p-1"), reg.get("grpc", "c-1")]  # registrations untouched
