"""Timeline playback: a step's log (planner/recording.py) played against a Profile.

The host issues the log in order; each stream (compute, offload, prefetch) runs its
operations in order, an operation starting when the host has issued it, the stream is free
and every event it waits on has happened. Layer calls take the profile's device time, copies
their direction's fixed latency and then bytes / bandwidth (CopyLinks: a copy that overlaps
one in the other direction gets its share of the duplex bandwidth); a stream that waits for
another stream's event sees it the profile's sync_latency_s after it happened. The device
arena is replayed as the GPU sees it (ArenaReplay): a block freed behind a copy stays in use
until the copy has finished by the host's clock, and an allocation over the budget makes the
host wait for the oldest such copy.

    timeline = Timeline(profile, budget, start_bytes, issued=True)
    result = timeline.play(log, costs)       # {'step', 'peak', 'calls', 'copies', ...}

The log holds tens of thousands of entries per decision: `play` keeps its hottest state (the
host's clock, the streams' ends) in local names and hands the arena and the copy links only
what they need.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque

from ..memory.allocator import wait_until_fits
from .recording import Alloc, Mark, Record, Wait


class ArenaReplay:
    """The arena's bytes in use over a step, by the host's clock. budget: bytes (inf: no
    limit); in_use: bytes held before the step (parameters, gradients, the region...)."""

    def __init__(self, budget: float, in_use: int):
        self.budget = budget
        self.in_use = self.peak = in_use
        self.sizes: dict = {}          # block key -> bytes, while allocated
        self.pending: deque = deque()  # (key, event) of frees waiting behind a copy
        self.host_wait = 0.0           # seconds the host waited for such a copy
        self.over = False              # an allocation went over the budget
        self._host = 0.0

    def _wait_oldest(self) -> bool:
        """The host waits for the oldest free behind a copy (False: none pending)."""
        if not self.pending:
            return False
        key, ev = self.pending.popleft()
        if ev.time > self._host:
            self.host_wait += ev.time - self._host
            self._host = ev.time
        self.in_use -= self.sizes.pop(key)
        return True

    def take(self, n: int, host: float) -> float:
        """Take n bytes at host time `host`; returns the host's time after (it may wait)."""
        pending = self.pending
        if pending:  # what has finished by now is reclaimed (Arena._take: reclaim_done)
            still = deque()
            for key, ev in pending:
                if ev.time <= host:
                    self.in_use -= self.sizes.pop(key)
                else:
                    still.append((key, ev))
            pending.clear()
            pending.extend(still)
        if self.in_use + n > self.budget:
            # Under pressure the host waits for the oldest pending free: the arena's rule.
            self._host = host
            wait_until_fits(lambda: True if self.in_use + n <= self.budget else None,
                            self._wait_oldest)
            host = self._host
        self.in_use += n
        if self.in_use > self.budget:
            self.over = True
        if self.in_use > self.peak:
            self.peak = self.in_use
        return host

    def transient(self, n: int, host: float) -> float:
        """n bytes for one call, given back when it is enqueued (reuse is ordered)."""
        host = self.take(n, host)
        self.in_use -= n
        return host

    def alloc(self, key: int, n: int, host: float) -> float:
        host = self.take(n, host)
        self.sizes[key] = n
        return host

    def free(self, key: int, event, host: float) -> None:
        """Free block `key` behind `event` (None: at once)."""
        if event is None or event.time <= host:
            self.in_use -= self.sizes.pop(key)
        else:
            self.pending.append((key, event))


class CopyLinks:
    """The host link's two directions: each copy its direction's fixed latency, then its
    bytes at the direction's bandwidth, at the duplex share of it while the other direction
    moves bytes too. (In 64 passes of 4 images GoogLeNet copies 9088 maps each way a step,
    the median 100 KB, whose bytes take about as long as its latency.)"""

    def __init__(self, profile):
        self.latency, self.rate = {}, {}
        for stream in ("offload", "prefetch"):
            self.latency[stream], self.rate[stream] = profile.link(stream)
        total = sum(self.rate.values())
        self.shared = {k: min(v, profile.duplex_bw * v / total) for k, v in self.rate.items()}
        self.copies = {"offload": ([], []), "prefetch": ([], [])}   # bytes moving: (starts, ends)
        self.spans: list = []        # (stream, storage name, start, end) of every copy

    def copy(self, stream: str, label, start: float, nbytes: int) -> float:
        """A copy of nbytes on `stream` from `start`; returns its end."""
        moving = start + self.latency[stream]
        end = self._end(stream, moving, nbytes)
        self.copies[stream][0].append(moving)
        self.copies[stream][1].append(end)
        self.spans.append((stream, label, start, end))
        return end

    def _end(self, stream: str, start: float, nbytes: int) -> float:
        rate, shared = self.rate[stream], self.shared[stream]
        starts, ends = self.copies["prefetch" if stream == "offload" else "offload"]
        t, left = start, float(nbytes)
        k = bisect_right(ends, t)
        while k < len(starts) and left > 0:
            a, b = starts[k], ends[k]
            if a > t:  # the other direction is idle until a
                can = (a - t) * rate
                if can >= left:
                    return t + left / rate
                left -= can
                t = a
            can = (b - t) * shared
            if can >= left:
                return t + left / shared
            left -= can
            t = b
            k += 1
        return t + left / rate


