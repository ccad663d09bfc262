"""Consumer progress: per (group, topic, queue) an ack watermark, a pop cursor, the offsets done
above the watermark and the in-flight offsets with their deadlines and delivery counts.

Every change is one small binary record appended to an operations log (flushed every few ms,
fsynced, not on the append path: a lost record only means a redelivery). A checkpoint writes the
whole state as JSON and starts a new log generation; recovery loads the checkpoint and replays.
"""

from __future__ import annotations

import heapq
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

OP_NAME, OP_POP, OP_ACK, OP_CHANGE, OP_COMMIT = 1, 2, 3, 4, 5
_NAME = struct.Struct("<BIH")
_POP = struct.Struct("<BIIqqqIH")  # gt, queue, offset, seq, deadline, attempts, len(message group)
_ACK = struct.Struct("<BIIq")  # gt, queue, offset (also OP_COMMIT: offset = new watermark)
_CHANGE = struct.Struct("<BIIqqqI")  # gt, queue, offset, seq, deadline, attempts


@dataclass(slots=True)
class Inflight:
    seq: int
    deadline: int  # epoch ms when the message becomes visible again
    attempts: int  # deliveries so far
    message_group: str = ""


@dataclass(slots=True)
class QueueProgress:
    ack_wm: int = 0  # every offset below is done
    cursor: int = 0  # every offset below was handed out (or skipped) at least once
    done: set[int] = field(default_factory=set)  # done offsets in [ack_wm, cursor)
    inflight: dict[int, Inflight] = field(default_factory=dict)
    # offsets below this (and at or past the cursor of a take-over) may have been handed out by the
    # previous primary without the pop reaching this node (`StateReplica.take_over`): handed out
    # now, they count as a second delivery
    uncertain: int = 0

    def mark_done(self, offset: int) -> None:
        self.inflight.pop(offset, None)
        if offset < self.ack_wm:
            return
        if offset == self.ack_wm:
            wm = offset + 1
            done = self.done
            while wm in done:
                done.discard(wm)
                wm += 1
            self.ack_wm = wm
            if self.cursor < wm:
                self.cursor = wm
        else:
            self.done.add(offset)

    def commit(self, offset: int) -> None:
        """Everything below `offset` is done (offset-based consumers; may move backwards)."""
        self.ack_wm = offset
        self.done = {o for o in self.done if o > offset}
        for o in [o for o in self.inflight if o < offset]:
            del self.inflight[o]
        if self.cursor < offset or not self.inflight and not self.done:
            self.cursor = offset
        while self.ack_wm in self.done:
            self.done.discard(self.ack_wm)
            self.ack_wm += 1


class GroupTopic:
    """The progress of one consumer group on one topic."""

    __slots__ = ("id", "group", "topic", "queues", "retry_heap", "rr", "fifo_busy")

    def __init__(self, gt_id: int, group: str, topic: str) -> None:
        self.id = gt_id
        self.group = group
        self.topic = topic
        self.queues: dict[int, QueueProgress] = {}
        self.retry_heap: list[tuple[int, int, int, int]] = []  # (deadline, seq, queue, offset)
        self.rr = 0
        self.fifo_busy: dict[str, int] = {}  # message group -> messages in flight

    def queue(self, qid: int) -> QueueProgress:
        q = self.queues.get(qid)
        if q is None:
            q = self.queues[qid] = QueueProgress()
        return q

    def track(self, qid: int, offset: int, inf: Inflight) -> None:
        heapq.heappush(self.retry_heap, (inf.deadline, inf.seq, qid, offset))

    def next_deadline(self) -> int | None:
        return self.retry_heap[0][0] if self.retry_heap else None

    def backlog(self, max_offsets: dict[int, int]) -> int:
        total = 0
        for qid, mx in max_offsets.items():
            q = self.queues.get(qid)
            if q is None:
                total += mx
            else:
                total += max(mx - q.ack_wm - len(q.done), 0)
        return total


