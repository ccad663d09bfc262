"""The report of bench/http_bench.py: the best run per phase, ratios against the bare endpoint,
the targets (met or not), the `--json` object and the printed table."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from common import fmt

TARGETS = [
    ("single_ratio_vs_bare", "single-event ingest >= 50% of the bare endpoint", ">=", 0.5),
    ("batched_events_per_s", "batched ingest >= 50,000 events/s", ">=", 50_000.0),
    ("push_events_per_s", "push delivery >= 2,000 events/s", ">=", 2_000.0),
]


def _best(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in runs if "error" not in r and r.get("events_per_s")]
    return max(ok, key=lambda r: r["events_per_s"]) if ok else None


def _get(d: dict[str, Any] | None, key: str) -> Any:
    return None if d is None else d.get(key)


def build_report(
    runs: dict[str, list[dict[str, Any]]],
    push: dict[str, Any] | None,
    info: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    gw1, bare1 = _best(runs["gateway_single"]), _best(runs["bare_single"])
    gwb, bareb = _best(runs["gateway_batch"]), _best(runs["bare_batch"])
    ratio = None
    if gw1 and bare1 and bare1["events_per_s"] > 0:
        ratio = gw1["events_per_s"] / bare1["events_per_s"]
    rep: dict[str, Any] = {
        "single_ratio_vs_bare": ratio,
        "batched_events_per_s": _get(gwb, "events_per_s"),
        "push_events_per_s": _get(push, "push_events_per_s"),
        "single_events_per_s": _get(gw1, "events_per_s"),
        "bare_single_events_per_s": _get(bare1, "events_per_s"),
        "bare_batch_requests_per_s": _get(bareb, "requests_per_s"),
        "batched_requests_per_s": _get(gwb, "requests_per_s"),
        "single_p50_ms": _get(gw1, "p50_ms"),
        "single_p99_ms": _get(gw1, "p99_ms"),
        "bare_single_p50_ms": _get(bare1, "p50_ms"),
        "bare_single_p99_ms": _get(bare1, "p99_ms"),
        "batched_p50_ms": _get(gwb, "p50_ms"),
        "batched_p99_ms": _get(gwb, "p99_ms"),
        "cpu_us_per_single_event": _get(gw1, "cpu_us_per_event"),
        "cpu_us_per_bare_request": _get(bare1, "cpu_us_per_event"),
        "cpu_us_per_batched_event": _get(gwb, "cpu_us_per_event"),
        "cpu_us_per_push_event": _get(push, "cpu_us_per_event"),
        "single_events_per_server_cpu_s": _get(gw1, "events_per_server_cpu_s"),
        "batched_events_per_server_cpu_s": _get(gwb, "events_per_server_cpu_s"),
        "cpu_us_per_single_event_incl_children": _get(gw1, "cpu_us_per_event_incl_children"),
        "cpu_us_per_batched_event_incl_children": _get(gwb, "cpu_us_per_event_incl_children"),
    }
    # The same comparison by cost: bare CPU per request / ours per event (what the ratio would be
    # with both servers CPU-bound; steadier than rates when other jobs share the machine).
    c_gw, c_bare = _get(gw1, "cpu_us_per_event"), _get(bare1, "cpu_us_per_event")
    rep["single_cpu_ratio_vs_bare"] = c_bare / c_gw if c_gw and c_bare else None
    if len(runs["gateway_single"]) > 1 and len(runs["bare_single"]) > 1:
        pairs = [
            g["events_per_s"] / b["events_per_s"]
            for g, b in zip(runs["gateway_single"], runs["bare_single"], strict=False)
            if g.get("events_per_s") and b.get("events_per_s")
        ]
        rep["single_ratio_per_round"] = pairs
        rep["single_ratio_median_of_rounds"] = statistics.median(pairs) if pairs else None
    targets = {}
    for key, label, op, bound in TARGETS:
        v = rep[key]
        met = None if v is None else (v >= bound if op == ">=" else v <= bound)
        targets[key] = {"target": label, "value": v, "met": met}
    rep["targets"] = targets
    rep["runs"] = runs
    rep["push"] = push
    rep["servers"] = info
    rep["config"] = {
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "conns": args.conns,
        "generator_procs": args.procs,
        "batch": args.batch,
        "payload_bytes": args.payload,
        "push_events": args.push_events,
        "push_inflight": args.push_inflight or None,
        "server_cpu": args.server_cpu,
        "gen_cpus": args.gen_cpu_list,
        "event_loop_generator": args.loop,
        "bare_reads_body": not args.bare_ignore_body,
        "phases": args.phase_list,
        "cpus_online": os.cpu_count(),
        "quick": args.quick,
    }
    return rep


def print_table(rep: dict[str, Any]) -> None:
    rows = []
    for name, label in (
        ("bare_single", "bare endpoint, single"),
        ("gateway_single", "gateway, binary single"),
        ("bare_batch", "bare endpoint, batch of 100"),
        ("gateway_batch", "gateway, batch of 100"),
    ):
        best = _best(rep["runs"].get(name, []))
        if best is None:
            if rep["runs"].get(name):
                rows.append([label, "failed", "", "", "", "", "", ""])
            continue
        rows.append(
            [
                label,
                fmt(best["events_per_s"]),
                fmt(best["requests_per_s"]),
                fmt(best["p50_ms"]),
                fmt(best["p99_ms"]),
                fmt(best["cpu_us_per_event"]),
                f"{best['server_util']:.0%}/{best['gen_util']:.0%}",
                fmt(best["other_util"]),
            ]
        )
    push = rep.get("push")
    if push:
        rows.append(
            [
                "gateway, push to webhook",
                fmt(push.get("push_events_per_s")),
                "",
                "",
                "",
                fmt(push.get("cpu_us_per_event")),
                f"{push.get('server_util', 0):.0%}/{push.get('receiver_util', 0):.0%}",
                fmt(push.get("other_util")),
            ]
        )
    header = [
        "run (best of rounds)",
        "events/s",
        "req/s",
        "p50 ms",
        "p99 ms",
        "srv µs/ev",
        "srv/gen CPU",
        "other CPUs",
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for r in rows:
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    print()
    print(f"single-event ratio gateway / bare: {fmt(rep['single_ratio_vs_bare'])}", end="")
    if rep.get("single_ratio_per_round"):
        print(" (per round: " + ", ".join(fmt(x) for x in rep["single_ratio_per_round"]) + ")")
    else:
        print()
    print(
        "the same by server CPU cost (bare µs per request / ours per event): "
        f"{fmt(rep['single_cpu_ratio_vs_bare'])}"
    )
    print(
        "events per second of server CPU (the cost, not the rate): "
        f"single {fmt(rep['single_events_per_server_cpu_s'])}, "
        f"batched {fmt(rep['batched_events_per_server_cpu_s'])}"
    )
    print(
        "server CPU incl. the fsync helper: "
        f"{fmt(rep['cpu_us_per_single_event_incl_children'])} µs/single event, "
        f"{fmt(rep['cpu_us_per_batched_event_incl_children'])} µs/batched event"
    )
    for name, rs in rep["runs"].items():
        for r in rs:
            if "error" in r:
                print(f"{name}: failed: {r['error'].splitlines()[0]}")
            if r.get("non_2xx"):
                print(f"{name}: {r['non_2xx']} non-2xx answers, e.g. {r.get('error_samples', ['?'])[0]}")
            if r.get("other_util", 0) > 0.15:
                print(
                    f"{name}: other processes used {r['other_util']:.2f} CPUs during the run: "
                    "figures disturbed"
                )
            if r.get("bottleneck") in ("generator", "server and generator"):
                print(
                    f"{name}: generator saturated (generator CPU {r['gen_util']:.0%}, "
                    f"server {r['server_util']:.0%})"
                )
    if push:
        if push.get("error"):
            print(f"push: {push['error']}")
        print(
            f"push: {push.get('received')} of {push.get('events')} events ({push.get('distinct')} distinct), "
            f"first after {fmt(push.get('first_delivery_s'))} s, "
            f"steady {fmt(push.get('steady_events_per_s'))} events/s, "
            f"max_inflight {push.get('max_inflight')}"
        )
    print("\ntargets:")
    for t in rep["targets"].values():
        mark = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        print(f"  {t['target']:<50} {fmt(t['value']):>10}  {mark}")
    c = rep["config"]
    gwinfo = rep["servers"].get("gateway", {})
    print(
        f"\nserver on CPU {c['server_cpu']}, generator ({c['generator_procs']} processes, "
        f"{c['conns']} keep-alive connections) on CPUs {c['gen_cpus']}; {c['duration_s']} s windows, "
        f"{c['rounds']} round(s); gateway flush {gwinfo.get('flush')}, data on {gwinfo.get('data_fs')}; "
        f"bare endpoint reads the body: {c['bare_reads_body']}"
    )


# ---------------------------------------------------------------------------- main
