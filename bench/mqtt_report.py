"""The report of bench/mqtt_bench.py: figures per broker, ratios against the peers, the targets
(met or not), the `--json` object and the printed table."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from common import fmt

BROKERS = ("gateway", "mosquitto", "amqtt")
OURS = "gateway"
MIB = 1 << 20
GIB = 1 << 30

# (key, label, higher is better)
FIGURES: list[tuple[str, str, bool]] = [
    ("qos0_msgs_per_s", "QoS 0 publish, msg/s", True),
    ("qos1_msgs_per_s", "QoS 1 publish, msg/s", True),
    ("fanout_deliveries_per_s", "fan-out deliveries/s", True),
    ("p50_ms_at_5k", "p50 latency ms @5k/s", False),
    ("p99_ms_at_5k", "p99 latency ms @5k/s", False),
    ("cpu_us_per_qos0_msg", "server CPU µs/QoS0 msg", False),
    ("cpu_us_per_qos1_msg", "server CPU µs/QoS1 msg", False),
    ("cpu_us_per_fanout_delivery", "server CPU µs/delivery", False),
    ("fixed_publish_msgs_per_s", "fixed rate: published msg/s", True),
    ("fixed_delivered_msgs_per_s", "fixed rate: delivered msg/s", True),
    ("fixed_p50_ms", "fixed rate: p50 latency ms", False),
    ("fixed_p99_ms", "fixed rate: p99 latency ms", False),
    ("cpu_us_per_fixed_msg", "server CPU µs/fixed-rate msg", False),
    ("idle_conns_per_gib", "idle conns per GiB RSS", True),
    ("idle_conn_rss_mib_per_10k", "RSS MiB / 10k idle", False),
]


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b > 0 and a >= 0:
        return a / b
    return None


TARGETS: list[tuple[str, str, Callable[[dict[str, Any]], Any], str, float]] = [
    ("qos1_vs_amqtt", "QoS 1 throughput >= 5x amqtt", lambda r: r["qos1_ratio_vs_amqtt"], ">=", 5.0),
    (
        "qos1_vs_mosquitto",
        "QoS 1 throughput >= 0.5x Mosquitto",
        lambda r: r["qos1_ratio_vs_mosquitto"],
        ">=",
        0.5,
    ),
    ("cpu_per_qos1", "server CPU per QoS 1 msg <= 20 µs", lambda r: r["cpu_us_per_qos1_msg"], "<=", 20.0),
    ("p99_at_5k", "p99 latency at 5k msg/s <= 10 ms", lambda r: r["p99_ms_at_5k"], "<=", 10.0),
    (
        "cpu_fixed_vs_mosquitto",
        "server CPU/msg at 10k msg/s <= 1.0x Mosquitto",
        lambda r: r["cpu_ratio_vs_mosquitto_at_10k"],
        "<=",
        1.0,
    ),
    (
        "idle_rss",
        "10k idle connections <= 500 MiB RSS",
        lambda r: r["idle_conn_rss_mib_per_10k"],
        "<=",
        500.0,
    ),
]


def build_report(brokers: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    ours = brokers.get(OURS, {})
    ratios: dict[str, dict[str, float | None]] = {}
    for peer, r in brokers.items():
        if peer == OURS:
            continue
        ratios[peer] = {k: _ratio(ours.get(k), r.get(k)) for k, _, _ in FIGURES}
    report: dict[str, Any] = {
        "qos1_ratio_vs_mosquitto": ratios.get("mosquitto", {}).get("qos1_msgs_per_s"),
        "qos1_ratio_vs_amqtt": ratios.get("amqtt", {}).get("qos1_msgs_per_s"),
        "cpu_us_per_qos1_msg": ours.get("cpu_us_per_qos1_msg"),
        "p99_ms_at_5k": ours.get("p99_ms_at_5k"),
        "idle_conn_rss_mib_per_10k": ours.get("idle_conn_rss_mib_per_10k"),
        # fixed-rate phase (QoS 1 publish + deliver at --fixed-rate): gateway / Mosquitto CPU per message
        "cpu_ratio_vs_mosquitto_at_10k": ratios.get("mosquitto", {}).get("cpu_us_per_fixed_msg"),
    }
    targets = {}
    for key, label, get, op, bound in TARGETS:
        v = get(report)
        met = None if v is None else (v >= bound if op == ">=" else v <= bound)
        targets[key] = {"target": label, "value": v, "met": met}
    report["targets"] = targets
    report["ratios"] = ratios
    report["brokers"] = brokers
    report["config"] = {
        "brokers": args.broker_list,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "publishers": args.publishers,
        "subscribers": args.subscribers,
        "idle_conns": args.idle_conns,
        "payload_bytes": args.payload,
        "qos1_window": args.window,
        "latency_rate": args.latency_rate,
        "fixed_rate": args.fixed_rate,
        "fixed_publishers": args.fixed_publishers,
        "p99_runs": args.p99_runs,
        "generator_procs": args.procs,
        "server_cpu": args.server_cpu,
        "gen_cpus": args.gen_cpu_list,
        "event_loop_generator": args.loop,
        "mqtt_version": "3.1.1",
        "gateway_flush": brokers.get(OURS, {}).get("info", {}).get("flush"),
        "cpus_online": os.cpu_count(),
        "quick": args.quick,
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    brokers: dict[str, dict[str, Any]] = report["brokers"]
    names = list(brokers)
    peers = [n for n in names if n != OURS] if OURS in brokers else []
    cols = names + [f"gw/{p}" for p in peers]
    w0 = max(len(lbl) for _, lbl, _ in FIGURES) + 3
    print(f"{'figure':<{w0}}" + "".join(f"{c:>14}" for c in cols))
    for key, label, up in FIGURES:
        row = f"{label + (' ↑' if up else ' ↓'):<{w0}}"
        row += "".join(f"{fmt(brokers[n].get(key)):>14}" for n in names)
        row += "".join(f"{fmt(report['ratios'][p].get(key)):>14}" for p in peers)
        print(row)
    print("\n(↑ higher is better, ↓ lower is better; gw/peer = our figure divided by the peer's)")
    for n in names:
        b = brokers[n]
        if "error" in b:
            print(f"{n}: could not run: {b['error'].splitlines()[0]}")
        for phase, d in b.get("details", {}).items():
            if "error" in d:
                print(f"{n} {phase}: failed: {d['error'].splitlines()[0]}")
                if d.get("server_log"):
                    print(f"    {n} log: {d['server_log']}")
            elif d.get("bottleneck") in ("generator", "server and generator"):
                print(
                    f"{n} {phase}: generator saturated (generator CPU {d['gen_util']:.0%}, "
                    f"server {d['server_util']:.0%})"
                )
            if d.get("other_util", 0) > 0.15:
                print(
                    f"{n} {phase}: other processes used {d['other_util']:.2f} CPUs during the run: "
                    "figures disturbed"
                )
            if d.get("skipped"):
                print(f"{n} {phase}: skipped: {d['skipped']}")
            elif d.get("behind_ticks"):
                acked = d.get("rate_acked", d.get("fixed_publish_msgs_per_s", 0))
                print(
                    f"{n} {phase}: could not keep {d.get('rate_target', 0):.0f} msg/s "
                    f"(acked {acked:.0f}/s): latency includes queueing"
                )
    print("\ntargets (our gateway):")
    for t in report["targets"].values():
        mark = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        print(f"  {t['target']:<42} {fmt(t['value']):>10}  {mark}")
    gw = brokers.get(OURS)
    if gw and "info" in gw:
        print(
            f"\ngateway flush policy: {gw['info'].get('flush')}, data dir filesystem: "
            f"{gw['info'].get('data_fs')}; CPU incl. fsync helper: "
            f"{fmt(gw.get('cpu_us_per_qos1_msg_incl_children'))} µs/QoS1 msg"
        )
    c = report["config"]
    print(
        f"server on CPU {c['server_cpu']}, generator ({c['generator_procs']} processes) on CPUs "
        f"{c['gen_cpus']}; {c['publishers']} publishers, {c['subscribers']} subscribers, "
        f"{c['payload_bytes']} B payloads, {c['duration_s']} s runs, MQTT 3.1.1"
    )


# ---------------------------------------------------------------------------- main
