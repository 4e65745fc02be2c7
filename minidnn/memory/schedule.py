"""The step schedule: one training step's layer calls in order, and vDNN's core beside them.

Compiled once from the liveness plan (memory/plan.py) and a decision's offload and recompute
sets (memory/policy.py), a StepSchedule is the only place the order of a step is written
down. The executor walks it to run a step, memory/record.py walks it to record the blocks
the static layout packs (memory/layout.py), and the planner's step model walks the executor's
dry run, so all three see the same calls:

    forward 0, forward 1, ..., forward n-1,
    [recompute j ... for backward n-1], backward n-1, ..., [recompute j ...], backward 0

Around each call the memory manager (memory/manager.py) does what the schedule's tables say:

* vDNN's core, for a storage in `offload`:
    - offload  after its LAST FORWARD WRITE: the copy to host starts behind the writer's
               kernels, so it overlaps the layers that follow (`offload_after`);
    - evict    after its LAST FORWARD READ: the device block is released (the arena reuses
               it once the copy is done), since no forward call needs it again
               (`evict_after`);
    - prefetch in backward, the PREFETCH WINDOW: before each backward call, the maps the next
               `prefetch_lookahead` backward calls read come back on the prefetch stream,
               stopping after the first convolution (`window_reads`, manager._prefetch_window).
* recomputation, for a storage in `recompute`: dropped after its last forward use
  (`drop_after`) and rebuilt right before its first backward reader by running its writers'
  forward again (`recompute_at`, `rebuild`, and the "recompute" calls of the schedule).
  A storage may be rebuilt from others that are recomputed too (a chain, as a checkpointed
  segment is): those are rebuilt with it, first, in forward order, at the earliest time any
  storage of the chain is needed (`rebuild_time`), and stay until their own backward.
* free: every storage is freed (its blocks released) at its liveness free time
  (`frees_train`; `frees_eval` in an evaluation step, which runs only the forward calls).

Validation of a decision lives here: what cannot be offloaded or recomputed raises before a
step runs. The manager keeps residency and movement only.
"""
from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass

from .plan import LivenessPlan
from .policy import recompute_candidates, recompute_inputs

# The layer calls of a training step, in the order their kinds first appear.
PHASES = ("forward", "recompute", "backward")


@dataclass(frozen=True)
class Call:
    """One layer call: `phase` of node `index`. A 'recompute' call serves the backward of
    node `before` (its first reader), right before it."""
    phase: str
    index: int
    before: int = -1


class StepSchedule:
    """The calls of one step of `plan` under an offload and a recompute set (storage ids).

    Raises ValueError for a storage that cannot be offloaded (not a feature map backward
    reads) or recomputed (see memory.policy.recompute_candidates), and for one in both sets.
    """

    def __init__(self, plan: LivenessPlan, offload=(), recompute=()):
        self.plan = plan
        self.offload = frozenset(int(s) for s in offload)
        self.recompute = frozenset(int(s) for s in recompute)
        self._check()
        # Storages freed at each time of the step, for training and for evaluation
        # ({time: storage ids}), and the calls when nothing is recomputed: the plan's alone.
        self.frees_train, self.frees_eval, self.forward, plain_backward = _plan_tables(plan)
        # vDNN: offload after the last forward write, evict after the last forward read.
        self.offload_after: dict[int, list[int]] = defaultdict(list)
        self.evict_after: dict[int, list[int]] = defaultdict(list)
        for sid in sorted(self.offload):
            s = plan.storages[sid]
            self.offload_after[s.last_forward_write].append(sid)
            self.evict_after[s.last_forward_use].append(sid)
        # Recomputation: drop after the last forward use, rebuild before the backward of a
        # reader (node: the first to read it or a storage rebuilt from it) from the writers
        # (nodes) and the storages they read that are not rebuilt themselves.
        self.drop_after: dict[int, list[int]] = defaultdict(list)
        self.recompute_at: dict[int, list[int]] = defaultdict(list)
        self.rebuild: dict[int, tuple] = {}
        self.rebuild_time = _rebuild_times(plan, self.recompute)
        # What the prefetch window brings back for node j: what j's recomputations read, then
        # what its backward reads.
        self.window_reads: list[list[int]] = [[] for _ in plan.nodes]
        for sid in sorted(self.recompute):
            reader = plan.node_at(self.rebuild_time[sid])
            self.drop_after[plan.storages[sid].last_forward_use].append(sid)
            self.recompute_at[reader].append(sid)
            self.rebuild[sid] = (plan.writers(sid), [t for t in recompute_inputs(plan, sid)
                                                     if t not in self.recompute])
            self.window_reads[reader].extend(self.rebuild[sid][1])
        for j, reads in enumerate(plan.backward_reads):
            self.window_reads[j].extend(reads)
        # The calls, in order (forward ones above).
        if not self.recompute:
            self.backward = plain_backward
        else:
            backward = []
            for call in plain_backward:
                if call.index in self.recompute_at:     # writers to run again first
                    backward += [Call("recompute", j, call.index)
                                 for j in self.writers_to_rerun(call.index)]
                backward.append(call)
            self.backward = tuple(backward)

    def _check(self) -> None:
        plan = self.plan
        for sid in sorted(self.offload):
            s = plan.storages[sid]
            if s.kind == "grad" or not s.needed_in_backward:
                raise ValueError(f"storage {sid} ({s.tensors[0]}) cannot be offloaded: only "
                                 f"feature maps that backward reads can")
        if not self.recompute:
            return
        allowed = {s.id for s in recompute_candidates(plan)}
        for sid in sorted(self.recompute):
            name = plan.storages[sid].tensors[0]
            if sid not in allowed:
                raise ValueError(f"storage {sid} ({name}) cannot be recomputed: see "
                                 f"memory.policy.recompute_candidates for which can")
            if sid in self.offload:
                raise ValueError(f"storage {sid} ({name}) is both offloaded and recomputed")

    def writers_to_rerun(self, i: int, skip=()) -> list[int]:
        """Nodes whose forward runs again, in order, before node i's backward: the writers of
        the dropped storages node i's backward is the first to read (leaving out `skip`)."""
        sids = [sid for sid in self.recompute_at.get(i, ()) if sid not in skip]
        return sorted({j for sid in sids for j in self.rebuild[sid][0]})

    def chains(self) -> list[list[int]]:
        """The recompute set in groups rebuilt one from another (a segment; a map rebuilt
        from nothing recomputed is a group of one), each in forward order."""
        group = {sid: sid for sid in self.recompute}

        def root(sid: int) -> int:
            while group[sid] != sid:
                sid = group[sid]
            return sid

        for sid in self.recompute:
            for t in recompute_inputs(self.plan, sid):
                if t in group:
                    group[root(t)] = root(sid)
        out: dict = defaultdict(list)
        for sid in sorted(self.recompute,
                          key=lambda s: (self.plan.storages[s].last_forward_write, s)):
            out[root(sid)].append(sid)
        return list(out.values())

    def calls(self, train: bool = True) -> tuple:
        """Every call of a training step (train) or of an evaluation step (forward only)."""
        return self.forward + self.backward if train else self.forward


