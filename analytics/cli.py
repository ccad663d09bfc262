"""`gateway analytics ...` subcommands (registered by gateway/cli.py).

    gateway analytics telemetry --topic T [--window 1m] [--out DIR] [--once|--continuous]
        [--gateway URL] [--anomaly-topic T2] [--threshold Z] [--state-topic T3] ...

pyspark is imported only when a subcommand runs."""

from __future__ import annotations

import argparse
import os
import sys


def _conf(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, not {text!r}")
    return k, v


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `analytics` and its subcommands on the gateway CLI's subparsers."""
    from .telemetry import interval

    p = sub.add_parser("analytics", help="PySpark analytics over gateway topics (docs/analytics.md)")
    cmds = p.add_subparsers(dest="analytics_command", required=True)
    t = cmds.add_parser(
        "telemetry",
        help="per-device windowed statistics and z-score anomaly alerts (Structured Streaming)",
        description="Per-device windowed count/avg/min/max/stddev and running z-score anomalies of a "
        "telemetry topic, written as Parquet; local Spark unless --master or spark-submit says otherwise.",
    )
    t.add_argument("--topic", required=True, help="store topic of the telemetry (MQTT: the first path level)")
    t.add_argument(
        "--gateway",
        metavar="URL",
        default=None,
        help="the gateway's HTTP address (default $GATEWAY_URL, else http://127.0.0.1:8082)",
    )
    t.add_argument(
        "--out",
        metavar="DIR",
        default="./analytics-out",
        help="output directory: windows/, anomalies/ (default ./analytics-out)",
    )
    t.add_argument("--checkpoint", metavar="DIR", default=None, help="checkpoints (default OUT/_checkpoints)")
    t.add_argument("--window", type=interval, default="1 minute", help="tumbling window (default 1m)")
    t.add_argument("--watermark", type=interval, default="30 seconds", help="allowed lateness (default 30s)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="process what is stored now, then exit")
    mode.add_argument("--continuous", action="store_true", help="keep running until Ctrl-C (the default)")
    t.add_argument(
        "--trigger-interval",
        type=interval,
        default="10 seconds",
        help="micro-batch interval when continuous (default 10s)",
    )
    t.add_argument(
        "--anomaly-topic",
        metavar="T2",
        default=None,
        help="publish anomaly events (CloudEvents) to this topic (created when missing)",
    )
    t.add_argument(
        "--threshold", metavar="Z", type=float, default=4.0, help="flag |z| above this (default 4)"
    )
    t.add_argument(
        "--min-samples",
        metavar="N",
        type=int,
        default=10,
        help="readings of a device before it is scored (default 10)",
    )
    t.add_argument("--metric", default="value", help="JSON field of the body to analyse (default value)")
    t.add_argument(
        "--time-field",
        default="ts",
        help="JSON field with the event time, epoch s/ms or ISO 8601 (default ts)",
    )
    t.add_argument(
        "--device-level",
        type=int,
        default=1,
        help="topic path level holding the device id, 0-based (default 1: devices/<id>/...)",
    )
    t.add_argument("--path-filter", default=None, help="only these topic paths (MQTT filter or glob)")
    t.add_argument("--group", default=None, help="consumer group whose offsets the job commits")
    t.add_argument(
        "--starting-offsets",
        default=None,
        help="earliest (default), latest, group (default with --group), or JSON per queue",
    )
    t.add_argument(
        "--max-messages-per-trigger",
        type=int,
        default=None,
        metavar="N",
        help="at most N messages per micro-batch",
    )
    t.add_argument(
        "--state-topic",
        metavar="T3",
        default=None,
        help="compacted topic of the per-device anomaly state, restored from by a new checkpoint "
        "(default GROUP-state, else TOPIC-state; created when missing)",
    )
    t.add_argument(
        "--no-state-topic",
        action="store_true",
        help="keep the anomaly state only in Spark's checkpoint (a new checkpoint starts from zero)",
    )
    t.add_argument(
        "--master", default=None, help="Spark master (default local[*]; spark-submit decides its own)"
    )
    t.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting (repeatable)",
    )
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the parsed `gateway analytics ...` command; the process exit status."""
    from .client import default_url
    from .telemetry import TelemetryJob, main

    if args.analytics_command != "telemetry":  # pragma: no cover - argparse allows only telemetry
        print(f"gateway: unknown analytics command {args.analytics_command}", file=sys.stderr)
        return 2
    job = TelemetryJob(
        topic=args.topic,
        gateway=args.gateway or default_url(),
        out=os.path.abspath(args.out),
        checkpoint=os.path.abspath(args.checkpoint) if args.checkpoint else None,
        window=args.window,
        watermark=args.watermark,
        once=args.once,
        trigger_interval=args.trigger_interval,
        anomaly_topic=args.anomaly_topic,
        threshold=args.threshold,
        min_samples=args.min_samples,
        metric=args.metric,
        time_field=args.time_field,
        device_level=args.device_level,
        path_filter=args.path_filter,
        group=args.group,
        starting_offsets=args.starting_offsets,
        max_messages_per_trigger=args.max_messages_per_trigger,
        state_topic=args.state_topic,
        keep_state=not args.no_state_topic,
        quiet=args.quiet,
    )
    return main(job, args.master, dict(args.conf))


def entry(argv: list[str] | None = None) -> int:
    """`python analytics/cli.py telemetry ...` (what spark-submit runs): the same flags."""
    parser = argparse.ArgumentParser(prog="analytics")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["analytics", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(entry())
