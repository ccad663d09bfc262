"""A fixed-bucket latency histogram for the store's own timings (fsync durations).

Hand-written rather than prometheus_client: the store imports nothing outside the standard library,
and an observation on the group commit path is one bisect and three integer updates. Its `flat`
view is a dict of plain numbers, so CLUSTER mode's stats (summed over store nodes) add it up."""

from __future__ import annotations

from bisect import bisect_left

# seconds: 100 µs to 5 s, about 2.5x apart (fdatasync is ~50 µs on NVMe, tens of ms on spinning disks)
FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Histogram:
    """Counts of observations per bucket (upper bounds `bounds`, seconds; one more for +Inf),
    their sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = FSYNC_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def flat(self, prefix: str) -> dict[str, float]:
        """`{prefix}_bucket:<le>` (cumulative counts; le as repr, the last "+Inf"), `{prefix}_sum` and
        `{prefix}_count`."""
        out: dict[str, float] = {}
        total = 0
        for le, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out[f"{prefix}_bucket:{le}"] = total
        out[f"{prefix}_sum"] = self.sum
        out[f"{prefix}_count"] = self.count
        return out