class ConsumerProgress:
    """All groups' progress plus its log. Mutations go through the methods that log them."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.states: dict[tuple[str, str], GroupTopic] = {}
        self.by_id: dict[int, GroupTopic] = {}
        self.max_id = 0  # the highest id named (max(by_id) per new name was quadratic in names)
        self.seq = 0
        self.gen = 0
        self.buf = bytearray()
        self.ops = 0
        self.on_taken: Callable[[bytes], None] | None = None  # sees every chunk `take_log` hands out
        self._load()
        self.log_fd = os.open(self._log_path(self.gen), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _log_path(self, gen: int) -> str:
        return os.path.join(self.dir, f"ops.{gen:08d}.log")

    # ----- state access ----------------------------------------------------------------------
    def get(self, group: str, topic: str) -> GroupTopic:
        st = self.states.get((group, topic))
        if st is None:
            st = self._new(self.max_id + 1, group, topic)
            g, t = group.encode(), topic.encode()
            self.buf += _NAME.pack(OP_NAME, st.id, len(g)) + g + struct.pack("<H", len(t)) + t
        return st

    def _new(self, gt_id: int, group: str, topic: str) -> GroupTopic:
        st = GroupTopic(gt_id, group, topic)
        self.states[(group, topic)] = st
        self.by_id[gt_id] = st
        self.max_id = max(self.max_id, gt_id)
        return st

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # ----- logged mutations ------------------------------------------------------------------
    def handed_out(
        self, st: GroupTopic, qid: int, offset: int, deadline: int, message_group: str
    ) -> Inflight:
        """A message handed out for the first time here: in flight until `deadline` (its first
        attempt, or its second when a previous primary may have handed it out: `uncertain`)."""
        self.seq += 1
        q = st.queues.get(qid)
        inf = Inflight(self.seq, deadline, 2 if q is not None and offset < q.uncertain else 1, message_group)
        self.popped(st, qid, offset, inf)
        return inf

    def popped(self, st: GroupTopic, qid: int, offset: int, inf: Inflight) -> None:
        q = st.queue(qid)
        q.inflight[offset] = inf
        if offset >= q.cursor:
            q.cursor = offset + 1
        st.track(qid, offset, inf)
        if inf.message_group:
            st.fifo_busy[inf.message_group] = st.fifo_busy.get(inf.message_group, 0) + 1
        g = inf.message_group.encode()
        self.buf += _POP.pack(OP_POP, st.id, qid, offset, inf.seq, inf.deadline, inf.attempts, len(g)) + g
        self.ops += 1

    def done(self, st: GroupTopic, qid: int, offset: int) -> None:
        q = st.queue(qid)
        inf = q.inflight.get(offset)
        if inf is not None and inf.message_group:
            self._release_group(st, inf.message_group)
        if offset >= q.cursor:
            q.cursor = offset + 1
        q.mark_done(offset)
        self.buf += _ACK.pack(OP_ACK, st.id, qid, offset)
        self.ops += 1

    def changed(
        self, st: GroupTopic, qid: int, offset: int, seq: int, deadline: int, attempts: int | None = None
    ) -> Inflight:
        inf = st.queue(qid).inflight[offset]
        inf.seq = seq
        inf.deadline = deadline
        if attempts is not None:
            inf.attempts = attempts
        st.track(qid, offset, inf)
        self.buf += _CHANGE.pack(OP_CHANGE, st.id, qid, offset, seq, deadline, inf.attempts)
        self.ops += 1
        return inf

    def committed(self, st: GroupTopic, qid: int, offset: int) -> None:
        q = st.queue(qid)
        for o, inf in list(q.inflight.items()):
            if o < offset and inf.message_group:
                self._release_group(st, inf.message_group)
        q.commit(offset)
        self.buf += _ACK.pack(OP_COMMIT, st.id, qid, offset)
        self.ops += 1

    @staticmethod
    def _release_group(st: GroupTopic, group: str) -> None:
        n = st.fifo_busy.get(group, 0) - 1
        if n > 0:
            st.fifo_busy[group] = n
        else:
            st.fifo_busy.pop(group, None)

    # ----- persistence -----------------------------------------------------------------------
    def take_log(self) -> bytes:
        data = bytes(self.buf)
        self.buf.clear()
        if data and self.on_taken is not None:
            self.on_taken(data)
        return data

    # ----- replication (a replica takes its primary's state: store/state_replica.py) ----------
    def apply(self, data: bytes) -> None:
        """Apply a primary's logged operations (whole records) and log them here too."""
        if self._replay(data) != len(data):
            raise ValueError("consumer progress operations are torn or unknown")
        self.buf += data
        self.ops += 1 + len(data) // 32

    def replace(self, snapshot: bytes) -> None:
        """Take a primary's whole state (`snapshot`); the caller then writes a checkpoint. Pending
        operations of the old state are dropped."""
        self.states.clear()
        self.by_id.clear()
        self.max_id = 0
        self.buf.clear()
        seq = self.seq
        self._load_snapshot(json.loads(snapshot))
        self.seq = max(seq, self.seq)
        self.rederive()

    def write_log(self, data: bytes) -> None:
        """Flusher thread: append and fsync a chunk taken with `take_log`."""
        if data:
            os.write(self.log_fd, data)
            os.fdatasync(self.log_fd)

    def snapshot(self) -> bytes:
        """The whole state as JSON (taken in the loop; written by `write_checkpoint`)."""
        out = {"gen": self.gen + 1, "seq": self.seq, "states": []}
        for st in self.by_id.values():
            qs = {}
            for qid, q in st.queues.items():
                qs[qid] = [
                    q.ack_wm,
                    q.cursor,
                    sorted(q.done),
                    [[o, i.seq, i.deadline, i.attempts, i.message_group] for o, i in q.inflight.items()],
                ]
            out["states"].append([st.id, st.group, st.topic, qs])
        return json.dumps(out, separators=(",", ":")).encode()

    def write_checkpoint(self, snapshot: bytes, pending_log: bytes) -> None:
        """Flusher thread: finish the old generation's log, write the snapshot, start a new log."""
        self.write_log(pending_log)
        tmp = os.path.join(self.dir, "checkpoint.json.tmp")
        with open(tmp, "wb") as f:
            f.write(snapshot)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(self.dir, "checkpoint.json"))
        old_fd, old_gen = self.log_fd, self.gen
        self.gen += 1
        self.log_fd = os.open(self._log_path(self.gen), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.close(old_fd)
        os.unlink(self._log_path(old_gen))

    def _load(self) -> None:
        path = os.path.join(self.dir, "checkpoint.json")
        if os.path.exists(path):
            with open(path, "rb") as f:
                snap = json.loads(f.read())
            self.gen = snap["gen"]
            self._load_snapshot(snap)
        for name in sorted(os.listdir(self.dir)):
            if name.startswith("ops.") and name.endswith(".log") and int(name[4:12]) < self.gen:
                os.unlink(os.path.join(self.dir, name))
        log = self._log_path(self.gen)
        if os.path.exists(log):
            with open(log, "rb") as f:
                data = f.read()
            valid = self._replay(data)
            if valid < len(data):  # cut a torn tail, or new records would land behind it
                os.truncate(log, valid)
        self.rederive()

    def _load_snapshot(self, snap: dict) -> None:
        self.seq = snap["seq"]
        for gt_id, group, topic, qs in snap["states"]:
            st = self._new(gt_id, group, topic)
            for qid, (wm, cur, done, inflight) in qs.items():
                q = st.queue(int(qid))
                q.ack_wm, q.cursor, q.done = wm, cur, set(done)
                for o, seq, deadline, attempts, mg in inflight:
                    q.inflight[o] = Inflight(seq, deadline, attempts, mg)

    def rederive(self) -> None:
        """(Re)build what is derived from the in-flight offsets: retry heaps, FIFO busy groups."""
        for st in self.by_id.values():
            st.retry_heap = []
            st.fifo_busy = {}
            for qid, q in st.queues.items():
                for o, inf in q.inflight.items():
                    st.track(qid, o, inf)
                    if inf.message_group:
                        st.fifo_busy[inf.message_group] = st.fifo_busy.get(inf.message_group, 0) + 1

    def mark_uncertain(self, ends: dict[tuple[str, int], int], window: int) -> None:
        """A replica taking over: the next `window` offsets past each queue's cursor (up to its
        end in `ends`) may have been handed out by the previous primary, their pops lost with it."""
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for (topic, qid), end in ends.items():
            by_topic.setdefault(topic, []).append((qid, end))
        for st in self.by_id.values():
            for qid, end in by_topic.get(st.topic, ()):
                q = st.queue(qid)
                q.uncertain = min(end, q.cursor + window)

    def clamp(self, ends: dict[tuple[str, int], int]) -> int:
        """After recovery: forget progress past the end of each queue (`ends`: (topic, queue id)
        -> its recovered max offset). Only records that consumers read before they were durable,
        and that a machine crash then lost, leave progress there, and new records will take those
        offsets. Returns how many queues were cut back; the caller then writes a checkpoint."""
        cut = 0
        for st in self.by_id.values():
            for qid, q in st.queues.items():
                end = ends.get((st.topic, qid))
                if end is None or (q.cursor <= end and q.ack_wm <= end):
                    continue
                q.ack_wm = min(q.ack_wm, end)
                q.cursor = min(q.cursor, end)
                q.done = {o for o in q.done if o < end}
                q.inflight = {o: inf for o, inf in q.inflight.items() if o < end}
                cut += 1
        if cut:
            self.rederive()
        return cut

    def _replay(self, data: bytes) -> int:
        """Apply logged operations; returns how many bytes were valid."""
        pos, end = 0, len(data)
        good = 0
        try:
            while pos < end:
                good = pos
                op = data[pos]
                if op == OP_NAME:
                    _, gt_id, lg = _NAME.unpack_from(data, pos)
                    pos += _NAME.size
                    group = data[pos : pos + lg].decode()
                    pos += lg
                    (lt,) = struct.unpack_from("<H", data, pos)
                    topic = data[pos + 2 : pos + 2 + lt].decode()
                    if pos + 2 + lt > end:
                        break
                    pos += 2 + lt
                    st = self.states.get((group, topic))
                    if st is None or st.id != gt_id:
                        self._name(gt_id, group, topic, st)
                elif op == OP_POP:
                    _, gt_id, qid, o, seq, deadline, attempts, lg = _POP.unpack_from(data, pos)
                    if pos + _POP.size + lg > end:
                        break
                    mg = data[pos + _POP.size : pos + _POP.size + lg].decode()
                    pos += _POP.size + lg
                    q = self.by_id[gt_id].queue(qid)
                    q.inflight[o] = Inflight(seq, deadline, attempts, mg)
                    q.cursor = max(q.cursor, o + 1)
                    self.seq = max(self.seq, seq)
                elif op in (OP_ACK, OP_COMMIT):
                    _, gt_id, qid, o = _ACK.unpack_from(data, pos)
                    pos += _ACK.size
                    q = self.by_id[gt_id].queue(qid)
                    if op == OP_ACK:
                        q.cursor = max(q.cursor, o + 1)
                        q.mark_done(o)
                    else:
                        q.commit(o)
                elif op == OP_CHANGE:
                    _, gt_id, qid, o, seq, deadline, attempts = _CHANGE.unpack_from(data, pos)
                    pos += _CHANGE.size
                    inf = self.by_id[gt_id].queue(qid).inflight.get(o)
                    if inf is not None:
                        inf.seq, inf.deadline, inf.attempts = seq, deadline, attempts
                    self.seq = max(self.seq, seq)
                else:
                    break  # torn or foreign bytes: the rest is not trusted
            else:
                good = pos
        except (struct.error, KeyError, UnicodeDecodeError):
            pass  # a torn last record
        return good

    def _name(self, gt_id: int, group: str, topic: str, st: GroupTopic | None) -> None:
        """Replay of a name record. On a replica the primary's id wins over one given here (a
        store's own system groups are named at open): the local state under that name or id is
        dropped (a replica's system groups do nothing while it is a replica)."""
        old = self.by_id.get(gt_id)
        if old is not None:
            del self.states[(old.group, old.topic)]
        if st is not None:
            del self.by_id[st.id]
        self._new(gt_id, group, topic)

    def close(self) -> None:
        os.close(self.log_fd)