class Timeline:
    """One playback of a log (see the module docstring). budget: the arena's bytes (None: no
    limit); start_bytes: held before the step (the optimizer's update takes no temporary:
    optim.py); issued=False: a step replayed from a CUDA graph, whose calls and update
    cost the host nothing."""

    def __init__(self, profile, budget, start_bytes: int, issued: bool = True):
        self.profile = profile
        self.arena = ArenaReplay(float("inf") if budget is None else float(budget),
                                 start_bytes)
        self.links = CopyLinks(profile)
        self.issued = issued
        self.tail = {"compute": 0.0, "offload": 0.0, "prefetch": 0.0}   # each stream's end
        self.calls: dict = {}        # call -> (start, end, idle before it on compute)
        self.step_ends: list = []
        self.busy = 0.0              # compute stream's work so far
        self.busy_at_step: list = []
        self.last_work = 0.0   # end of the latest layer or optimizer step on compute

    def play(self, log: list, costs: dict) -> dict:
        """Play `log`; costs: {(phase, node index): (host s, device s, bytes)}
        (StepModel._call_costs). Returns the last step's figures."""
        tail, arena = self.tail, self.arena
        host = 0.0
        sync = self.profile.synchronous
        signal = self.profile.sync_latency_s     # an event seen from another stream
        # The log holds tens of thousands of entries per decision: classes as local names.
        mark_cls, record_cls, wait_cls, alloc_cls = Mark, Record, Wait, Alloc
        for op in log:
            cls = type(op)
            if cls is mark_cls:
                s = op.stream
                if op.kind == "marker":   # the end of a call or copy: the most common mark
                    t = tail[s]      # `x if x >= y else y`: max without a call
                    if host > t:
                        tail[s] = host
                else:
                    host = self._mark(op, host, costs)
                if sync:  # the host did that work itself
                    t = tail[s]
                    if t > host:
                        host = t
            elif cls is record_cls:
                t = tail[op.stream]
                op.event.time = host if host >= t else t
                op.event.stream = op.stream
            elif cls is wait_cls:
                ev = op.event
                t = ev.time if ev.stream == op.stream else ev.time + signal
                if t > tail[op.stream]:
                    tail[op.stream] = t
            elif cls is alloc_cls:
                host = arena.alloc(op.key, op.nbytes, host)
            else:   # Free
                arena.free(op.key, op.event, host)
        return self._last_step()

    def _mark(self, op, host: float, costs: dict) -> float:
        """A mark other than a plain one: a layer call, a copy, the optimizer, a step's end.
        Returns the host's time after it."""
        s, kind, tail = op.stream, op.kind, self.tail
        if kind == "layer":
            issue, dur, temp = costs[op.label]
            if self.issued:
                host += issue
            if temp:
                host = self.arena.transient(temp, host)
            t = tail[s]
            start = host if host >= t else t
            # Idle since the last work on compute: waiting for a copy or for the host.
            self.calls[op.label] = (start, start + dur, start - self.last_work)
            tail[s] = self.last_work = start + dur
            self.busy += dur
        elif kind == "copy":
            t = tail[s]
            tail[s] = self.links.copy(s, op.label, host if host >= t else t, op.nbytes)
        elif kind == "optimizer":
            prof = self.profile
            if self.issued:
                host += prof.optimizer_host_s
            start = max(host, tail[s])
            tail[s] = self.last_work = start + prof.optimizer_s
            self.busy += prof.optimizer_s
        elif kind == "step_end":
            tail[s] = max(host, tail[s])
            self.step_ends.append(tail[s])
            self.busy_at_step.append(self.busy)
        else:
            tail[s] = max(host, tail[s])
        return host

    def _last_step(self) -> dict:
        """The last step's time, calls and copies (times from its start), compute time; the
        peak, the host's waits and whether the budget was exceeded, over the whole log."""
        begin = self.step_ends[-2]
        last = {k: (a - begin, b - begin, stall) for k, (a, b, stall) in self.calls.items()}
        moved = [(s, name, a - begin, b - begin) for s, name, a, b in self.links.spans
                 if a >= begin]
        return {"step": self.step_ends[-1] - self.step_ends[-2], "peak": self.arena.peak,
                "calls": last, "copies": moved,
                "compute": self.busy_at_step[-1] - self.busy_at_step[-2],
                "host_wait": self.arena.host_wait, "over_budget": self.arena.over}
