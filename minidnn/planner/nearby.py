"""A lower bound on a decision's feature-map region from the blocks of a neighbouring decision
already evaluated, with no walk of the memory manager.

Pruning (search.Planner.prune) tries decisions that differ from an evaluated one, `near`, by
one move back: an offload or a recomputation dropped, or one convolution on a faster
setting. Most of them cannot fit, and showing it used to cost a dry walk of the memory
manager each (StepModel.least_required). Their blocks follow from near's, because the
manager decides what to do with each storage from the schedule's tables and that storage's
own state only (memory/manager.py, memory/schedule.py):

* offload of `s` dropped: s is no longer evicted after its last forward read nor fetched back
  in backward; every other block is taken and released in the same order. So the step's
  blocks are near's with s's two blocks joined into one (first taken to last released).
* recomputation of `s` dropped: the same join for s, and the blocks whose order may change
  are left out: the blocks fetched back in backward of the offloaded storages that
  rebuilding s read (fetched early for it; their forward blocks stay) and the workspace
  and scratch blocks of s's writers run again.
* a convolution on another setting: only its workspace blocks change size (a block that is
  new is left out; one of no bytes is left out).

Leaving blocks out can only lower the most bytes alive at once, and keeping the order of the
others keeps what is alive together, so the result never exceeds what the decision's own walk
would give (memory/layout.py: live_peak). Any other difference (something added) gives None:
the caller walks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..memory.allocator import aligned
from ..memory.policy import recompute_inputs


@dataclass
class StepBlocks:
    """The blocks of one decision's step as its static layout recorded them (layout.Interval),
    in record order: sids[b] (a storage id, or (kind, node index, phase) for a call's
    workspace or scratch block), ks[b] (the storage's k-th block), need[b] (aligned bytes),
    start[b] and end[b] (positions in the manager's sequence of block operations, all
    distinct)."""
    sids: list
    ks: list
    need: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, intervals) -> "StepBlocks":
        ivs = list(intervals)
        return cls(sids=[iv.sid for iv in ivs], ks=[iv.k for iv in ivs],
                   need=np.array([aligned(iv.nbytes) for iv in ivs], dtype=np.int64),
                   start=np.array([iv.start for iv in ivs], dtype=np.int64),
                   end=np.array([iv.end for iv in ivs], dtype=np.int64))


def peak_bytes(need: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """The most bytes of blocks alive at once (as layout.live_peak: at one position a release
    comes first; positions here are distinct anyway)."""
    if need.size == 0:
        return 0
    times = np.concatenate((start, end))
    deltas = np.concatenate((need, -need))
    order = np.lexsort((deltas, times))
    return max(int(np.cumsum(deltas[order]).max()), 0)


def region_bound(blocks: StepBlocks, plan, near: tuple, decision: tuple,
                 workspace: dict | None = None) -> int | None:
    """A lower bound on the most feature-map bytes alive at once in `decision`'s step, from
    the blocks of `near`'s (see module doc); None when the two differ otherwise than by one
    move back.

    Args:
        blocks: near's StepBlocks.
        plan: the LivenessPlan of both.
        near, decision: (offload, recompute, conv settings as a tuple in one fixed order)
            of the evaluated decision and of the one to bound.
        workspace: {(node index, phase): bytes} of `decision`'s planned workspace blocks
            (needed only when the conv settings differ).
    """
    (near_off, near_re, near_algo), (off, re, algo) = near, decision
    if not (off <= near_off and re <= near_re):
        return None
    dropped = (near_off - off) | (near_re - re)
    changed = near_algo != algo
    if len(dropped) + bool(changed) != 1:
        return None
    keep = np.ones(len(blocks.sids), dtype=bool)
    need, start, end = blocks.need, blocks.start, blocks.end
    extra = None                        # the joined block of the storage kept on the device
    if dropped:
        (s,) = dropped
        mine = np.array([sid == s for sid in blocks.sids], dtype=bool)
        if mine.any():
            extra = (int(need[mine][0]), int(start[mine].min()), int(end[mine].max()))
        keep &= ~mine
        if s in near_re:
            fetched = {t for t in recompute_inputs(plan, s) if t in near_off}
            rerun = {(kind, j, "recompute") for j in plan.writers(s)
                     for kind in ("workspace", "scratch")}
            keep &= np.array([not ((sid in fetched and k > 0) or sid in rerun)
                              for sid, k in zip(blocks.sids, blocks.ks)], dtype=bool)
    else:
        if workspace is None:
            return None
        need = need.copy()
        for b, sid in enumerate(blocks.sids):
            if isinstance(sid, tuple) and sid[0] == "workspace":
                nbytes = workspace.get((sid[1], sid[2]), 0)
                if nbytes:
                    need[b] = aligned(nbytes)
                else:
                    keep[b] = False
    need, start, end = need[keep], start[keep], end[keep]
    if extra is not None:
        need = np.append(need, extra[0])
        start = np.append(start, extra[1])
        end = np.append(end, extra[2])
    return peak_bytes(need, start, end)
