"""Micro-benchmark of the AMQP 0-9-1 codec hot path, in ns per message (100-byte body).

    .venv/bin/python bench/amqp_codec_bench.py [-n 100000] [-r 7]

Inbound (server side): basic.publish + content header + body frame, decoded through
`Decoder.feed` + `next_event` into one Message, with one message per feed (a read that returned
exactly one publish) and with 100 per feed (a busy publisher); with the properties decoded
(default) or kept as raw bytes (decode_properties=False, decoded on first access); and basic.ack
from a consumer. Outbound: basic.deliver + header + body into one bytes object, forwarding the
received property bytes or encoding a BasicProperties; basic.ack as a publisher confirm. pamqp
(aio-pika's codec) doing the same frames is printed for reference. Timings are the best of several
runs (the machine may be shared); the last line adds up the codec work of one message through the
server with publisher confirms and one consumer acking.
"""

from __future__ import annotations

import argparse
import sys
import time

from adapters.amqp.codec import (
    BasicProperties,
    Decoder,
    encode_basic_ack,
    encode_deliver,
    encode_properties,
    encode_publish,
)

BODY = bytes(range(100))
PROPS = BasicProperties(content_type="application/json", delivery_mode=2)
PROPS_HEADERS = BasicProperties(
    content_type="application/json",
    delivery_mode=2,
    message_id="4f1c0e6a-91d2-4b7e-a3f0-0d4b7c9e5a21",
    timestamp=1_700_000_000,
    headers={"x-trace-id": "abc123", "x-retries": 2, "source": "billing"},
)
EXCHANGE, ROUTING_KEY, CTAG = "amq.topic", "orders.eu.created", "amq.ctag-2f9HcW1fRk3Zg"
FRAME_MAX = 131072
REPEAT = 7


def best_of(fn, n: int) -> float:
    """Best per-call time in ns over REPEAT runs of `n` calls."""
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


def decode_each(frames: bytes, **options):
    def run(k: int) -> None:
        dec = Decoder(expect_header=False, frame_max=FRAME_MAX, **options)
        feed = dec.feed
        nxt = dec.next_event
        for _ in range(k):
            feed(frames)
            nxt()

    return run


def decode_batch(frames: bytes, **options):
    batch = frames * 100

    def run(k: int) -> None:
        dec = Decoder(expect_header=False, frame_max=FRAME_MAX, **options)
        for _ in range(k // 100):
            dec.feed(batch)
            for _ev in dec:
                pass

    return run


def ours() -> dict[str, float]:
    n = ARGS.n
    publish = encode_publish(1, EXCHANGE, ROUTING_KEY, PROPS, BODY, FRAME_MAX)
    publish_h = encode_publish(1, EXCHANGE, ROUTING_KEY, PROPS_HEADERS, BODY, FRAME_MAX)
    ack = encode_basic_ack(1, 123456)
    raw = encode_properties(PROPS)
    ctag, ex, rk = CTAG.encode(), EXCHANGE.encode(), ROUTING_KEY.encode()

    def enc_deliver_raw(k: int) -> None:
        for i in range(k):
            encode_deliver(1, ctag, i, False, ex, rk, raw, BODY, FRAME_MAX)

    def enc_deliver_props(k: int) -> None:
        for i in range(k):
            encode_deliver(1, CTAG, i, False, EXCHANGE, ROUTING_KEY, PROPS, BODY, FRAME_MAX)

    def enc_confirm(k: int) -> None:
        for i in range(k):
            encode_basic_ack(1, i)

    rows = {}
    rows["decode publish+header+body (1 per feed)"] = best_of(decode_each(publish), n)
    rows["decode publish+header+body (100 per feed)"] = best_of(decode_batch(publish), n)
    rows["  same, raw properties (lazy)"] = best_of(decode_each(publish, decode_properties=False), n)
    rows["  same, 5 properties + 3 headers"] = best_of(decode_each(publish_h), n)
    rows["decode basic.ack (1 per feed)"] = best_of(decode_each(ack), n)
    rows["decode basic.ack (100 per feed)"] = best_of(decode_batch(ack), n)
    rows["encode deliver+header+body (raw props)"] = best_of(enc_deliver_raw, n)
    rows["encode deliver+header+body (BasicProperties)"] = best_of(enc_deliver_props, n)
    rows["encode basic.ack (confirm)"] = best_of(enc_confirm, n)
    return rows


def pamqp_reference() -> dict[str, float]:
    try:
        from pamqp import body, commands, frame, header
    except ImportError:  # pragma: no cover
        return {}
    n = max(ARGS.n // 10, 1000)
    props = commands.Basic.Properties(content_type="application/json", delivery_mode=2)
    publish = encode_publish(1, EXCHANGE, ROUTING_KEY, PROPS, BODY, FRAME_MAX)

    def unmarshal(k: int) -> None:
        for _ in range(k):
            data = publish
            while data:
                used, _channel, _frame = frame.unmarshal(data)
                data = data[used:]

    def marshal(k: int) -> None:
        for i in range(k):
            b"".join(
                (
                    frame.marshal(commands.Basic.Deliver(CTAG, i + 1, False, EXCHANGE, ROUTING_KEY), 1),
                    frame.marshal(header.ContentHeader(0, len(BODY), props), 1),
                    frame.marshal(body.ContentBody(BODY), 1),
                )
            )

    return {
        "pamqp: unmarshal publish+header+body": best_of(unmarshal, n),
        "pamqp: marshal deliver+header+body": best_of(marshal, n),
    }


def main() -> None:
    global ARGS, REPEAT
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=100_000, help="calls per timed run")
    ap.add_argument("-r", "--repeat", type=int, default=7, help="timed runs; the best is reported")
    ARGS = ap.parse_args()
    REPEAT = ARGS.repeat
    print(f"python {sys.version.split()[0]}, body {len(BODY)} B, frame_max {FRAME_MAX}, ns per message")
    rows = ours()
    for name, ns in rows.items():
        print(f"  {name:46s} {ns:8.0f} ns")
    total = (
        rows["decode publish+header+body (1 per feed)"]
        + rows["encode basic.ack (confirm)"]
        + rows["encode deliver+header+body (raw props)"]
        + rows["decode basic.ack (1 per feed)"]
    )
    print(f"  {'message through the server, codec total':46s} {total:8.0f} ns")
    print(f"  {'':46s} (in: decode publish + encode confirm; out: encode deliver + decode ack)")
    for name, ns in pamqp_reference().items():
        print(f"  {name:46s} {ns:8.0f} ns")


ARGS = argparse.Namespace(n=100_000)

if __name__ == "__main__":
    main()
