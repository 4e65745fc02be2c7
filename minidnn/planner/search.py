"""The planner: which feature maps to offload or recompute and which convolution plan each
layer runs, so that a training step fits the memory budget at the lowest predicted step time.

Every candidate is judged by the StepModel (step_model.py): the real memory manager walked
through the steps in a dry run, then timed against the profile. So a decision the planner
calls feasible is one the dry run has seen fit, workspace and temporaries included.

Three searches run, and the fastest feasible answer wins:

* vDNN_dyn's greedy order (Rhu et al. 2016), the floor: no offload with the fastest plans;
  else vDNN_conv, then vDNN_all, with the fastest plans; then, still offloading everything,
  switch layers to their memory-optimal plan, largest workspace first, as few as make it fit
  (the count found by bisection).
* Greedy by time cost per byte saved: start from no offload and fastest plans; each round,
  take the moves that can lower what the step needs (offload, or recompute in backward, one
  more feature map that is on the device where the step needs the most, or where the most
  feature-map bytes are live, which with the static layout sets the region's size; or move
  the neediest call's convolution, or the one with the largest workspace, one setting
  leaner: to the next workspace limit measured for it, down to its memory-optimal plan),
  evaluate the most promising few exactly, and take the one that adds the least step time
  per byte it saves (with the next best ones while the step is still far over). Repeat until
  the step fits; then prune: drop each offload and recomputation, turn an offload into a
  recomputation, and move each convolution back to a faster setting when the budget allows
  and the step gets faster. On a fast GPU, where copies do not hide behind compute, this
  moves far fewer bytes than vDNN_conv/all: a map whose writers are cheap to run again (a
  convolution on the three channels of the input image) is recomputed instead of copied.
  It recomputes one level deep: no map is rebuilt from another rebuilt one.
* Checkpointed segments, as torch.utils.checkpoint_sequential keeps them: each run of maps
  rebuilt one from the other (a VGG stage, a ResNet block) is cut into segments of a target
  size whose maps are all recomputed, rebuilt together from the checkpoint before them (kept
  or offloaded) when backward first needs one (memory/schedule.py: a chain); a ladder of
  sizes is tried. A very deep network, where one-level recomputation frees at most every
  other map, fits this way at the cost of about one forward pass run again. Where no size
  with kept checkpoints fits, greedy starts again from the one that comes closest
  (segments.then_greedy): a few more moves often fit what a size alone does not.

The fastest answer is then pruned (see `prune`).

Below the least memory any decision needs (everything offloaded, every convolution
memory-optimal) the planner raises InfeasibleBudgetError naming that minimum.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from ..chunks import describe
from ..errors import MemoryBudgetError, MinidnnError, fmt_bytes
from ..memory.policy import get_policy, offload_candidates, recompute_candidates, \
    recompute_inputs
from .costs import Profile, least_step_s
from ..spec import StepSpec
from . import segments
from .step_model import Evaluation, PlanOptions, StepModel, pass_spec

# A network with more offload candidates than this plans in bulk while it is over the budget
# (a very deep network, where moving one map per round would take hundreds of rounds): each
# round first applies, in one evaluation, as many of the most promising moves at the peak as the
# estimates say cover the deficit, and the pruning afterwards tries at most BULK_PRUNE decisions.
# A step with layer chunks plans in bulk too (its chunks have a map per piece, each a p-th
# of the layer's). Other networks (every built-in model but the very deep VGGs) plan one
# move at a time.
BULK_CANDIDATES = 128
# VGG-416 b32 under 12 GiB (H200 profile): 24 tries took the chosen plan from 874.6 to
# 871.3 ms, 12 tries to 872.9 ms in half the time.
BULK_PRUNE = 12


# DEFAULT_RESERVE (step_model.py): the fraction of the budget left unplanned: the arena's
# free blocks come in pieces (fragmentation), so a plan that fills the budget to the byte may
# still not find a block.


class NothingFaster(Exception):
    """Planner.run(bound=...) found no decision that fits and is faster than the bound: the
    caller already has a better plan (planner/split.py: another micro-batch count)."""


def budget_to_give(minimum: int) -> str:
    """The least budget as --memory-budget takes it, rounded up so that it trains and by so
    little that 1% less would not: '2.02GiB', '301MiB', '5.01MiB', '214KiB' (hundredths of a
    GiB, else three significant digits)."""
    if minimum >= 2**30:
        return f"{math.ceil(minimum / 2**30 * 100) / 100:.2f}GiB"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if minimum >= size:
            value = minimum / size
            decimals = max(0, 3 - len(str(int(value))))
            return f"{math.ceil(value * 10**decimals) / 10**decimals:.{decimals}f}{unit}"
    return f"{int(minimum)}B"


class InfeasibleBudgetError(MemoryBudgetError):
    """No decision fits the budget. `minimum` is the least budget that works (bytes)."""

    def __init__(self, minimum: int, budget: int, what: str, static_bytes: int,
                 hint: str = "", has_convs: bool = True):
        self.requested, self.in_use, self.budget, self.where = minimum, 0, budget, what
        self.minimum = minimum
        suggest = budget_to_give(minimum)
        convs = ", every convolution on its memory-optimal plan" if has_convs else ""
        MinidnnError.__init__(
            self, f"memory budget {fmt_bytes(budget)} is too small for {what}: the least it "
                  f"can train in is {suggest} (every feature map that backward reads "
                  f"offloaded{convs}; parameters, gradients, momentum and input batches alone take "
                  f"{fmt_bytes(static_bytes)})"
                  f"; give --memory-budget {suggest} or more, or a smaller batch"
                  + (f"; {hint}" if hint else ""))


@dataclass
class PlanResult:
    """What the planner found. best: the decision to run (fastest feasible seen); floor: what
    vDNN_dyn's greedy order picks (None if it finds nothing); floor_trail: [(label,
    Evaluation)] of the configurations it tried, in order; minimum: everything offloaded and
    memory-optimal; minimum_budget: the least budget that fits; baselines: {'none'|'conv'|'all'
    + '/' + algo: Evaluation}; searches: {'greedy' | 'segments' | 'segments+greedy': the
    fastest feasible decision that search found, or None}; evaluations: decisions the model
    evaluated; seconds: time spent.
    A planner of a very deep network (BULK_CANDIDATES) works out the baselines only when
    they are read.
    """
    model: StepModel
    best: Evaluation
    minimum: Evaluation
    minimum_budget: int
    baselines: dict
    budget: int | None
    usable: int | None
    evaluations: int = 0
    seconds: float = 0.0
    notes: list = field(default_factory=list)
    searches: dict = field(default_factory=dict)   # {search name: fastest found or None}
    planner: object = field(default=None, repr=False)
    vdnn_order: tuple = field(default=(None, ()), repr=False)   # (floor, floor_trail)

    @property
    def decision(self):
        return self.best.decision

    @property
    def floor(self) -> Evaluation | None:
        return self.vdnn_order[0]

    @property
    def floor_trail(self) -> list:
        return self.vdnn_order[1]


class Planner:
    """Plans one network at one batch under one budget from one profile.

    budget: device bytes for everything (None: unlimited: then nothing is offloaded).
    reserve: the fraction of the budget left for fragmentation. momentum, input_batches,
    prefetch_lookahead, static_layout: as the run will use them (see StepModel). shortlist:
    moves evaluated exactly per greedy round; max_evaluations: the search stops there (each
    evaluation is one timed dry run, a third of a second for VGG-416 on one CPU core; a
    decision pruning tries and a lower bound shows cannot fit costs one untimed walk
    instead, see StepModel.evaluate_if_fits) and keeps the best so far. recompute=False:
    only offload (vDNN's own means).
    micro_batches: `batch` is one pass of a step of that many (planner/split.py; the
    profile is at `batch`). relu_bits: the ReLUs that keep bit masks in the run (see
    StepModel). shares_with: a Planner of the same step at another prefetch lookahead, whose
    step model shares the evaluations of decisions that offload nothing (StepModel).
    chunks: the layer chunks the step runs (MemoryDecision.chunks; `profile` is then the
    chunked step's, planner/chunking.chunk_profile); the decisions found carry them.
    """

    def __init__(self, net, spec: StepSpec | int, profile: Profile,
                 options: PlanOptions | None = None, shares_with: Planner | None = None,
                 **settings):
        spec, options = pass_spec(spec, settings, options)     # (the keyword form too)
        if not 0 <= options.reserve < 1:
            raise ValueError(f"reserve must be in [0, 1), got {options.reserve}")
        self.spec, self.options = spec, options
        self.model = StepModel(net, spec, profile, options,
                               usable=None if spec.memory_budget is None else
                               int(spec.memory_budget * (1 - options.reserve)),
                               shares_with=None if shares_with is None else shares_with.model)
        self.net, self.batch, self.profile = net, self.model.batch, profile
        self.budget = spec.memory_budget
        self.reserve = float(options.reserve)
        self.usable = self.model.usable
        prefetch_lookahead, recompute = spec.prefetch_lookahead, options.recompute
        shortlist, max_evaluations, chunks = options.shortlist, options.max_evaluations, \
            spec.chunks
        self.lookahead = int(prefetch_lookahead)
        self.plan = self.model.plan
        self.candidates = [s.id for s in offload_candidates(self.plan)]
        self.rebuildable = [s.id for s in recompute_candidates(self.plan)] if recompute else []
        # What rebuilding each candidate reads, and which candidates are rebuilt from it.
        self._rebuilt_from = {sid: frozenset(recompute_inputs(self.plan, sid))
                              for sid in self.rebuildable}
        self._rebuilds = {sid: set() for sid in self.rebuildable}
        for sid, reads in self._rebuilt_from.items():
            for t in reads & self._rebuilds.keys():
                self._rebuilds[t].add(sid)
        self._bytes = {s.id: s.nbytes for s in self.plan.storages}
        self.shortlist = int(shortlist)
        self.max_evaluations = int(max_evaluations)
        self.deep = len(self.candidates) > BULK_CANDIDATES
        self.bulk = self.deep or bool(chunks)
        self._estimate_cache = None
        self._leaner_of: dict = {}         # (conv name, setting) -> _leaner's answer
        self._least_step = None            # see least_step_s

    # ---- building blocks ---------------------------------------------------------------------
    def policy_offload(self, name: str) -> frozenset:
        """The offload set of a built-in policy ('none', 'conv', 'all')."""
        return frozenset(get_policy(name).decide(self.plan, self.budget).offload)

    def baseline(self, policy: str, algo: str = "fastest") -> Evaluation:
        return self.model.evaluate(self.policy_offload(policy), self.model.algos(algo))

    def _conv_workspace(self, name: str) -> int:
        cost = self.model.conv_cost(name)
        return max(cost.workspace("forward", "fastest"), cost.workspace("backward", "fastest"))

    def minimum(self) -> Evaluation:
        """Everything offloaded, every convolution memory-optimal: the least memory (no other
        decision has fewer feature-map bytes on the device at any moment, or less workspace)."""
        return self.model.evaluate(frozenset(self.candidates), self.model.algos("min_workspace"))

    def minimum_budget(self) -> int:
        return int(math.ceil(self.minimum().required_bytes / (1 - self.reserve)))

    # ---- vDNN_dyn's order --------------------------------------------------------------------
    def floor(self) -> tuple[Evaluation | None, list]:
        """vDNN_dyn's greedy fallback order; returns (first that fits or None, trail)."""
        m = self.model
        trail = []
        for policy in ("none", "conv", "all"):
            ev = self.baseline(policy, "fastest")
            trail.append((f"{policy}, fastest plans", ev))
            if ev.fits:
                return ev, trail
        offload = self.policy_offload("all")
        order = sorted(m.conv_names, key=lambda n: (-self._conv_workspace(n),
                                                    m.conv_nodes[n][0]))
        tried: dict = {}

        def fits(count: int) -> bool:
            """Do the first `count` convolutions of the order on their memory-optimal plan
            make the step fit?"""
            algos = dict(m.algos("fastest"), **{n: "min_workspace" for n in order[:count]})
            tried[count] = m.evaluate(offload, algos)
            return tried[count].fits

        # Each switch frees workspace, so the least count that fits is found by bisection: a
        # few evaluations where a very deep network has hundreds of convolutions.
        lo, hi = 0, len(order)          # a count known not to fit / the least known to fit
        if order and fits(hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(mid):
                    hi = mid
                else:
                    lo = mid
        trail += [(f"all, {order[c - 1]} memory-optimal", tried[c]) for c in sorted(tried)]
        return (tried[hi], trail) if tried.get(hi) is not None and tried[hi].fits \
            else (None, trail)

    # ---- greedy by cost per byte saved -------------------------------------------------------
    def _estimates(self) -> dict:
        """A cheap guess of each move's step-time cost, only to choose which moves to evaluate
        exactly: the part of a map's copies that the neighbouring layers' compute cannot hide
        (its offload behind the layers after its last write, its prefetch behind the backward
        of the layer after its first reader), its writers' forward time for a recomputation,
        or the extra time of a memory-optimal plan."""
        if self._estimate_cache is not None:
            return self._estimate_cache
        plan = self.plan
        n = plan.num_nodes
        fwd = [self.model.layer_time(node.name, "forward") for node in plan.nodes]
        bwd = [self.model.layer_time(node.name, "backward") for node in plan.nodes]
        est = {}
        for sid in self.candidates:
            st = plan.storages[sid]
            w, u = max(st.last_forward_write, -1), st.last_forward_use
            fwd_window = sum(fwd[w + 1:max(u, w + 1) + 1])
            reader = 2 * n - 1 - st.first_backward_use
            bwd_window = bwd[reader + 1] if reader + 1 < n else 0.0
            out = self.model.copy_seconds(st.nbytes, "offload")
            back = self.model.copy_seconds(st.nbytes, "prefetch")
            exposed = max(0.0, out - fwd_window) + max(0.0, back - bwd_window)
            est[("offload", sid)] = (exposed, st.nbytes)
        for sid in self.rebuildable:
            again = sum(fwd[j] for j in plan.writers(sid))
            est[("recompute", sid)] = (again, plan.storages[sid].nbytes)
        self._estimate_cache = est
        return est

    def _leaner(self, ev: Evaluation, name: str) -> str | None:
        """The next leaner plan setting of convolution `name` from its setting in `ev`, if it
        needs less workspace (None otherwise). Kept once worked out: every round asks for
        every convolution, and LayerCost sorts its settings at each ask."""
        now = ev.conv_algo.get(name, "fastest")
        key = (name, now)
        if key not in self._leaner_of:
            cost = self.model.conv_cost(name)
            nxt = cost.leaner(now)
            if nxt is not None and cost.max_workspace(nxt) >= cost.max_workspace(now):
                nxt = None
            self._leaner_of[key] = nxt
        return self._leaner_of[key]

    def _estimate(self, ev: Evaluation, move) -> tuple:
        """(step-time cost, bytes saved) guessed for a move (see _estimates): for a leaner
        convolution setting, its extra time and the workspace it saves."""
        what, x = move
        if what in ("offload", "recompute"):
            return self._estimates()[move]
        cost = self.model.conv_cost(x)
        now, nxt = ev.conv_algo.get(x, "fastest"), self._leaner(ev, x)
        extra = sum(cost.time(p, nxt) - cost.time(p, now) for p in ("forward", "backward"))
        return max(extra, 0.0), cost.max_workspace(now) - cost.max_workspace(nxt)

    def _moves(self, ev: Evaluation, everywhere: bool) -> list:
        """Moves that may lower what `ev` needs (or, with `everywhere`, any move), most
        promising first by the estimates: offloading a map that is on the device at the call
        where the step needs the most, or where the most feature-map bytes are live (with the
        static layout that moment sets the region's size); running the convolution of the
        neediest call, or the one with the largest workspace, one setting leaner."""
        fast = [n for n in self.model.conv_names if self._leaner(ev, n) is not None]
        moved = ev.offload | ev.recompute
        rebuilds = [sid for sid in self.rebuildable if self._may_recompute(ev, sid)]
        if everywhere:
            offloads = [sid for sid in self.candidates if sid not in moved]
            names = fast
        else:
            resident = set(ev.resident.get(ev.fm_peak_point, ()))
            if isinstance(ev.peak_point, tuple):
                resident |= ev.resident.get(ev.peak_point, frozenset())
            offloads = [sid for sid in self.candidates
                        if sid not in moved and sid in resident]
            rebuilds = [sid for sid in rebuilds if sid in resident]
            names = []
            if isinstance(ev.peak_point, tuple):
                names.append(self.plan.nodes[ev.peak_point[1]].layer.name)
            if fast:
                names.append(max(fast, key=lambda n: self.model.conv_cost(n).max_workspace(
                    ev.conv_algo.get(n, "fastest"))))
            names = [n for n in dict.fromkeys(names) if n in fast]
        moves = [("offload", sid) for sid in offloads] + \
            [("recompute", sid) for sid in rebuilds] + [("algo", n) for n in names]
        est = {mv: self._estimate(ev, mv) for mv in moves}
        return sorted(moves, key=lambda mv: (est[mv][0] / max(est[mv][1], 1), -est[mv][1]))

    def _may_recompute(self, ev: Evaluation, sid: int) -> bool:
        """May map `sid` (a recompute candidate) be recomputed on top of `ev`: not already,
        and one level deep (see _chains)."""
        return sid not in ev.recompute and not self._chains(sid, ev.recompute)

    def _chains(self, sid: int, recompute) -> bool:
        """Would recomputing `sid` beside `recompute` rebuild one of them from another? The
        greedy search adds recomputations one map at a time, one level deep: a chain is
        rebuilt at once (memory/schedule.py), so a map added to one lowers what the step
        needs at the turn from forward to backward but raises it where the chain comes back.
        Chains are planned whole, as segments (`segments`)."""
        return not self._rebuilt_from[sid].isdisjoint(recompute) or \
            not self._rebuilds[sid].isdisjoint(recompute)

    def _apply(self, ev: Evaluation, moves) -> Evaluation:
        offload, recompute, algos = set(ev.offload), set(ev.recompute), dict(ev.conv_algo)
        for what, x in moves:
            if what == "offload":
                if x not in recompute:
                    offload.add(x)
            elif what == "recompute":
                if self._chains(x, recompute):
                    continue     # two moves of one bundle would chain
                offload.discard(x)
                recompute.add(x)
            else:
                algos[x] = self._leaner(ev, x)
        return self.model.evaluate(frozenset(offload), algos, frozenset(recompute))

    def _out_of_evaluations(self) -> bool:
        return len(self.model.cache) >= self.max_evaluations

    def _bulk_round(self, ev: Evaluation) -> Evaluation | None:
        """The most promising moves at the peak (by estimated time per byte), as many as the
        estimates say cover the deficit, applied together in one evaluation; None when that
        does not lower what the step needs."""
        deficit = ev.required_bytes - (self.usable or 0)
        bundle, saved = [], 0
        for move in self._moves(ev, everywhere=False):
            bundle.append(move)
            saved += self._estimate(ev, move)[1]
            if saved >= deficit:
                break
        if len(bundle) < 2:
            return None
        nxt = self._apply(ev, bundle)
        return nxt if nxt.required_bytes < ev.required_bytes else None

    def greedy(self, bound: float | None = None, prune: bool = True,
               start: Evaluation | None = None) -> Evaluation | None:
        """Greedy by step time per byte saved at the peak, then pruning unless prune=False
        (see module doc).

        Each round evaluates exactly the `shortlist` most promising moves at the point of the
        peak (by `_estimates`), takes the one with the least added step time per byte it
        saves there, and, while the step is still far over the budget, the next best ones
        with it. None if the budget cannot be met or `max_evaluations` runs out first, or
        once the step, still over the budget, is slower than `bound` (seconds): each move
        only adds time. start: the evaluation to move from (default: nothing moved, every
        convolution on its fastest plan).
        """
        m = self.model
        ev = start if start is not None else m.evaluate(frozenset(), m.algos("fastest"))
        while not ev.fits:
            if self._out_of_evaluations() or (bound is not None and ev.step_time_s > bound):
                return None
            bulk = self._bulk_round(ev) if self.bulk else None
            if bulk is not None:
                ev = bulk
                continue
            scored = []
            for everywhere, limit in ((False, self.shortlist), (True, self.shortlist),
                                      (True, None)):
                for move in self._moves(ev, everywhere)[:limit]:
                    nxt = self._apply(ev, [move])
                    dt = nxt.step_time_s - ev.step_time_s
                    gain = ev.required_bytes - nxt.required_bytes
                    # When two calls tie for the peak, a move helps one of them first.
                    local = max(ev.level_at(ev.peak_point) - nxt.level_at(ev.peak_point),
                                ev.fm_levels.get(ev.fm_peak_point, 0) -
                                nxt.fm_levels.get(ev.fm_peak_point, 0))
                    if gain > 0:
                        scored.append((0, dt / gain, -gain, move, nxt))
                    elif local > 0 and gain == 0:   # not one that raises another call's need
                        scored.append((1, dt / local, -local, move, nxt))
                if scored:
                    break
            if not scored:
                return None
            scored.sort(key=lambda t: t[:3])
            best = scored[0][4]
            deficit = ev.required_bytes - (self.usable or 0)
            bundle, saved = [scored[0][3]], -scored[0][2]
            for tier, _, neg_gain, move, _ in scored[1:]:
                if saved >= deficit or tier > 0 or scored[0][0] > 0:
                    break
                bundle.append(move)
                saved += -neg_gain
            if len(bundle) > 1:
                together = self._apply(ev, bundle)
                if together.required_bytes < best.required_bytes:
                    best = together
            ev = best
        return self.prune(ev) if prune else ev

    # ---- checkpointed segments (planner/segments.py) ------------------------------------------
    def runs(self) -> list[list[int]]:
        """The chains a segment is cut from (segments.runs)."""
        return segments.runs(self)

    def segment_decision(self, runs, segment_bytes: int, offload_checkpoints: bool):
        """(offload, recompute) of segments of at most `segment_bytes` (segments.decision)."""
        return segments.decision(self, runs, segment_bytes, offload_checkpoints)

    def segments(self, bound: float | None = None) -> Evaluation | None:
        """The fastest checkpointed segments that fit, or None (segments.search)."""
        return segments.search(self, bound)

    def segments_then_greedy(self, bound: float | None = None, prune: bool = True
                             ) -> Evaluation | None:
        """Greedy from the closest segments that do not fit, or None (segments.then_greedy)."""
        return segments.then_greedy(self, bound, prune)

    def prune(self, ev: Evaluation) -> Evaluation:
        """Undo what the budget does not need, while the step gets faster: each offload (the
        most exposed copies first), or its copies traded for a recomputation; each
        recomputation; each convolution's leaner setting."""
        m = self.model
        est = self._estimates()
        improved = True
        limit = len(m.cache) + BULK_PRUNE if self.bulk else self.max_evaluations

        def out_of_evaluations() -> bool:
            return len(m.cache) >= min(limit, self.max_evaluations)

        while improved and not out_of_evaluations():
            improved = False
            for sid in sorted(ev.offload, key=lambda s: -est[("offload", s)][0]):
                if out_of_evaluations():
                    break
                tries = [(ev.offload - {sid}, ev.recompute)]
                if sid in self.rebuildable:         # the copies for a recomputation instead
                    tries.append((ev.offload - {sid}, ev.recompute | {sid}))
                for offload, recompute in tries:
                    if recompute != ev.recompute and not self._may_recompute(ev, sid):
                        continue
                    # Only a decision that fits can replace ev: one shown not to fit by
                    # a bound is not walked further (StepModel.evaluate_if_fits).
                    nxt = m.evaluate_if_fits(offload, ev.conv_algo, recompute, near=ev)
                    if nxt is not None and nxt.step_time_s < ev.step_time_s:
                        ev, improved = nxt, True
                        break
            # the recomputation that costs the most time per byte it saves first
            for sid in sorted(ev.recompute,
                              key=lambda s: -est[("recompute", s)][0] / self._bytes[s]):
                if out_of_evaluations():
                    break
                nxt = m.evaluate_if_fits(ev.offload, ev.conv_algo, ev.recompute - {sid},
                                         near=ev)
                if nxt is not None and nxt.step_time_s < ev.step_time_s:
                    ev, improved = nxt, True
            for name in m.conv_names:
                faster = self.model.conv_cost(name).faster(ev.conv_algo.get(name, "fastest"))
                if faster is not None and not out_of_evaluations():
                    nxt = m.evaluate_if_fits(ev.offload, dict(ev.conv_algo, **{name: faster}),
                                             ev.recompute, near=ev)
                    if nxt is not None and nxt.step_time_s < ev.step_time_s:
                        ev, improved = nxt, True
        return ev

    def _lookahead_hint(self) -> str:
        """Prefetching a layer ahead brings a map back while the layer before still holds
        its own; at the largest layers that is what the budget lacks. Say so when fetching
        only on demand would fit."""
        if self.lookahead == 0:
            return ""
        on_demand = StepModel(self.net, self.spec.replace(prefetch_lookahead=0), self.profile,
                              self.options, usable=self.usable)
        least = on_demand.evaluate(frozenset(self.candidates), on_demand.algos("min_workspace"))
        if not least.fits:
            return ""
        return (f"with --prefetch-lookahead 0 (maps fetched back only when their layer "
                f"runs) it needs {fmt_bytes(least.required_bytes)}, which fits")

    def fastest_feasible(self) -> Evaluation:
        """The fastest decision evaluated that fits; among equally fast ones (a step bound by
        the host, say) the one that moves the fewest bytes and keeps the most fast plans."""
        feasible = [ev for ev in self.model.cache.values() if ev.fits]
        quickest = min(ev.step_time_s for ev in feasible)
        ties = [ev for ev in feasible if ev.step_time_s <= quickest * (1 + 1e-6) + 1e-12]
        return min(ties, key=lambda ev: (ev.offloaded_bytes, len(ev.recompute),
                                         sum(a != "fastest" for a in ev.conv_algo.values()),
                                         ev.required_bytes))

    # ---- everything --------------------------------------------------------------------------
    def least_step_s(self, recompute=frozenset()) -> float:
        """No decision recomputing `recompute` is faster: every call on its fastest setting,
        the writers of those maps run again, no copy exposed (all the step's passes)."""
        nodes = self.plan.nodes
        if self._least_step is None:
            self._least_step = least_step_s(self.profile, self.model.micro_batches,
                                            [node.name for node in nodes],
                                            self.model.forward_share,
                                            self.model.backward_share,
                                            self.model.accumulate_s,
                                            self.model.bias_elsewhere)
        moved = self.model.bias_elsewhere
        again = sum(self.profile.layer(nodes[j].name).least_time("forward",
                                                                 nodes[j].name not in moved)
                    for j in {j for sid in recompute for j in self.plan.writers(sid)})
        return self._least_step + self.model.micro_batches * again

    def describe_step(self) -> str:
        """'vgg16 at batch 256 in 4 micro-batches of 64, layers conv1_1..pool1 in 2 pieces'."""
        m = self.model
        what = f"{self.net.name} at batch {self.batch}"
        if m.micro_batches > 1:
            what = (f"{self.net.name} at batch {m.step_batch} in {m.micro_batches} "
                    f"micro-batches of {self.batch}")
        if m.chunks:
            what += f", layers {describe(m.chunks)}"
        return what

    def infeasible_error(self) -> InfeasibleBudgetError:
        """The error of a budget below this step's least (which it names)."""
        m = self.model
        return InfeasibleBudgetError(self.minimum_budget(), self.budget, self.describe_step(),
                                     m.param_grad_bytes + m.extra_bytes,
                                     self._lookahead_hint(), bool(m.conv_names))

    def run(self, prune: bool = True, bound: float | None = None) -> PlanResult:
        """Plan (see module doc). Raises InfeasibleBudgetError below the minimum. prune=False
        leaves every decision found unpruned (the greedy search's too): `finish` prunes the
        fastest, for a caller that weighs several planners and prunes only those that can
        still win (planner/split.py). bound: the searches give up on decisions slower than
        this many seconds (the caller has a plan that fast); NothingFaster when none that fits
        is left."""
        t0 = time.perf_counter()
        m = self.model
        minimum = self.minimum()
        what = self.describe_step()
        if not minimum.fits:
            raise self.infeasible_error()
        baselines = _Baselines(self)
        # Evaluated now, so that the search may pick one; for a very deep network the
        # baselines only if read. The floor always: a few evaluations (a bisection), and a
        # chunked step's floor can beat its bulk greedy (GoogLeNet in 64 passes of 4: 358 ms
        # against 382 on the H200's model).
        if not self.deep:
            for policy in ("none", "conv", "all"):
                for algo in ("fastest", "min_workspace"):
                    baselines[f"{policy}/{algo}"] = self.baseline(policy, algo)
        vdnn_order = self.floor()
        notes, searches = [], {}
        if self.budget is None:
            best = baselines["none/fastest"]
            notes.append("no memory budget: nothing is offloaded, every convolution runs its "
                         "fastest plan")
        else:
            greedy = self.greedy(bound, prune)
            # Segments recompute maps: never faster than a step that fits moving nothing.
            unmoved = greedy is not None and not greedy.offload and not greedy.recompute
            searches = {"greedy": greedy,
                        "segments": None if unmoved else self.segments(bound)}
            if not unmoved and searches["segments"] is None:
                # Only a faster answer is wanted: greedy's, if it found one, bounds this.
                faster = bound if greedy is None else min(bound or math.inf, greedy.step_time_s)
                searches["segments+greedy"] = self.segments_then_greedy(faster, prune)
            if bound is not None and not any(ev.fits and ev.step_time_s <= bound
                                             for ev in self.model.cache.values()):
                raise NothingFaster(f"no decision of {what} that fits is faster than "
                                    f"{bound * 1e3:.1f} ms")
            best = self.fastest_feasible()
        result = PlanResult(model=m, best=best, minimum=minimum,
                            minimum_budget=self.minimum_budget(), baselines=baselines,
                            budget=self.budget, usable=self.usable, evaluations=len(m.cache),
                            seconds=time.perf_counter() - t0, notes=notes, searches=searches,
                            planner=self, vdnn_order=vdnn_order)
        return self.finish(result) if prune else result

    def finish(self, result: PlanResult) -> PlanResult:
        """`result` (this planner's run(prune=False)) with its fastest decision pruned.

        greedy() prunes only its own answer; the floor's or the segments' may be faster, and
        pruning it can trade its offloads for recomputations on the plans it chose (a map
        rebuilt by a convolution on its memory-optimal plan, say)."""
        if self.budget is None:
            return result
        t0 = time.perf_counter()
        self.prune(self.fastest_feasible())
        return dataclasses.replace(result, best=self.fastest_feasible(),
                                   evaluations=len(self.model.cache),
                                   seconds=result.seconds + time.perf_counter() - t0)


class _Baselines(dict):
    """{'none'|'conv'|'all' + '/' + algo: Evaluation} of a Planner; one not evaluated yet is
    evaluated when first read."""

    def __init__(self, planner: Planner):
        super().__init__()
        self._planner = planner

    def __missing__(self, key: str) -> Evaluation:
        policy, algo = key.split("/")
        value = self[key] = self._planner.baseline(policy, algo)
        return value


# Prefetch lookaheads a plan may choose from: 0 fetches each map only when its layer needs it
# (least memory), more layers start copies earlier (more overlap, more memory held).
LOOKAHEADS = (0, 1, 2)


def plan_lookaheads(net, batch: int, profile: Profile, budget: int | None,
                    lookaheads=LOOKAHEADS, **options) -> tuple[PlanResult, int]:
    """Plan at each prefetch lookahead; returns the fastest feasible result and its lookahead.
    Raises the InfeasibleBudgetError with the smallest minimum when none fits."""
    best, errors = None, []
    for lookahead in lookaheads:
        try:
            result = Planner(net, batch, profile, budget=budget, prefetch_lookahead=lookahead,
                             **options).run()
        except InfeasibleBudgetError as e:
            errors.append(e)
            continue
        if best is None or result.best.step_time_s < best[0].best.step_time_s:
            best = (result, lookahead)
    if best is None:
        raise min(errors, key=lambda e: e.minimum)
    return best


def plan(net, batch: int, profile: Profile, budget: int | None = None, **options) -> PlanResult:
    """Plan `net` at `batch` under `budget` from `profile` (see Planner for the options)."""
    return Planner(net, batch, profile, budget=budget, **options).run()