def _rebuild_times(plan: LivenessPlan, recompute: frozenset) -> dict[int, int]:
    """{storage id: the backward time it is rebuilt at}: its first backward use, or earlier
    when a storage rebuilt from it is needed first (a chain is rebuilt at once).

    A storage is rebuilt from what its writers read after their last write, so every
    storage of the set it reads was written before: walking the set from the last written
    down, each one's time is final before it is handed to the storages it is rebuilt from.
    Those are intact then (recompute_candidates: intact at the storage's own first backward
    use, and so at any earlier time of backward too).
    """
    when = {sid: plan.storages[sid].first_backward_use for sid in recompute}
    for sid in sorted(recompute, key=lambda s: -plan.storages[s].last_forward_write):
        for t in recompute_inputs(plan, sid):
            if t in when and when[sid] < when[t]:
                when[t] = when[sid]
    return when


# plan -> (frees_train, frees_eval, forward calls, backward calls without recomputation): facts
# of the plan alone, which every schedule of it shares (the planner compiles a schedule for
# every decision it weighs, and a plan does not change once made).
_PLAN_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan_tables(plan: LivenessPlan) -> tuple:
    tables = _PLAN_TABLES.get(plan)
    if tables is None:
        frees_train: dict = defaultdict(list)
        frees_eval: dict = defaultdict(list)
        for s in plan.storages:
            frees_train[s.free_time].append(s.id)
            if s.kind != "grad":
                frees_eval[s.last_forward_use].append(s.id)
        n = plan.num_nodes
        tables = _PLAN_TABLES[plan] = (
            {t: tuple(sids) for t, sids in frees_train.items()},
            {t: tuple(sids) for t, sids in frees_eval.items()},
            tuple(Call("forward", i) for i in range(n)),
            tuple(Call("backward", i) for i in reversed(range(n))))
    return tables


def walk(schedule: StepSchedule, manager, part: str = "step"):
    """Yield the calls of `part` ('forward', 'backward' or the whole 'step') in order, as
    `manager` will serve them.

    Lazily: before the first recompute call serving node i's backward, the manager readies
    what the recomputations read and issues i's prefetch window (`recompute_before`), and
    recompute calls of storages it keeps anyway are left out. The caller serves each call
    with manager.buffers(call), runs the layer, then manager.after(call).
    """
    if part not in ("forward", "backward", "step"):
        raise ValueError(f"part must be 'forward', 'backward' or 'step', got {part!r}")
    if part != "backward":
        yield from schedule.forward
    if part == "forward":
        return
    ready_for, rerun = None, ()
    for call in schedule.backward:
        if call.phase == "recompute":
            if ready_for != call.before:
                ready_for, rerun = call.before, set(manager.recompute_before(call.before))
            if call.index not in rerun:
                continue
        yield call
