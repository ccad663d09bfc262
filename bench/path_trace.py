"""Package crossings, files and returns on the path of one message: an MQTT QoS 1 PUBLISH through the
store (group commit, fdatasync) to its PUBACK, and the same message out as an AMQP basic.deliver.

A LOCAL gateway (flush `sync`, uvloop, the default fsync method) runs in a child process with
PYTHONPATH=ROOT, so any checkout can be measured (`--root /tmp/old`). After three warm-up messages
(caches warm, the AMQP consumer's delivery loop parked in its long poll), `sys.settrace` records
the event-loop thread's calls, lines and returns in ROOT's files (tests/, bench/, dot directories
left out) while a fourth message goes through.

Counting rule (`RULE`): the path is the code of the steps that carry the message, in a fixed order,
PUBACK branch first whatever the run's timing (MQTT read, publish task, writer `_write`, fsync
completion, publish task resumed to the PUBACK, MQTT flush, delivery loop resumed out of its long
poll, delivery task, AMQP flush). Consecutive visits to one file merge into one entry; an entry
whose file appeared earlier is a return. A caller that only hands a callee's result up (a bare
`return x`) makes no entry, but its file counts. files = distinct files passed through.

The steps are found by their entry points only: `MqttProtocol.data_received`, the publish task
(`Session._reply_later.<locals>.run`), `GroupCommitWriter._write`, the callback that calls
`GroupCommitWriter._synced`, `Session._flush_writes`, `DeliveryLoop._run` (up to its bound's update),
`DeliveryLoop._deliver`, `Connection._flush_writes`.

Package crossings (`PACKAGE_RULE`): per step, the packages its code runs in (an adapter's protocol is
its own package); a crossing is a step from one package into another, a re-entry a step back into a
package the same step has left.

Output: the rules, the numbered entries (file: functions), the file sequence with (rN) markers,
`files = N, returns = M`, the packages per step and the crossings by pair, `crossings = C,
re-entries = R`; or with `--json` `{"files", "returns", "sequence" (the entries' files), "file_list"
(the distinct files in order of the first visit, pass-throughs included), "crossings", "reentries",
"package_steps" ([step, [package, ...]]), "crossing_pairs" ({"a -> b": n})}`.

    .venv/bin/python bench/path_trace.py [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dis
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXCLUDED = ("tests/", "bench/", ".")  # relative path prefixes that are not product code
TOPIC = b"telemetry/dev1/temp"
QUEUE = "telemetry"
WARMUP = 3

RULE = (
    "The path is the project code on the event-loop thread that carries the message, step by step "
    "in this order (PUBACK branch first, whatever the run's timing): the MQTT read callback, the "
    "publish task up to its await on the store, the writer's _write, the fsync-completion callback, "
    "the publish task resumed up to the PUBACK and the MQTT _flush_writes, the delivery loop resumed "
    "out of its long poll up to handing the message to _deliver, the delivery task up to its await "
    "for the ack, and the AMQP _flush_writes. A visit is running code defined in a file (functions, "
    "comprehensions, resumed generators, callbacks); dataclass constructors, constants and task "
    "plumbing (outer frames a resumed task passes through) are not visits. Consecutive visits to one "
    "file merge into one entry; an entry whose file appeared earlier is a return (A->B->A counts 1). "
    "A caller given control back by a callee makes an entry only if it then runs a statement other "
    "than a bare `return <value>` (no call, no await); a frame that only hands a result up is shown "
    "in [brackets]: not an entry, but its file counts. files = distinct files the path passes "
    "through, pass-throughs included; returns = entries that return to a file."
)

PACKAGE_RULE = (
    "A package is a top-level package of the project, each protocol adapter its own "
    "(adapters.mqtt, adapters.amqp; adapters/*.py is adapters). Each step of the path (as above) is "
    "the sequence of packages its visits run in (pass-throughs included), consecutive visits to one "
    "package merged: a crossing is a step from one package into another (a call or a return: "
    "A->B->A counts 2), a re-entry is a step into a package the same step has already left (A->B->A "
    "counts 1). Steps start from the event loop, so the change of package from one step to the next "
    "is not a crossing. crossings and re-entries are the sums over the steps."
)

# An event: (kind, file relative to ROOT, qualname, line, task name, frame id, detail). kind is
# call / line / return / exception; detail is "fresh" or "resume" for a call (a suspended
# generator or coroutine going on), "yield" or "ret" for a return.
Event = tuple[str, str, str, int, str | None, int, str | None]


# ---------------------------------------------------------------------------- child: the trace


class Tracer:
    def __init__(self, root: Path) -> None:
        self.prefix = str(root) + "/"
        self.events: list[Event] = []
        self._yield_ops = {dis.opmap[op] for op in ("YIELD_VALUE", "SEND") if op in dis.opmap}

    def _project(self, filename: str) -> bool:
        if not filename.startswith(self.prefix) or "site-packages" in filename:
            return False
        return not filename[len(self.prefix) :].startswith(EXCLUDED)

    def _record(self, frame: FrameType, event: str) -> None:
        co = frame.f_code
        detail = None
        if event == "call":
            resumed = frame.f_lasti >= 0 and frame.f_lineno != co.co_firstlineno and co.co_flags & 0x2A0
            detail = "resume" if resumed else "fresh"
        elif event == "return":
            op = co.co_code[frame.f_lasti] if frame.f_lasti >= 0 else -1
            detail = "yield" if op in self._yield_ops else "ret"
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        name = None if task is None else task.get_name()
        rel = co.co_filename[len(self.prefix) :]
        self.events.append((event, rel, co.co_qualname, frame.f_lineno or 0, name, id(frame), detail))

    def _local(self, frame: FrameType, event: str, _arg: Any) -> Callable | None:
        self._record(frame, event)
        return self._local

    def global_trace(self, frame: FrameType, event: str, _arg: Any) -> Callable | None:
        if not self._project(frame.f_code.co_filename):
            return None
        self._record(frame, event)
        return self._local


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the gateway closed the MQTT connection")
        data += chunk
    return data


def _mqtt_connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    cid = b"path-trace"
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack(">H", len(cid)) + cid  # 3.1.1, clean
    s.sendall(bytes([0x10, len(body)]) + body)
    ack = _recv_exactly(s, 4)
    if ack[0] != 0x20 or ack[3] != 0:
        raise RuntimeError(f"MQTT CONNECT refused: {ack!r}")
    return s


def _mqtt_publish(s: socket.socket, pid: int) -> None:
    """A QoS 1 PUBLISH, then its PUBACK."""
    body = struct.pack(">H", len(TOPIC)) + TOPIC + struct.pack(">H", pid) + b"21.5"
    s.sendall(bytes([0x32, len(body)]) + body)
    ack = _recv_exactly(s, 4)
    if ack != bytes([0x40, 2]) + struct.pack(">H", pid):
        raise RuntimeError(f"expected PUBACK {pid}, got {ack!r}")


def _clients(
    loop: asyncio.AbstractEventLoop, mqtt_port: int, amqp_port: int, tracer: Tracer, done: list[object]
) -> None:
    """The publisher and the consumer (this thread is not traced)."""
    import pika

    def on_loop(fn: Callable[[], object]) -> None:
        ev = threading.Event()
        loop.call_soon_threadsafe(lambda: (fn(), ev.set()))
        if not ev.wait(10):
            raise TimeoutError("the event loop did not answer")

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(got) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"message {n} was not delivered")
            conn.process_data_events(time_limit=0.01)

    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        got: list[bytes] = []

        def on_msg(c: Any, method: Any, _props: Any, body: bytes) -> None:
            got.append(body)
            c.basic_ack(method.delivery_tag)

        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(QUEUE, on_msg)
        m = _mqtt_connect(mqtt_port)
        for pid in range(1, WARMUP + 1):  # routes, known topics, caches, first pops
            _mqtt_publish(m, pid)
            wait_for(pid)
        conn.process_data_events(time_limit=0.2)  # the last ack goes out
        time.sleep(0.3)  # ... and the delivery loop is parked in its long poll again
        on_loop(lambda: sys.settrace(tracer.global_trace))
        _mqtt_publish(m, WARMUP + 1)
        wait_for(WARMUP + 1)
        on_loop(lambda: sys.settrace(None))
        m.close()
        conn.close()
    except BaseException as e:  # noqa: BLE001 - reported by the child's main
        done.append(e)
    finally:
        loop.call_soon_threadsafe(done.append, "finished")


async def _gateway_run(root: Path, tracer: Tracer) -> None:
    import store
    from gateway.config import Settings
    from gateway.server import Gateway

    if not str(Path(store.__file__).resolve()).startswith(str(root) + "/"):
        raise RuntimeError(f"store was imported from {store.__file__}, not from {root}")
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="path-trace-") as data:
        mqtt_port, amqp_port = _free_port(), _free_port()
        settings = Settings(
            data_dir=data,
            protocols=("mqtt", "amqp"),
            mqtt_port=mqtt_port,
            amqp_port=amqp_port,
            flush="sync",
            event_loop="uvloop",
        )
        gw = Gateway(settings)
        await gw.start()
        done: list[object] = []
        try:
            th = threading.Thread(
                target=_clients, args=(loop, mqtt_port, amqp_port, tracer, done), daemon=True
            )
            th.start()
            while "finished" not in done:
                await asyncio.sleep(0.01)
        finally:
            sys.settrace(None)
            await gw.stop()
        errors = [e for e in done if isinstance(e, BaseException)]
        if errors:
            raise errors[0]


def child(root: Path, out: Path) -> None:
    import uvloop

    tracer = Tracer(root)
    uvloop.run(_gateway_run(root, tracer))
    out.write_text(json.dumps(tracer.events))


def trace(root: Path, timeout: float = 60.0) -> list[Event]:
    """The events of one traced message, from a child process that imports the project from root."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="path-trace-") as tmp:
        out = Path(tmp) / "events.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--child", str(out)]
        r = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"the traced gateway failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        return [tuple(e) for e in json.loads(out.read_text())]  # type: ignore[misc]


