"""Checkpointed segments: the planner's search that recomputes whole runs of maps.

A run is a chain of recompute candidates each rebuilt from the one before alone (a VGG
stage's convolution maps, a ResNet block's conv and batch-norm maps). `search` cuts every
run into segments of a target size (a ladder of sizes, in multiples of the largest map),
every map of a segment recomputed from the checkpoint before it, kept or offloaded, as
checkpoint_sequential does; it returns the fastest that fits. Where no size with kept
checkpoints fits, `then_greedy` starts the greedy search from the size that comes closest:
a few more moves (a map that starts no chain recomputed, a small one offloaded) often fit
what a size alone does not. The functions take the search.Planner whose candidates, step
model and limits they use.
"""
from __future__ import annotations

from .step_model import Unfit

# Segment sizes the checkpointed-segments search tries, in multiples of the largest map of
# the runs it cuts.
SEGMENT_MULTIPLES = (1, 2, 3, 4, 6, 8, 12, 16)


def runs(planner) -> list[list[int]]:
    """Maximal runs of recompute candidates each rebuilt from the one before alone (a
    VGG stage's convolution maps, a ResNet block's conv and batch-norm maps), in forward
    order: the chains a segment is cut from."""
    plan, cand = planner.plan, set(planner.rebuildable)
    nxt = {}
    for sid in planner.rebuildable:
        preds = planner._rebuilt_from[sid] & cand
        if len(preds) == 1:
            (p,) = preds
            if len(planner._rebuilds[p]) == 1:
                nxt[p] = sid
    starts = cand - set(nxt.values())
    out = []
    for sid in sorted(starts, key=lambda t: plan.storages[t].last_forward_write):
        run = [sid]
        while run[-1] in nxt:
            run.append(nxt[run[-1]])
        if len(run) > 1:
            out.append(run)
    return out


def decision(planner, runs, segment_bytes: int, offload_checkpoints: bool) -> tuple:
    """(offload, recompute) cutting each run into segments of at most `segment_bytes`:
    every map of a segment is recomputed, from the checkpoint that ends the segment
    before (kept, or offloaded), as checkpoint_sequential does, with a segment length
    per run by its maps' bytes."""
    offload, recompute = set(), set()
    candidates = set(planner.candidates)
    for run in runs:
        held = 0
        for sid in run:
            if held + planner._bytes[sid] > segment_bytes and held > 0:
                held = 0        # a checkpoint: the next segment starts after it
                if offload_checkpoints and sid in candidates:
                    offload.add(sid)
                continue
            recompute.add(sid)
            held += planner._bytes[sid]
    return frozenset(offload), frozenset(recompute)


def _ladder(planner, runs, offload_checkpoints: bool, multiples=SEGMENT_MULTIPLES):
    """(offload, recompute) of each size of `multiples` (of the runs' largest map) in turn,
    made as it is asked for."""
    largest = max(planner._bytes[sid] for run in runs for sid in run)
    for multiple in multiples:
        yield decision(planner, runs, largest * multiple, offload_checkpoints)


def search(planner, bound: float | None = None):
    """Checkpointed segments: each run of candidates cut into segments of a target size
    (a ladder of sizes, in multiples of the largest map), their checkpoints kept or
    offloaded; the fastest that fits, or None.

    Longer segments recompute more maps (slower) and keep fewer checkpoints: kept, those
    take less memory, but the segment rebuilt at once takes more; offloaded, fewer bytes
    cross the link (faster) and the segment takes more memory. So kept checkpoints are
    tried from the shortest segments up, offloaded ones from the longest down, each up to
    the first that fits. A size whose compute alone (every layer's fastest time and the
    writers of its recomputed maps run again) is slower than `bound` is not walked."""
    found_runs = runs(planner)
    if not found_runs:
        return None
    m = planner.model
    found = []
    for offload_checkpoints, multiples in ((False, SEGMENT_MULTIPLES),
                                           (True, SEGMENT_MULTIPLES[::-1])):
        for offload, recompute in _ladder(planner, found_runs, offload_checkpoints,
                                          multiples):
            if planner._out_of_evaluations():
                break
            if bound is not None and planner.least_step_s(recompute) > bound:
                continue
            # Only the first size that fits is kept: one that a bound shows cannot fit
            # is walked, not packed or timed (StepModel.evaluate_if_fits).
            ev = m.evaluate_if_fits(offload, m.algos("fastest"), recompute)
            if ev is not None:
                found.append(ev)
                break
    return min(found, key=lambda ev: ev.step_time_s, default=None)


def then_greedy(planner, bound: float | None = None, prune: bool = True):
    """The greedy search (search.Planner.greedy) started from the checkpointed segments with
    kept checkpoints that need the least, when none of those sizes fits; its answer, pruned,
    or None (a size fits, or greedy finds nothing that fits faster than `bound`);
    unpruned with prune=False.

    Segments free most maps of a deep residual network at the price of one forward run
    again, but a map that starts no chain (ResNet-50's conv1, a block's downsampling
    convolution) stays, and one size may be just over the budget: ResNet-50 b256 TF32 with
    whole-batch statistics in 8 GiB on the H200's model, segments of 2 x 784 MiB need 9.38
    GiB at 93.1 ms, and greedy from them fits 7.85 GiB at 93.7 ms by recomputing two such
    maps and offloading about 40 small statistics, where greedy from nothing fits at 204 ms.
    Sizes are compared by what they need at least (StepModel.least_required, which the
    ladder has computed) or, walked in full, by what they need."""
    found_runs = runs(planner)
    if not found_runs:
        return None
    m = planner.model
    algos = m.algos("fastest")
    closest = None
    for offload, recompute in _ladder(planner, found_runs, False):
        if planner._out_of_evaluations():
            return None
        if bound is not None and planner.least_step_s(recompute) > bound:
            continue                          # as search() skips it
        if m.evaluate_if_fits(offload, algos, recompute) is not None:
            return None                       # a size fits: search() has it
        entry = m.cache[m.key(offload, algos, recompute)]
        need = entry.least if isinstance(entry, Unfit) else entry.required_bytes
        if closest is None or need < closest[0]:
            closest = (need, offload, recompute)
    if closest is None:
        return None
    start = m.evaluate(closest[1], algos, closest[2])
    return planner.greedy(bound, prune, start=start)
