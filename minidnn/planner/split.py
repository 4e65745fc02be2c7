"""Splitting the batch: which micro-batch count a step runs with, chosen with everything else.

A step of batch B may run as k passes of B/k images (executor.py: gradients accumulated, one
optimizer update). Each pass needs the memory of batch B/k: feature maps, gradient maps and
most cuDNN workspaces shrink k-fold, while parameters, gradients and momentum stay. Its time
is k passes and one optimizer step:

    step(B, k) = k * pass(B/k) + optimizer        (StepModel(micro_batches=k) predicts it)

So the planner plans each pass at B/k for k in 1, 2, 4, 8, ... (offload, recompute,
convolution plans and lookahead as for an unsplit step) and keeps the fastest step that fits;
the least feasible budget is the least over k.

Layer chunks are weighed with the counts (planner/chunking.py): a count whose plan has to
move maps, or does not fit, is planned again with the chunks chunking.py names (a few runs of
the layers with the largest maps, in 2 or 4 pieces): the pass keeps its batch, and only the
chunk's layers run a piece at a time. Every option, a count with or without chunks, is one
SplitOption; the fastest that fits is chosen, and the least budget is the least over all.

Costs at B/k. The analytic model of a GPU computes them at B/k directly. A measured profile is
taken at one batch, so it is scaled by one rule: a layer call's device time is a fixed part,
FIXED_CALL_S (launches, the tail of a kernel that does not fill the GPU), plus a part
proportional to the batch; a workspace, and a plan setting's workspace limit, is proportional
to the batch; the host's time per call and the optimizer step do not change (a dropout's
forward draws only its pass's rows: layers/draws.py). Checked against the H200
profiles of VGG-16 (benchmarks/profiles): scaled from batch 256 to 128, the step's device time
comes out at 83.39 ms against 83.99 ms measured at 128 (-0.7%; every time proportional:
-1.7%), the fastest plans' workspaces 4.5% below those measured.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from ..chunks import as_chunks, chunk_network, describe
from ..errors import ConfigError
from ..layers.slices import whole_slices
from ..memory.plan import LivenessPlan
from ..memory.policy import offload_candidates
from .chunking import CHUNK_GAIN, CHUNK_PLANS, candidates, chunk_profile
from .collector import collector_paused
from .search import BULK_CANDIDATES, InfeasibleBudgetError, NothingFaster, Planner
from .costs import LayerCost, Profile, least_step_s, structure_hash

FIXED_CALL_S = 20e-6
# Micro-batch counts tried: powers of two (that divide the batch), up to this many.
MAX_MICRO_BATCHES = 64


def micro_batch_counts(batch: int, limit: int = MAX_MICRO_BATCHES) -> list[int]:
    """k in 1, 2, 4, ... (at most `limit`) that divide `batch`."""
    counts, k = [], 1
    while k <= min(batch, limit):
        if batch % k == 0:
            counts.append(k)
        k *= 2
    return counts


def _scaled_time(seconds: float, ratio: float) -> float:
    if seconds <= FIXED_CALL_S:
        return float(seconds)
    return FIXED_CALL_S + (seconds - FIXED_CALL_S) * ratio


def _scaled_setting(setting: str, ratio: float) -> str:
    from ..layers.conv import parse_plan_setting, plan_setting
    algo, limit = parse_plan_setting(setting)
    return setting if limit is None else plan_setting(algo, int(limit * ratio))


def _scaled_layer(cost: LayerCost, ratio: float) -> LayerCost:
    def times(table):
        return {_scaled_setting(s, ratio): _scaled_time(t, ratio) for s, t in table.items()}

    def bytes_(table):
        return {_scaled_setting(s, ratio): int(round(b * ratio)) for s, b in table.items()}

    return LayerCost(forward_s=times(cost.forward_s),
                     backward_s=times(cost.backward_s),
                     workspace_forward=bytes_(cost.workspace_forward),
                     workspace_backward=bytes_(cost.workspace_backward),
                     host_s=dict(cost.host_s),
                     bias_s=_scaled_time(cost.bias_s, ratio))


def scale_profile(profile: Profile, net, batch: int, relu_bits=frozenset()) -> Profile:
    """`profile` (of `net` at its own batch, its ReLUs `relu_bits` keeping bit masks) scaled
    to `batch` by the rule of the module docstring; the profile itself when the batch is its
    own."""
    batch = int(batch)
    if batch == profile.batch:
        return profile
    profile.check_matches(net, profile.batch, relu_bits)
    ratio = batch / profile.batch
    layers = {name: _scaled_layer(cost, ratio) for name, cost in profile.layers.items()}
    fields = dict(profile.key_fields, structure=structure_hash(net, batch, relu_bits),
                  scaled_from_batch=profile.batch)
    note = (f"costs scaled from the profile at batch {profile.batch} to batch {batch} "
            f"(device time {FIXED_CALL_S * 1e6:.0f} us per call + a part proportional to the "
            f"batch; workspaces proportional)")
    return dataclasses.replace(profile, batch=batch, layers=layers, key_fields=fields,
                               source=f"{profile.source}, scaled", notes=profile.notes + [note])


# ---- the joint search ------------------------------------------------------------------------
# The options whose plan, before its final pruning, is within this fraction of the fastest
# one's are pruned (Planner.finish), and a search gives up on decisions slower than the best
# plan found by more than it (`_bound`): pruning has gained at most a few percent (VGG-416's
# chosen plan from its H200 profile: 0.3%). At 0.10 instead, the plans of scripts/
# bench_plan.py's five cases are the same, and VGG-416's from that profile takes 29 s, not 20.
PRUNE_WITHIN = 0.05


@dataclass
class SplitOption:
    """One micro-batch count the planner weighed, with layer chunks or without.

    batch: images per pass; planner: the Planner of the chosen lookahead (or the first tried,
    when nothing fits); result: its PlanResult (None: the budget is too small at this count,
    `error` says so, or it was not planned, `skipped` says why); minimum_budget: the least
    budget at this count over the lookaheads tried; pruned: whether the result's fastest
    decision was pruned (only counts within PRUNE_WITHIN of the fastest are). chunks: the
    layer chunks each pass runs (MemoryDecision.chunks; () for none). trains: whether the
    option can be chosen at a budget of its least: False for layer chunks that lower their
    count's least budget by less than CHUNK_GAIN (they are never planned), whose least
    budget is then no budget a step trains in.
    """
    micro_batches: int
    batch: int
    chunks: tuple = ()
    planner: object = None
    result: object = None
    lookahead: int | None = None
    minimum_budget: float = math.inf
    error: Exception | None = None
    skipped: str = ""
    pruned: bool = False
    trains: bool = True

    @property
    def best(self):
        return self.result.best if self.result is not None else None


@dataclass
class SplitPlan:
    """What plan_split found: options (one per count tried, in order), chosen (the fastest
    feasible one, or None), minimum_budget (the least budget a step trains in: the least
    over every option that can be chosen, SplitOption.trains)."""
    options: list
    chosen: SplitOption | None
    minimum_budget: int
    seconds: float = 0.0

    def infeasible_error(self):
        """The InfeasibleBudgetError (when nothing fits) of the option with the least budget
        a step trains in: the one minimum_budget names."""
        least = _least(self.options)
        if least is None or least.planner is None:
            return None
        if least.error is not None and least.error.minimum == least.minimum_budget:
            return least.error
        return least.planner.infeasible_error()


def _least(options: list) -> SplitOption | None:
    """The option that can be chosen (`trains`) with the least budget (the first of
    equals), or None."""
    able = [o for o in options if o.trains]
    return min(able, key=lambda o: o.minimum_budget) if able else None


def plan_split(net, batch: int, profile_at, budget: int, lookaheads, counts=None,
               chunks=None, batch_slice: int | None = None, **options) -> SplitPlan:
    """Plan `net` at `batch` under `budget` for each micro-batch count in `counts` (default
    micro_batch_counts(batch)) and each prefetch lookahead; profile_at(b) gives the Profile
    at pass batch b. chunks: None weighs layer chunks too (_chunk_options); a tuple
    (MemoryDecision.chunks, () for none) plans every count with exactly those. A count whose
    least step time (least_step_s) cannot beat the best found is not planned, only its least budget measured (at the least lookahead); so is every
    count after one whose plan moves nothing and runs every convolution's fastest plan (more
    passes only add time). A network that plans in bulk (search.BULK_CANDIDATES: a very
    deep one) plans each count at one lookahead (1, where offered) and tries the others only
    for the count chosen. batch_slice: under deterministic mode, the images of one slice
    (layers/slices.py): only the counts and chunk pieces whose parts are whole slices are
    weighed. options: as Planner takes them."""
    # Planning makes next to no cyclic garbage: its step models, profiles and searches are
    # freed by reference counting, so the cyclic collector only costs time here (collector.py).
    with collector_paused():
        return _plan_split(net, batch, profile_at, budget, lookaheads, counts, chunks,
                           dict(options, batch_slice=batch_slice), batch_slice)


def _plan_split(net, batch: int, profile_at, budget: int, lookaheads, counts, chunks,
                options: dict, batch_slice: int | None = None) -> SplitPlan:
    """plan_split's work (see there)."""
    t0 = time.perf_counter()
    profile_of, found = _counts_to_weigh(batch, profile_at, counts, chunks, batch_slice)
    lookaheads = list(lookaheads)
    tried = _first_lookaheads(net, found[0].batch, lookaheads, options)
    staged = tried != lookaheads
    order = _planning_order(found, net, profile_of, budget, tried[0], options)
    chosen, planned = None, []
    for option in found:
        if option not in order:
            option.skipped = "a plan with fewer passes moves nothing"
            _plan_option(option, net, _option_profile(option, net, profile_of)[0], budget,
                         [min(lookaheads)], options, run=False)
    for option in order:
        prof, names = _option_profile(option, net, profile_of)
        if chosen is not None and _least_compute(option, prof, names) >= chosen.best.step_time_s:
            option.skipped = "its compute alone is slower than the plan chosen"
            _plan_option(option, net, prof, budget, [min(lookaheads)], options, run=False)
            continue
        _plan_option(option, net, prof, budget, tried, options, bound=_bound(chosen))
        chosen = _faster(option, chosen)
        planned.append(option)
    if chunks is None:
        # Chunks are weighed where they may help: at the counts that do not fit (to fit), and
        # at the chosen count and the one with half its passes (to move fewer maps, or run
        # fewer passes). A very deep network (planned in bulk, `staged`) weighs them only to
        # fit: each of its plans costs seconds, and one run's share of its step is small.
        near = [o for o in planned if o.error is not None or chosen is not None and
                not staged and
                o.micro_batches in (chosen.micro_batches, chosen.micro_batches // 2)]
        more = _chunk_options(near, net, profile_of, budget, lookaheads, options, chosen,
                              batch_slice)
        found += more
        for option in more:
            chosen = _faster(option, chosen)
    if staged and chosen is not None:
        _plan_option(chosen, net, _option_profile(chosen, net, profile_of)[0], budget,
                     [la for la in lookaheads if la != chosen.lookahead], options,
                     bound=_bound(chosen))
    chosen = _prune_the_close(found, chosen)
    least = _least(found).minimum_budget
    return SplitPlan(options=found, chosen=chosen, minimum_budget=int(least),
                     seconds=time.perf_counter() - t0)


def _counts_to_weigh(batch: int, profile_at, counts, chunks,
                     batch_slice: int | None = None) -> tuple:
    """(profile_of: pass batch -> its Profile, made once, as staged lookaheads ask again;
    a SplitOption per micro-batch count to weigh, with the `chunks` forced, if any)."""
    profiles: dict = {}

    def profile_of(pass_batch: int):
        if pass_batch not in profiles:
            profiles[pass_batch] = profile_at(pass_batch)
        return profiles[pass_batch]

    forced = () if chunks is None else as_chunks(chunks)
    return profile_of, [SplitOption(micro_batches=k, batch=batch // k, chunks=forced)
                        for k in _counts(batch, counts, forced, batch_slice)]


def _counts(batch: int, counts, forced: tuple, batch_slice: int | None = None) -> list:
    """The micro-batch counts to weigh (default micro_batch_counts(batch)), those whose
    passes the `forced` chunks' pieces divide (into whole slices of `batch_slice`, given)."""
    counts = list(counts) if counts is not None else micro_batch_counts(batch)
    if batch_slice is not None:
        counts = [k for k in counts if all(whole_slices(batch // k // p, batch_slice)
                                           for p in [1] + [c[2] for c in forced])]
        if not counts:
            raise ConfigError(f"--deterministic: no micro-batch count weighed splits the batch "
                              f"{batch} into whole slices of {batch_slice} images")
    if forced:
        counts = [k for k in counts if all((batch // k) % p == 0 for _, _, p in forced)]
        if not counts:
            raise ConfigError(f"layer chunks {describe(forced)}: no micro-batch count weighed "
                              f"leaves passes of the batch {batch} that the pieces divide")
    return counts


def _planning_order(found: list, net, profile_of, budget: int, lookahead: int,
                    options: dict) -> list:
    """The options (fewest passes first) in the order to plan them. The fewest passes whose
    step fits moving nothing are found first, one evaluation per count (each option keeps
    the Planner made for it): no count after them is faster (more passes only add time), and
    their step bounds the searches of the counts before them, planned from the most passes
    down. Where no count fits moving nothing, every count, fewest passes first."""
    for n, option in enumerate(found):
        prof, _ = _option_profile(option, net, profile_of)
        option.planner = Planner(net, option.batch, prof, budget=budget,
                                 prefetch_lookahead=lookahead,
                                 micro_batches=option.micro_batches, chunks=option.chunks,
                                 **options)
        model = option.planner.model
        if model.evaluate(frozenset(), model.algos("fastest")).fits:
            return [option] + found[n - 1::-1] if n else [option]
    return list(found)


def _prune_the_close(found: list, chosen: SplitOption | None) -> SplitOption | None:
    """Prune the plans within PRUNE_WITHIN of `chosen` (Planner.finish; the searches leave
    their plans unpruned, run(prune=False): pruning a very deep network's segments tries
    BULK_PRUNE decisions, each a walk of the step, and gains under 1%, so only the plans that
    can still win are pruned); returns the fastest option after."""
    if chosen is None:
        return None
    for option in found:
        if option.result is not None and \
                option.best.step_time_s <= chosen.best.step_time_s * (1 + PRUNE_WITHIN):
            option.result = option.planner.finish(option.result)
            option.pruned = True
    return min((o for o in found if o.result is not None), key=lambda o: o.best.step_time_s)


def _option_profile(option: SplitOption, net, profile_of) -> tuple:
    """(the Profile `option` plans from, the names of its step's layers): the profile at its
    pass batch, or, with layer chunks, the chunked step's (planner/chunking.py)."""
    prof = profile_of(option.batch)
    if not option.chunks:
        return prof, None
    prof = chunk_profile(prof, net, option.chunks,
                         lambda pieces: profile_of(option.batch // pieces))
    return prof, [node.name for node in chunk_network(net, option.chunks).nodes]


def _least_compute(option: SplitOption, prof, names) -> float:
    """least_step_s of `option` planned from `prof` (its step's layers `names`), with the
    fused layers' shares (the step model of its planner says which)."""
    model = option.planner.model
    return least_step_s(prof, option.micro_batches, names, model.forward_share,
                        model.backward_share, model.accumulate_s, model.bias_elsewhere)


def _bound(chosen: SplitOption | None) -> float | None:
    """The step time beyond which a search may give up (search.Planner.run): a plan found
    slower than `chosen` by more than pruning has gained (PRUNE_WITHIN) cannot win."""
    return None if chosen is None else chosen.best.step_time_s * (1 + PRUNE_WITHIN)


def _faster(option: SplitOption, chosen: SplitOption | None) -> SplitOption | None:
    """`option` if it fits and is faster than `chosen` (or nothing was chosen), else
    `chosen`."""
    if option.result is None:
        return chosen
    if chosen is None or option.best.step_time_s < chosen.best.step_time_s:
        return option
    return chosen


def _moves_nothing(ev) -> bool:
    """Does decision `ev` keep every map and run every convolution's fastest plan?"""
    return not ev.offload and not ev.recompute and \
        all(a == "fastest" for a in ev.conv_algo.values())


def _chunk_options(planned: list, net, profile_of, budget: int, lookaheads, options: dict,
                   chosen, batch_slice: int | None = None) -> list:
    """The options with layer chunks (planner/chunking.py) of the counts `planned` whose
    plan must move maps or does not fit: one per chunk that planner/chunking.py weighs (of
    the chains with the largest maps). Each one's least budget is measured; the CHUNK_PLANS
    whose compute alone (least_step_s) is least are planned, at the lookahead their count
    chose (the least, where nothing fit), among those that fit the budget, lower their
    count's least budget by CHUNK_GAIN at least (pieces cost time: a chunk is for a call
    whose working set sets the peak) and whose compute can beat `chosen`. batch_slice: only
    chunks whose pieces are whole slices of it (deterministic mode)."""
    out, ranked = [], []
    for option in planned:
        if option.result is not None and _moves_nothing(option.best):
            continue
        lookahead = option.lookahead if option.lookahead is not None else min(lookaheads)
        for more, prof, names in _measured_chunks(option, net, profile_of, budget, lookahead,
                                                  options, batch_slice):
            compute = _least_compute(more, prof, names)
            out.append(more)
            if more.minimum_budget > budget:
                more.skipped = "does not fit"
            elif not more.trains:
                more.skipped = f"lowers the least budget by less than {CHUNK_GAIN:.0%}"
            elif chosen is not None and compute >= chosen.best.step_time_s:
                more.skipped = "its compute alone is slower than the plan chosen"
            else:
                ranked.append((compute, len(out), more, prof, lookahead))
    for n, (_, _, more, prof, lookahead) in enumerate(sorted(ranked, key=lambda r: r[:2])):
        if n >= CHUNK_PLANS:
            more.skipped = f"not among the {CHUNK_PLANS} chunked options of least compute"
            continue
        _plan_option(more, net, prof, budget, [lookahead], options, bound=_bound(chosen))
        chosen = _faster(more, chosen)
    return out


def _measured_chunks(option: SplitOption, net, profile_of, budget: int, lookahead: int,
                     options: dict, batch_slice: int | None = None):
    """(SplitOption, its Profile, its layers' names) of each layer chunk chunking.py weighs
    for `option`'s count, its least budget measured at `lookahead`. `trains` says whether
    it lowers the count's least budget by CHUNK_GAIN at least: too small a gain is never
    planned, whatever the budget, so no step trains in it. batch_slice: only chunks whose
    pieces are whole slices of it (deterministic mode)."""
    for chunks in candidates(net, option.batch):
        if batch_slice is not None and not whole_slices(option.batch // chunks[0][2],
                                                        batch_slice):
            continue
        more = SplitOption(micro_batches=option.micro_batches, batch=option.batch,
                           chunks=chunks)
        prof, names = _option_profile(more, net, profile_of)
        _plan_option(more, net, prof, budget, [lookahead], options, run=False)
        more.trains = more.minimum_budget <= option.minimum_budget * (1 - CHUNK_GAIN)
        yield more, prof, names


def least_budget(net, batch: int, profile_at, budget: int, lookaheads, counts=None,
                 chunks=None, batch_slice: int | None = None, **options) -> int:
    """The least budget a step trains in, whatever budget is asked: the one plan_split names
    when nothing fits (arguments as there). A plan that fits weighs layer chunks only where
    they may help, and at the lookahead its count chose; this measures, as a budget below
    the least does, every count at each lookahead plan_split tries and every chunk it
    weighs at the least lookahead, and plans none of them."""
    options = dict(options, batch_slice=batch_slice)   # the step model counts its sums
    with collector_paused():
        profile_of, found = _counts_to_weigh(batch, profile_at, counts, chunks, batch_slice)
        tried = _first_lookaheads(net, found[0].batch, lookaheads, options)
        for option in found:
            _plan_option(option, net, _option_profile(option, net, profile_of)[0], budget,
                         tried, options, run=False)
        if chunks is None:
            found += [more for option in list(found) for more, _, _ in
                      _measured_chunks(option, net, profile_of, budget, min(lookaheads),
                                       options, batch_slice)]
        return int(_least(found).minimum_budget)


def _first_lookaheads(net, pass_batch: int, lookaheads, options: dict) -> list:
    """The lookaheads every count is planned at: all of them, or for a network planned in
    bulk (search.BULK_CANDIDATES: a very deep one) only 1 (or the first), the others only
    for the count chosen."""
    lookaheads = list(lookaheads)
    staged = len(lookaheads) > 1 and len(offload_candidates(LivenessPlan(
        net, pass_batch, options.get("relu_bits", frozenset())))) > BULK_CANDIDATES
    return [1 if 1 in lookaheads else lookaheads[0]] if staged else lookaheads


def _plan_option(option: SplitOption, net, prof, budget: int, lookaheads, options: dict,
                 run: bool = True, bound: float | None = None) -> None:
    """Plan `option` at each of `lookaheads` (run=False: only its least budget), keeping the
    fastest result (or the InfeasibleBudgetError with the least minimum); bound: as
    Planner.run takes it (when no plan beats it, `skipped` says so)."""
    for lookahead in lookaheads:
        planner = option.planner     # the one made to find the unmoved count, if unused yet
        if planner is None or planner.lookahead != lookahead or option.result is not None:
            planner = Planner(net, option.batch, prof, budget=budget,
                              prefetch_lookahead=lookahead, micro_batches=option.micro_batches,
                              shares_with=option.planner, chunks=option.chunks, **options)
        option.planner = option.planner or planner
        option.minimum_budget = min(option.minimum_budget, planner.minimum_budget())
        if not run:
            continue
        try:
            result = planner.run(prune=False, bound=bound)
        except NothingFaster:
            if option.result is None:
                option.skipped = "no plan that fits is faster than the one chosen"
            continue
        except InfeasibleBudgetError as e:
            if option.result is None and (option.error is None
                                          or e.minimum < option.error.minimum):
                option.error = e
            continue
        if option.result is None or result.best.step_time_s < option.best.step_time_s:
            option.planner, option.result, option.lookahead = planner, result, lookahead
            option.error = None