# ---------------------------------------------------------------------------- the path's steps


@dataclass
class Segment:
    """The events of one top-level frame: one callback, or one step of a task."""

    start: int
    end: int
    qualname: str
    task: str | None


def segments(events: list[Event]) -> list[Segment]:
    out: list[Segment] = []
    depth, start = 0, 0
    for i, (kind, _f, qual, _ln, task, _fid, _d) in enumerate(events):
        if kind == "call":
            if depth == 0:
                start, head = i, (qual, task)
            depth += 1
        elif kind == "return":
            depth -= 1
            if depth == 0:
                out.append(Segment(start, i, *head))
            depth = max(depth, 0)
    return out


def _is(qualname: str, name: str) -> bool:
    return qualname == name or qualname.endswith("." + name)


def roles(events: list[Event]) -> list[tuple[str, list[tuple[int, int]]]]:
    """The path's steps in the rule's order: (role, [(first event, last event), ...])."""
    segs = segments(events)

    def first(name: str, after: int, contains: str | None = None) -> Segment:
        for s in segs:
            if s.start <= after:
                continue
            if contains is None and _is(s.qualname, name):
                return s
            if contains is not None and any(
                events[i][0] == "call" and _is(events[i][2], contains) for i in range(s.start, s.end + 1)
            ):
                return s
        raise LookupError(f"no step {contains or name} after event {after} in the trace")

    read = first("MqttProtocol.data_received", -1)
    try:  # a publish task (trees before run-to-completion publishes)
        pub = first("Session._reply_later.<locals>.run", read.start)
        steps = [s for s in segs if s.task == pub.task and s.start >= pub.start]
        if len(steps) < 2:
            raise LookupError("the publish task did not wait for the store")
    except LookupError:  # stored from the read's own callback (Publisher.publish_nowait)
        pub, steps = read, []
    try:
        write: Segment | None = first("GroupCommitWriter._write", pub.start)
    except LookupError:
        write = None  # written inline by the publish (put found the disk idle)
    written = pub.start if write is None else write.start
    fsynced = first("", written, contains="GroupCommitWriter._synced")
    if not steps:  # the PUBACK: the append's completion callback, no task
        steps = [pub, first("", fsynced.start, contains="Session._puback")]
    mqtt_flush = first("Session._flush_writes", steps[1].start)
    pop = first("DeliveryLoop._run", written)
    # the pop's step ends when the loop has handed the message on: the first return of its in-flight
    # bound's update (`InflightBound.update`; `DeliveryLoop._update_room` in trees before it)
    ends = (i for i in range(pop.start, pop.end + 1) if events[i][0] == "return")
    marks = ("InflightBound.update", "DeliveryLoop._update_room")
    pop_end = next((i for i in ends if any(_is(events[i][2], m) for m in marks)), pop.end)
    deliver = first("DeliveryLoop._deliver", pop.start)
    amqp_flush = first("Connection._flush_writes", deliver.start)

    def span(*ss: Segment) -> list[tuple[int, int]]:
        return [(s.start, s.end) for s in ss]

    return [
        ("mqtt read", span(read)),
        ("publish", [] if pub is read else span(pub)),  # (none of its own: stored from the read)
        ("write", [] if write is None else span(write)),
        ("fsync done", span(fsynced)),
        ("puback", span(*steps[1:])),
        ("mqtt flush", span(mqtt_flush)),
        ("pop resumes", [(pop.start, pop_end)]),
        ("deliver", span(deliver)),
        ("amqp flush", span(amqp_flush)),
    ]


