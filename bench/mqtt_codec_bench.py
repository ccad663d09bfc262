"""Micro-benchmark of the MQTT codec hot path: decode/encode µs per PUBLISH (QoS 1, 100-byte payload)
and per PUBACK, for MQTT 3.1.1 and 5.0.

    .venv/bin/python bench/mqtt_codec_bench.py [-n 200000]

Decode figures are per packet through `Decoder.feed` + iteration, both with one packet per feed
(a read that returned exactly one frame) and with 100 packets per feed (a busy connection).
Timings are the best of several runs (the machine may be shared); the last line adds up the codec
work of one QoS 1 message through the server: decode the inbound PUBLISH, encode its PUBACK,
encode the outbound PUBLISH to one subscriber, decode that subscriber's PUBACK.
"""

from __future__ import annotations

import argparse
import sys
import time

from adapters.mqtt.codec import (
    MQTT_3_1_1,
    MQTT_5,
    Decoder,
    Publish,
    encode,
    encode_puback,
    encode_publish,
)

TOPIC = "devices/42/telemetry"
PAYLOAD = bytes(range(100))


REPEAT = 7


def best_of(fn, n: int, repeat: int | None = None) -> float:
    """Best per-call time in µs over `repeat` runs of `n` calls."""
    best = float("inf")
    for _ in range(repeat or REPEAT):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def bench(version: int, n: int) -> list[tuple[str, float]]:
    pub = encode_publish(TOPIC, PAYLOAD, 1, 1234, version=version)
    ack = encode_puback(1234, version=version)
    rows = []

    def decode_each(frame: bytes):
        def run(k: int) -> None:
            dec = Decoder(version=version)
            feed = dec.feed
            nxt = dec.next_packet
            for _ in range(k):
                feed(frame)
                nxt()

        return run

    def decode_batch(frame: bytes):
        batch = frame * 100

        def run(k: int) -> None:
            dec = Decoder(version=version)
            for _ in range(k // 100):
                dec.feed(batch)
                for _p in dec:
                    pass

        return run

    def enc_publish(k: int) -> None:
        for _ in range(k):
            encode_publish(TOPIC, PAYLOAD, 1, 1234, version=version)

    topic_b = TOPIC.encode()

    def enc_publish_bytes_topic(k: int) -> None:
        for _ in range(k):
            encode_publish(topic_b, PAYLOAD, 1, 1234, version=version)

    pkt = Publish(TOPIC, PAYLOAD, 1, packet_id=1234)

    def enc_generic(k: int) -> None:
        for _ in range(k):
            encode(pkt, version)

    def enc_puback(k: int) -> None:
        for _ in range(k):
            encode_puback(1234, version=version)

    rows.append(("decode PUBLISH (1 per feed)", best_of(decode_each(pub), n)))
    rows.append(("decode PUBLISH (100 per feed)", best_of(decode_batch(pub), n)))
    rows.append(("decode PUBACK (1 per feed)", best_of(decode_each(ack), n)))
    rows.append(("decode PUBACK (100 per feed)", best_of(decode_batch(ack), n)))
    rows.append(("encode_publish (str topic)", best_of(enc_publish, n)))
    rows.append(("encode_publish (bytes topic)", best_of(enc_publish_bytes_topic, n)))
    rows.append(("encode(Publish) generic", best_of(enc_generic, n)))
    rows.append(("encode_puback", best_of(enc_puback, n)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200_000, help="calls per timed run")
    ap.add_argument("-r", "--repeat", type=int, default=7, help="timed runs; the best is reported")
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    print(f"python {sys.version.split()[0]}, topic {TOPIC!r}, payload {len(PAYLOAD)} B, QoS 1")
    for version, label in ((MQTT_3_1_1, "3.1.1"), (MQTT_5, "5.0")):
        print(f"MQTT {label}")
        rows = dict(bench(version, args.n))
        for name, us in rows.items():
            print(f"  {name:32s} {us:6.3f} µs")
        total = (
            rows["decode PUBLISH (1 per feed)"]
            + rows["encode_puback"]
            + rows["encode_publish (bytes topic)"]
            + rows["decode PUBACK (1 per feed)"]
        )
        print(f"  {'QoS 1 message, codec total':32s} {total:6.3f} µs  (in: decode PUBLISH + encode PUBACK;")
        print(f"  {'':32s} {'':9s}out: encode PUBLISH + decode PUBACK)")


if __name__ == "__main__":
    main()
