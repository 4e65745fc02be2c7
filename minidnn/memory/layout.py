"""Static layout: every feature-map block of a step gets a fixed address, planned before step one.

Why: a step's allocations and releases are known in advance (the liveness plan and the policy
fix them), and they are the same every step. Serving them from a general-purpose allocator at
run time fragments memory: in VGG-16's backward each layer frees maps smaller than the ones the
next layer asks for, and cuDNN workspaces land in between, so a 12 GiB budget that holds the
step's live bytes can still fail with gigabytes free in pieces. Planning the addresses once
removes that failure and makes the feature-map peak a number known before step one.

How:
1. `record_intervals` (memory/record.py) walks one step's schedule through a dry memory
   manager (receipts, no memory) and notes when each block is taken and released.
   A storage that is offloaded and prefetched, or dropped and recomputed, has two blocks
   (two intervals).
2. `pack` assigns offsets: largest block first, each at the lowest address where it overlaps no
   already-placed block that is alive at the same time (a greedy solution of the dynamic storage
   allocation problem; near the live-bytes peak on these networks).
3. At run time `PlannedBlocks` hands out views of one region at those offsets. A block handed
   to a copy stream may still be in use after the manager released it (an offload still reads
   it): the stream that next writes those addresses first waits on the event of each earlier
   occupant released behind a copy. Compute-ordered releases need no wait.

Blocks that were not planned (a step that differs from the recorded one) fall back to the
dynamic allocator, so a layout can make a step slower but never wrong.

cuDNN workspaces can be planned too (`workspace={(node index, phase): bytes}`): each layer
call's workspace is one more block, alive only during that call, so it packs over the
addresses of feature maps that are dead by then instead of needing room beside the whole
region. The executor hands the block to the layer (StepContext.workspace). A call that
draws random numbers gets its scratch block (layers/draws.py) the same way, planned or not.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .allocator import ALIGNMENT, aligned


@dataclass
class Interval:
    """One device block of one storage in a step: taken at `start`, released at `end`
    (positions in the manager's sequence of block operations). k: the storage's k-th block.
    sid: the storage id, or ('workspace', node index, phase) for a planned workspace."""
    sid: int | tuple
    k: int
    nbytes: int
    start: int
    end: int = -1
    offset: int = -1
    index: int = -1                                      # position in the packed list
    keys: list = field(default=None, repr=False)         # every packed interval's key, by position
    overlaps: Any = field(default=None, repr=False)      # the packing's Overlaps (see pack)

    @property
    def key(self) -> tuple[int, int]:
        return (self.sid, self.k)

    @property
    def predecessor_index(self):
        """The predecessors' positions (a sorted array; None before packing)."""
        return None if self.overlaps is None else self.overlaps.of(self.index)

    @property
    def predecessors(self) -> list:
        """Keys of the earlier blocks at overlapping addresses (read when asked: a very deep
        network's blocks have hundreds each, and the run only needs their positions)."""
        if self.predecessor_index is None:
            return []
        return [self.keys[j] for j in self.predecessor_index.tolist()]


class WorkspaceBlock:
    """A block that lives for one layer call, as the blocks classes need a storage: its cuDNN
    workspace (kind 'workspace') or its scratch block for random draws ('scratch')."""

    def __init__(self, i: int, phase: str, nbytes: int, kind: str = "workspace"):
        self.sid = (kind, i, phase)
        self.nbytes = int(nbytes)
        self.device = None


class DynamicBlocks:
    """Feature-map blocks straight from the device allocator (no plan)."""
    plans_workspace = False       # workspaces are the kernels' own allocations

    def __init__(self, allocator):
        self.allocator = allocator

    def begin_step(self, device) -> None:
        pass

    def settle(self) -> None:
        """Forget the events kept to order later occupants (see PlannedBlocks)."""

    def acquire(self, fm, where: str, stream):
        return self.allocator.alloc(fm.nbytes, where)

    def release(self, fm, after) -> None:
        self.allocator.free(fm.device, after=after)


class RecordingBlocks(DynamicBlocks):
    """Blocks that only note their intervals (for `record_intervals`): each block handed out
    is its Interval, standing in for the bytes a dry run never touches."""
    plans_workspace = True

    def __init__(self):
        super().__init__(None)
        self.clock = 0
        self.intervals: list[Interval] = []
        self._open: dict[int, Interval] = {}
        self._count: dict[int, int] = {}

    def acquire(self, fm, where, stream):
        sid = fm.sid
        k = self._count.get(sid, 0)
        self._count[sid] = k + 1
        iv = Interval(sid, k, fm.nbytes, self.clock)
        self.clock += 1
        self.intervals.append(iv)
        self._open[sid] = iv
        return iv

    def release(self, fm, after) -> None:
        self._open.pop(fm.sid).end = self.clock
        self.clock += 1


def pack(intervals: list[Interval], alignment: int = ALIGNMENT) -> int:
    """Give each interval an offset; returns the region size. Fills `offset`, `index` and
    `overlaps` (`predecessor_index` and `predecessors` read it).

    Greedy: largest first (ties: earliest start), each at the lowest aligned address where it
    overlaps no placed interval alive at the same time. Then, for every interval, the earlier
    intervals that share any of its addresses (the blocks whose release it may have to wait for).
    The placed intervals are kept sorted by address, so each placement is one sweep over them
    in array operations (a step of a very deep network has thousands of blocks, and a planner
    packs a layout for every decision it weighs).
    """
    n = len(intervals)
    if n == 0:
        return 0
    need = np.array([aligned(iv.nbytes) for iv in intervals], dtype=np.int64)
    start = np.array([iv.start for iv in intervals], dtype=np.int64)
    end = np.array([iv.end for iv in intervals], dtype=np.int64)
    offset = _place(need, start, end, alignment)
    overlaps = Overlaps(offset, offset + need, start, end)
    keys = [iv.key for iv in intervals]
    for i, (iv, at) in enumerate(zip(intervals, offset.tolist())):
        iv.offset, iv.index, iv.keys, iv.overlaps = at, i, keys, overlaps
    return overlaps.size


class Overlaps:
    """The predecessors of each packed interval: the earlier blocks (released before it is
    taken) that share any of its addresses. Worked out per interval only when asked
    (`predecessors`): a run sifts just the blocks released behind a copy (`among`), and a
    planner packs thousands of blocks for every decision it weighs."""

    def __init__(self, offset, top, start, end):
        self.offset, self.top, self.start, self.end = offset, top, start, end
        self.size = int(top.max())
        self._of: list = [None] * len(offset)
        self._by_release = None       # what of() sifts with, made at its first call
        # among() sifts a few candidates at a time: Python lists beat array calls there
        self._rows = (offset.tolist(), top.tolist(), start.tolist(), end.tolist())

    def of(self, i: int):
        """Interval i's predecessors' positions (a sorted array)."""
        got = self._of[i]
        if got is None:
            if self._by_release is None:
                # With the blocks sorted by their release, the ones released before interval
                # i starts are a prefix of that order.
                by_end = np.argsort(self.end, kind="stable")
                released = np.searchsorted(self.end[by_end], self.start, side="right")
                self._by_release = (by_end, released, self.offset[by_end], self.top[by_end])
            by_end, released, off_by_end, top_by_end = self._by_release
            r = released[i]
            hit = (off_by_end[:r] < self.top[i]) & (top_by_end[:r] > self.offset[i])
            got = self._of[i] = np.sort(by_end[:r][hit])
        return got

    def among(self, i: int, candidates: list) -> list:
        """Of `candidates` (positions, sorted), interval i's predecessors, in that order: as
        of(i) masked to them, at the cost of the candidates alone."""
        offset, top, start, end = self._rows
        at, below, taken = offset[i], top[i], start[i]
        return [j for j in candidates
                if end[j] <= taken and offset[j] < below and top[j] > at]


# A block that shares its time with at most this many placed blocks is placed in plain
# Python; one with more, in array operations (their fixed cost pays off only on longer runs).
_FEW = 24


def _place(need, start, end, alignment: int):
    """The offsets of the greedy packing (see pack): intervals largest first, each at the
    lowest aligned address free of the placed intervals alive at the same time.

    Which placed intervals are alive together with each one does not depend on where they
    were placed, so those lists are worked out first for all of them at once
    (`_placed_before`). Then each interval's neighbours are walked by address: the candidate
    address is the aligned end of the highest neighbour seen so far (0 before the first),
    and the walk stops at the first neighbour that starts at or after candidate + size; so
    the answer is that running maximum at the first such neighbour (or after the last one).
    Most intervals of a step are alive with a few others only, and then the walk costs a few
    Python operations; a very deep network has thousands of blocks, and a planner packs a
    layout for every decision it weighs.
    """
    n = len(need)
    starts, needs = start.tolist(), need.tolist()
    order = sorted(range(n), key=lambda i: (-needs[i], starts[i]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    first, neighbours = _placed_before(start, end, rank)
    bounds = first.tolist()
    together = _alive_together(first, neighbours, start, end).tolist()
    # Every offset is a multiple of the alignment (0, or the aligned end of a placed
    # interval), so each placed interval spans its size rounded up to it, whatever its
    # offset: the widths its neighbours add up to are known before any is placed.
    width = (need + alignment - 1) // alignment * alignment
    widths = _neighbour_sums(first, width[neighbours]).tolist()
    lo = np.zeros(n, dtype=np.int64)      # offset of each placed interval
    hi = np.zeros(n, dtype=np.int64)      # its aligned end
    los, his = [0] * n, [0] * n           # the same, for the walks in plain Python
    for i in order:
        size, a, b = needs[i], bounds[i], bounds[i + 1]
        at = 0
        if b - a <= _FEW:
            for j_lo, j_hi in sorted([(los[j], his[j]) for j in neighbours[a:b].tolist()]):
                if j_lo >= at + size:
                    break
                if j_hi > at:
                    at = j_hi
        else:
            near = neighbours[a:b]
            near_hi = hi[near]
            top = int(near_hi.max())
            # Neighbours alive at one moment do not share addresses: when their widths add
            # up to the highest end, they fill everything below it, and when the bytes they
            # leave free below it are fewer than `size`, no gap between them can hold it:
            # either way the answer is that highest end.
            if together[i] and (widths[i] == top or top - widths[i] < size):
                at = top
            else:
                near_lo = lo[near]
                by_address = np.argsort(near_lo, kind="stable")
                n_lo, n_hi = near_lo[by_address], near_hi[by_address]
                if size > n_lo[0]:
                    reach = np.maximum.accumulate(n_hi)
                    fits = reach[:-1] + size <= n_lo[1:]    # between neighbour j and j + 1
                    j = int(fits.argmax()) if fits.size else 0
                    at = int(reach[j] if fits.size and fits[j] else reach[-1])
        end_at = (at + size + alignment - 1) // alignment * alignment
        lo[i], hi[i], los[i], his[i] = at, end_at, at, end_at
    return lo


def _neighbour_sums(first, values):
    """For each interval i, the sum of values[first[i]:first[i + 1]] (0 for none)."""
    n = len(first) - 1
    sums = np.zeros(n, dtype=np.int64)
    some = np.flatnonzero(np.diff(first) > 0)
    if some.size:
        sums[some] = np.add.reduceat(values, first[some])
    return sums


def _alive_together(first, neighbours, start, end):
    """For each interval, whether all its earlier neighbours (see _placed_before) are alive
    at one moment (the latest start before the earliest end)."""
    n = len(first) - 1
    counts = np.diff(first)
    together = np.zeros(n, dtype=bool)
    some = np.flatnonzero(counts > 0)
    if some.size:
        at = first[some]
        latest = np.maximum.reduceat(start[neighbours], at)
        earliest = np.minimum.reduceat(end[neighbours], at)
        together[some] = latest < earliest
    return together


def _placed_before(start, end, rank):
    """For each interval i, the intervals alive at the same time as it (start < i's end and
    end > i's start) that come earlier in the packing order (`rank`): the positions
    neighbours[first[i]:first[i + 1]]."""
    n = len(start)
    proper = np.flatnonzero(end > start)
    # Two proper intervals overlap when one starts while the other is alive: by start, each
    # interval pairs with those after it that start before it ends (a contiguous run).
    by_start = proper[np.argsort(start[proper], kind="stable")]
    s_sorted = start[by_start]
    stop = np.searchsorted(s_sorted, end[by_start], side="left")
    runs = np.maximum(stop - np.arange(1, len(by_start) + 1), 0)
    total = int(runs.sum())
    one = np.repeat(by_start, runs)
    # the k-th pair of the interval at sorted position p is p + 1 + k: pair number minus
    # where the interval's run starts, plus p + 1
    back = np.repeat(np.cumsum(runs) - runs - np.arange(1, len(by_start) + 1), runs)
    other = by_start[np.arange(total) - back]
    # An empty or reversed interval (end <= start) is compared with every interval as is.
    odd = np.flatnonzero(end <= start)
    if odd.size:
        extra = [(d, j) for d in odd.tolist()
                 for j in np.flatnonzero((start < end[d]) & (end > start[d])).tolist()
                 if j != d and (end[j] > start[j] or j > d)]
        if extra:
            pairs = np.array(extra, dtype=np.int64)
            one, other = np.concatenate((one, pairs[:, 0])), np.concatenate((other, pairs[:, 1]))
    later = rank[one] > rank[other]
    owner = np.where(later, one, other)
    placed = np.where(later, other, one)
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=first[1:])
    # Grouped by owner. No reader depends on the order within a list (_place sorts each by
    # address, or sums, or takes extremes), so the pairs are sorted as one key each, owner
    # above placed: with 16-bit positions, 32-bit keys, whose plain sort is several times
    # faster than a stable argsort on the pairs of a very deep network.
    if n <= 1 << 16:
        keys = (owner.astype(np.uint32) << 16) | placed.astype(np.uint32)
        return first, (np.sort(keys) & 0xFFFF).astype(np.int64)
    return first, placed[np.argsort(owner * n + placed)]


def live_peak(intervals) -> int:
    """The most aligned bytes of `intervals` alive at once: no packing of them is smaller
    (the blocks alive at that moment all need their own addresses)."""
    intervals = list(intervals)
    if not intervals:
        return 0
    need = np.array([aligned(iv.nbytes) for iv in intervals], dtype=np.int64)
    times = np.array([iv.start for iv in intervals] + [iv.end for iv in intervals],
                     dtype=np.int64)
    deltas = np.concatenate((need, -need))
    order = np.lexsort((deltas, times))      # by time; at one time, releases first
    return max(int(np.cumsum(deltas[order]).max()), 0)


class StaticLayout:
    """Packed intervals of one step: `size` bytes of region, `intervals` by (sid, k)."""

    def __init__(self, intervals: list[Interval], alignment: int = ALIGNMENT):
        self.size = pack(intervals, alignment)
        self.intervals = {iv.key: iv for iv in intervals}
        self.overlaps = intervals[0].overlaps if intervals else None
        self._live_peak = None

    def workspace_bytes(self) -> int:
        """Bytes of the planned workspace blocks (all of them, not at once)."""
        return sum(iv.nbytes for iv in self.intervals.values()
                   if isinstance(iv.sid, tuple) and iv.sid[0] == "workspace")

    def live_peak(self) -> int:
        """The most aligned bytes alive at once (what no layout can beat). Worked out once:
        every step's memory_stats() reports it."""
        if self._live_peak is None:
            self._live_peak = live_peak(self.intervals.values())
        return self._live_peak


class PlannedBlocks(DynamicBlocks):
    """Blocks at the planned offsets of one region (a flat uint8 device array of layout.size).

    acquire(fm, where, stream): the storage's next planned block; `stream` (the one that will
    write it first) waits on the release events of its predecessors. release(fm, after):
    remembers `after` (the copy that may still use the block) for later occupants.
    """
    plans_workspace = True

    def __init__(self, layout: StaticLayout, region, allocator):
        super().__init__(allocator)
        self.layout = layout
        self.region = region
        self._count: dict[int, int] = {}
        self._current: dict[int, Interval] = {}   # sid -> its planned block now held
        # By interval position: the event a block was released behind (None: none needed).
        # Per stream (by id), the positions (a sorted list) whose event it has not been made
        # to wait on yet this step: an event is recorded once, so a second wait on it orders
        # nothing more. A block of a very deep network has hundreds of predecessors, most of
        # them released without a copy or waited on already, so only the blocks with an
        # event still due are sifted (a few at a time: plain lists).
        n = len(layout.intervals)
        self._event: list = [None] * n
        self._any_event = False                   # any block released behind a copy yet
        self._due: dict[int, list] = {}
        self.unplanned = 0                        # blocks that fell back to the allocator

    def begin_step(self, device) -> None:
        # Copies of the last step that may still touch the region: every stream starts behind them.
        events = [ev for ev in self._event if ev is not None]
        for ev in events:
            device.compute.wait_event(ev)
            device.prefetch.wait_event(ev)
        self._count.clear()
        self.settle()

    def settle(self) -> None:
        """Forget the release events: their copies are done, or (recorded while a step was
        captured as a CUDA graph) they never happen as such."""
        self._event = [None] * len(self._event)
        self._any_event = False
        self._due.clear()

    def acquire(self, fm, where, stream):
        k = self._count.get(fm.sid, 0)
        self._count[fm.sid] = k + 1
        iv = self.layout.intervals.get((fm.sid, k))
        if iv is None or iv.nbytes != fm.nbytes:
            self.unplanned += 1
            return super().acquire(fm, where, stream)
        # Until a block is released behind a copy there is nothing to wait on: skip the sift.
        if self._any_event:
            pending = self._due.get(id(stream))
            if pending is None:
                pending = self._due[id(stream)] = [j for j, ev in enumerate(self._event)
                                                   if ev is not None]
            due = self.layout.overlaps.among(iv.index, pending) if pending else ()
            if due:
                for j in due:
                    stream.wait_event(self._event[j])
                waited = set(due)
                self._due[id(stream)] = [j for j in pending if j not in waited]
        self._current[fm.sid] = iv
        return self.region[iv.offset:iv.offset + fm.nbytes]

    def release(self, fm, after) -> None:
        iv = self._current.pop(fm.sid, None)
        if iv is None:
            super().release(fm, after)
        elif after is not None:
            self._event[iv.index] = after
            for pending in self._due.values():
                bisect.insort(pending, iv.index)
            self._any_event = True