# ---------------------------------------------------------------------------- counting


class Source:
    """Which lines of ROOT's files are a bare `return <value>` (no call, no await)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bare: dict[str, set[int]] = {}

    def bare_return(self, rel: str, line: int) -> bool:
        if rel not in self._bare:
            self._bare[rel] = self._scan(self.root / rel)
        return line in self._bare[rel]

    @staticmethod
    def _scan(path: Path) -> set[int]:
        tree = ast.parse(path.read_text(), str(path))
        starts: dict[int, ast.stmt] = {}  # the outermost statement starting on each line
        inner: dict[int, ast.stmt] = {}  # the innermost statement covering each line
        for node in ast.walk(tree):  # breadth first: outer statements come first
            if isinstance(node, ast.stmt):
                starts.setdefault(node.lineno, node)
                for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    inner[ln] = node
        bare = set()
        for ln, node in inner.items():
            stmt = starts.get(ln, node)
            if isinstance(stmt, ast.Return) and not any(
                isinstance(n, ast.Call | ast.Await) for n in ast.walk(stmt)
            ):
                bare.add(ln)
        return bare


@dataclass
class Entry:
    file: str
    role: str
    functions: list[str] = field(default_factory=list)
    ret: int | None = None  # N of (rN)
    passthrough: bool = False


@dataclass
class MessagePath:
    entries: list[Entry]  # in path order, pass-throughs included
    files: list[str]  # distinct files in order of the first visit, pass-throughs included
    visits: list[tuple[str, str, str, bool]] = field(default_factory=list)  # (file, function, role, through)

    @property
    def returns(self) -> int:
        return sum(e.ret is not None for e in self.entries)

    def sequence(self) -> list[str]:
        return [e.file for e in self.entries if not e.passthrough]

    def package_steps(self) -> list[tuple[str, list[str]]]:
        """Per step (role) of the path, the packages its code runs in, in order, consecutive visits
        to one package merged (see PACKAGE_RULE)."""
        steps: list[tuple[str, list[str]]] = []
        for f, _q, role, _through in self.visits:
            pkg = package_of(f)
            if not steps or steps[-1][0] != role:
                steps.append((role, [pkg]))
            elif steps[-1][1][-1] != pkg:
                steps[-1][1].append(pkg)
        return steps

    @property
    def crossings(self) -> int:
        return sum(len(seq) - 1 for _role, seq in self.package_steps())

    @property
    def reentries(self) -> int:
        return sum(len(seq) - len(set(seq)) for _role, seq in self.package_steps())

    def crossing_pairs(self) -> dict[str, int]:
        """How often the path steps from one package into another ("a -> b"), by pair."""
        pairs: dict[str, int] = {}
        for _role, seq in self.package_steps():
            for a, b in zip(seq, seq[1:], strict=False):
                pairs[f"{a} -> {b}"] = pairs.get(f"{a} -> {b}", 0) + 1
        return dict(sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])))


def package_of(rel: str) -> str:
    """A file's package as PACKAGE_RULE counts it: the top-level package, and an adapter's protocol
    (`adapters/mqtt/codec/decoder.py` -> `adapters.mqtt`; `adapters/limits.py` -> `adapters`)."""
    parts = rel.split("/")
    if parts[0] == "adapters" and len(parts) > 2:
        return f"adapters.{parts[1]}"
    return parts[0] if len(parts) > 1 else rel.removesuffix(".py")


def _short(qualname: str) -> str:
    return qualname.replace(".<locals>", "")


def count(events: list[Event], root: Path) -> MessagePath:
    src = Source(root)
    visits: list[tuple[str, str, str, bool]] = []  # (file, function, role, pass-through)
    for role, spans in roles(events):
        for start, end in spans:
            visited: set[tuple[int, int]] = set()  # frames (id, generation) with a visit
            handed: list[tuple[int, tuple[int, int], str, str]] = []  # (position, frame, file, function)
            gen: dict[int, int] = {}
            after_return = False
            continuing: set[tuple[int, int]] = set()  # frames a callee has returned to
            here: list[tuple[str, str, str, bool]] = []
            for kind, f, q, ln, _task, fid, detail in events[start : end + 1]:
                if kind == "call":
                    after_return = False  # a call, not the caller going on
                    if detail == "fresh":
                        gen[fid] = gen.get(fid, 0) + 1
                frame = (fid, gen.get(fid, 0))
                if kind == "exception" or (kind == "call" and detail == "resume"):
                    continue  # task plumbing: the innermost frame shows by its lines
                if kind == "return":
                    if detail != "yield":
                        after_return = True
                        handed.append((len(here), frame, f, q))
                    continue
                if kind == "line":
                    if after_return:
                        continuing.add(frame)
                    after_return = False
                    if frame in continuing and src.bare_return(f, ln):
                        continue
                visited.add(frame)
                here.append((f, q, role, False))
            for pos, frame, f, q in reversed(handed):  # frames that only handed a result up
                if frame not in visited:
                    here.insert(pos, (f, q, role, True))
            visits.extend(here)

    entries: list[Entry] = []
    seen: set[str] = set()  # the files of the entries so far
    for f, q, role, through in visits:
        fn = _short(q)
        if through:
            entries.append(Entry(f, role, [fn], passthrough=True))
            continue
        last = next((e for e in reversed(entries) if not e.passthrough), None)
        if last is not None and last.file == f:  # consecutive visits to one file: one entry
            if fn not in last.functions:
                last.functions.append(fn)
            continue
        ret = sum(e.ret is not None for e in entries) + 1 if f in seen else None
        entries.append(Entry(f, role, [fn], ret))
        seen.add(f)
    merged: list[Entry] = []  # consecutive pass-throughs of one file merged
    for e in entries:
        prev = merged[-1] if merged else None
        if e.passthrough and prev is not None and prev.passthrough and prev.file == e.file:
            prev.functions += [fn for fn in e.functions if fn not in prev.functions]
        else:
            merged.append(e)
    files = list(dict.fromkeys(e.file for e in merged))
    return MessagePath(merged, files, visits)


# ---------------------------------------------------------------------------- output


def report(p: MessagePath, root: Path) -> str:
    lines = [f"root: {root}", "", "Counting rule: " + RULE, "", "Entries:"]
    n = 0
    for e in p.entries:
        mark = f"(r{e.ret})" if e.ret is not None else ""
        if e.passthrough:
            lines.append(f"          [{e.file}: {', '.join(e.functions)}]  (pass-through)")
            continue
        n += 1
        lines.append(f"{n:4d} {mark:6s} {e.file}: {', '.join(e.functions)}   <{e.role}>")
    seq = []
    for e in p.entries:
        if e.passthrough:
            seq.append(f"[{e.file}]")
        else:
            seq.append(e.file + (f" (r{e.ret})" if e.ret is not None else ""))
    lines += ["", "File sequence:", " -> ".join(seq), "", "Files:"]
    lines += [f"  {f}" for f in p.files]
    lines += ["", f"files = {len(p.files)}, returns = {p.returns}"]
    lines += ["", "Package crossings: " + PACKAGE_RULE, "", "Packages per step:"]
    for role, seq in p.package_steps():
        extra = len(seq) - len(set(seq))
        lines.append(f"  {role:12s} {' -> '.join(seq)}   ({len(seq) - 1} crossings, {extra} re-entries)")
    lines += ["", "Crossings by pair:"]
    lines += [f"  {pair}: {n}" for pair, n in p.crossing_pairs().items()]
    lines += ["", f"crossings = {p.crossings}, re-entries = {p.reentries}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the checkout to measure (default: this repo)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds the traced gateway may take")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # internal: trace, write the events
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.child is not None:
        child(root, args.child)
        return 0
    p = count(trace(root, args.timeout), root)
    if args.json:
        doc = {
            "files": len(p.files),
            "returns": p.returns,
            "sequence": p.sequence(),
            "file_list": p.files,
            "crossings": p.crossings,
            "reentries": p.reentries,
            "package_steps": [[role, seq] for role, seq in p.package_steps()],
            "crossing_pairs": p.crossing_pairs(),
        }
        print(json.dumps(doc))
    else:
        print(report(p, root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
