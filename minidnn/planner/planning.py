"""The one planning road: where a plan's costs come from, and the plan of a step's spec.

`minidnn plan` (planner/command.py) and `minidnn train --policy dyn` (planner/dyn.py) both
call `plan_step`, so that what the command prints is what a run trains with: the same
profile (a ProfileSource), the same micro-batch counts and layer chunks weighed
(planner/split.py), the same re-plan of the option chosen from profiles measured at its own
batches, and the same least budget.

    source = ProfileSource(gpu="h200")                 # or profile=..., or device="gpu"
    planned = plan_step(net, spec, source, maps, LOOKAHEADS, options)
    planned.chosen          # the SplitOption the step runs (None: nothing fits)
    planned.split           # every option weighed, and the least budget

A vDNN policy (none, all, conv) plans nothing: it has one decision, and what that decision
needs is its least budget. `plan_policy` predicts it from the same step model, so that
`minidnn plan --policy all` names the figure `minidnn train --policy all` is refused with
before step one (decide.weighed):

    static = plan_policy(net, spec, source, maps, decision.offload, decision.conv_algo,
                         options)
    static.least_budget     # bytes; static.check(budget, "all") raises PolicyBudgetError
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import partial

from ..backend import Device, select_device
from ..errors import MinidnnError, fmt_bytes
from ..kernels.mapformat import MapFormat
from .costs import Profile
from .search import InfeasibleBudgetError, Planner, budget_to_give
from .split import SplitOption, SplitPlan, least_budget, plan_split
from .step_model import DEFAULT_RESERVE


def _to_stderr(message: str) -> None:
    """Say why the first run of a network takes longer (the profiling pass)."""
    print(f"minidnn: {message}", file=sys.stderr)


@dataclass
class ProfileSource:
    """Where a plan's costs come from, in this order: `profile` (a Profile, measured
    beforehand), else the analytic model of the GPU named `gpu` (math: its math mode,
    default 'tf32'), else measured on `device` (a Device or 'auto'/'gpu'/'cpu') and cached
    on disk in `cache_dir` (refresh: measure again even when a cached profile matches; log:
    where a one-line notice of a profiling pass goes, default standard error).
    host_link_gbps: pinned copies limited to this many GB/s each way
    (Profile.with_host_link). memory_only: only the step's memory is read, so a device
    whose kernels take no workspace (the CPU) is not measured (profile.untimed_profile)."""
    profile: object = None
    gpu: str | None = None
    device: object = None
    math: str | None = None
    cache_dir: object = None
    log: object = None
    refresh: bool = False
    host_link_gbps: float | None = None
    memory_only: bool = False
    # Profiles made so far, by (network, batch, bit-mask ReLUs, maps): each pass batch and
    # the least budget ask for the step's profile again (and `refresh` measures only once).
    _made: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def measures(self) -> bool:
        """Are the profiles measured on a device (neither given nor analytic)?"""
        return self.profile is None and self.gpu is None

    def at(self, net, batch: int, relu_bits=frozenset(), maps=None):
        """The Profile of `net` at `batch` (its ReLUs `relu_bits` keeping bit masks, its maps
        stored as `maps`, a MapFormat: a measured profile is measured in it)."""
        if self.profile is not None:
            self.profile.check_matches(net, batch, relu_bits)
            return self.profile
        key = (net, int(batch), frozenset(relu_bits), maps)
        if key not in self._made:
            self._made[key] = self._make(net, batch, relu_bits, maps)
        return self._made[key]

    def made(self) -> list:
        """The profiles measured so far, as JSON values (a data-parallel run's rank 0 hands
        them to the other ranks, so that every rank plans from the same costs)."""
        return [dict(batch=batch, relu_bits=sorted(bits),
                     maps=None if maps is None else [maps.layout, maps.precision],
                     profile=profile.to_json())
                for (_, batch, bits, maps), profile in self._made.items()]

    def adopt(self, net, made: list) -> None:
        """Plan `net` from the profiles `made` (another source's `made()`) where they
        apply, instead of measuring them here."""
        for entry in made:
            maps = None if entry["maps"] is None else MapFormat(*entry["maps"])
            key = (net, int(entry["batch"]), frozenset(entry["relu_bits"]), maps)
            self._made[key] = Profile.from_json(entry["profile"])

    def _make(self, net, batch: int, relu_bits, maps):
        if self.gpu is not None:
            from .gpus import analytic_profile
            return analytic_profile(net, batch, self.gpu, self.math or "tf32", relu_bits)
        from .profile import get_profile, untimed_profile
        device = self.device if isinstance(self.device, Device) else \
            select_device(self.device or "auto")
        if self.memory_only and not device.is_gpu:
            return untimed_profile(net, batch, device, relu_bits)
        return get_profile(net, batch, device, refresh=self.refresh,
                           directory=self.cache_dir, log=self.log or _to_stderr,
                           relu_bits=relu_bits, maps=maps)

    def measured_at(self, net, batch: int, relu_bits=frozenset(), maps=None):
        """The profile at `batch` itself (measured there, or the analytic model's), with
        the host link's limit."""
        return self.at(net, batch, relu_bits, maps).with_host_link(self.host_link_gbps)

    def pass_profile(self, net, batch: int, pass_batch: int, relu_bits=frozenset(),
                     maps=None):
        """The Profile of one pass of `pass_batch` images of a step of `batch`: the analytic
        model's at that batch, else the step's profile scaled (split.py)."""
        if self.gpu is not None and self.profile is None:
            profile = self.at(net, pass_batch, relu_bits, maps)
        else:
            from .split import scale_profile
            profile = scale_profile(self.at(net, batch, relu_bits, maps), net, pass_batch,
                                    relu_bits)
        return profile.with_host_link(self.host_link_gbps)


@dataclass
class StepPlan:
    """What plan_step found. split: every option weighed (from the step's profile, scaled
    to each pass batch) and the least budget; chosen: the option the step runs (None:
    nothing fits); first: the option chosen before it was planned again (the same one
    unless `remeasured`); remeasured: chosen was planned again from profiles measured at
    its own batches."""
    split: SplitPlan
    chosen: SplitOption | None
    first: SplitOption | None
    remeasured: SplitPlan | None = None
    measure_least: object = field(default=None, repr=False)
    # The ReLUs whose bit masks the chosen plan keeps, and the plan of the other choice where
    # both were weighed (weigh_relu_bits).
    relu_bits: frozenset = frozenset()
    other_bits: "StepPlan | None" = field(default=None, repr=False)
    _least: int | None = field(default=None, init=False, repr=False)

    def least_budget(self) -> int:
        """The least budget the step trains in, whatever the budget planned for: what a run
        refused a smaller budget names (split.least_budget, measured when first asked: it
        weighs every count and chunk once more; where nothing fit, the split names it)."""
        if self.chosen is None or self.measure_least is None:
            return self.split.minimum_budget
        if self._least is None:
            self._least = self.measure_least()
        return self._least

    def infeasible_error(self):
        """The InfeasibleBudgetError naming the least budget (when nothing fits)."""
        return self.split.infeasible_error()


def step_counts(net, spec) -> list | None:
    """The micro-batch counts a plan of `spec` weighs (None: every count split.py tries):
    the forced one, or one pass for a network with whole-batch statistics."""
    if spec.micro_batches is not None:
        return [spec.micro_batches]
    return [1] if spec.whole_batch(net) else None


#: A plan that keeps ReLU bit masks gives them up only for a step predicted this much faster
#: without them: where the two are close, the masks' smaller maps stay (VGG-16 TF32 in 4 GiB
#: on the H200: 125.2 ms predicted with the masks, 122.3 without, which lets the convolutions
#: add their bias and apply their ReLU in cuDNN's epilogue; measured 117.0 and 114.5 ms).
RELU_BITS_GAIN = 0.01


def plan_step(net, spec, source: ProfileSource, maps, lookaheads, options: dict,
              remeasure: bool = True, weigh_relu_bits: bool = False) -> StepPlan:
    """Plan the step `spec` names (its batch, budget, micro-batches and layer chunks: None
    weighs them) of `net`, its feature maps stored as `maps` (a MapFormat), at each prefetch
    lookahead of `lookaheads`, from the profiles of `source`. options: as search.Planner
    takes them (momentum, input_batches, reserve, static_layout, recompute, relu_bits).

    An option with several passes or layer chunks, planned from the step's measured profile
    scaled to its batches, is planned again from profiles measured at its own batches,
    which is what its steps will run, and so are the split options predicted close to the
    chosen one (_worth_measuring); the fastest of those plans and the one-pass option runs,
    where one fits (remeasure False: the scaled profiles' plan, for a step that will not
    run).

    weigh_relu_bits (dyn): where options' relu_bits name ReLUs, the step is planned without
    their bit masks too, from profiles of its own (a given profile is of one choice: not
    weighed), and the plan without them runs when it fits and is predicted RELU_BITS_GAIN
    faster. The least budget stays the masks' (they only free memory).

    Returns the StepPlan (its relu_bits: the ReLUs the chosen plan keeps bit masks for)."""
    planned = _plan_step(net, spec, source, maps, lookaheads, options, remeasure)
    if not (weigh_relu_bits and planned.relu_bits and source.profile is None and
            planned.chosen):
        return planned
    without = _plan_step(net, spec, source, maps, lookaheads,
                         dict(options, relu_bits=frozenset()), remeasure)
    if without.chosen is None or without.chosen.best.step_time_s * (1 + RELU_BITS_GAIN) > \
            planned.chosen.best.step_time_s:
        return replace(planned, other_bits=without)
    return replace(without, measure_least=planned.measure_least, other_bits=planned)


def _plan_step(net, spec, source: ProfileSource, maps, lookaheads, options: dict,
               remeasure: bool) -> StepPlan:
    """plan_step with the ReLU bit masks of `options` as they are."""
    batch, budget = spec.batch, int(spec.memory_budget)
    relu_bits = frozenset(options.get("relu_bits", frozenset()))
    counts = step_counts(net, spec)
    # What every split below is planned with, besides its profiles, counts and chunks (under
    # deterministic mode every pass and chunk piece is whole slices: layers/slices.py).
    common = dict(batch_slice=spec.batch_slice, maps=maps, fuse=spec.fuse, **options)
    scaled = partial(source.pass_profile, net, batch, relu_bits=relu_bits, maps=maps)
    split = plan_split(net, batch, scaled, budget, lookaheads, counts=counts,
                       chunks=spec.chunks, **common)
    least = partial(least_budget, net, batch, scaled, budget, lookaheads, counts=counts,
                    chunks=spec.chunks, **common)
    chosen = split.chosen
    unchanged = StepPlan(split=split, chosen=chosen, first=chosen, measure_least=least,
                         relu_bits=relu_bits)
    if chosen is None or not source.measures or not remeasure:
        return unchanged
    # The one-pass option is planned from the step's own profile; it stands as it is.
    best, best_plan = (None, None) if _split(chosen) else (chosen, None)
    for option in _worth_measuring(split, chosen):
        measured = plan_split(net, batch, lambda b: source.measured_at(net, b, relu_bits, maps),
                              budget, lookaheads, counts=[option.micro_batches],
                              chunks=option.chunks, **common)
        if measured.chosen is not None and (
                best is None or measured.chosen.best.step_time_s < best.best.step_time_s):
            best, best_plan = measured.chosen, measured
    if best_plan is None:
        return unchanged
    return StepPlan(split=split, chosen=best, first=chosen, remeasured=best_plan,
                    measure_least=least, relu_bits=relu_bits)


def relu_bits_note(planned: StepPlan) -> str | None:
    """A line saying that the chosen plan leaves off the ReLU bit masks asked for, and why
    (None when it keeps them, or nothing else was weighed)."""
    other = planned.other_bits
    if other is None or planned.relu_bits or planned.chosen is None:
        return None
    return (f"ReLU bit masks left off ({len(other.relu_bits)} ReLUs could keep them): the plan "
            f"without them predicts {planned.chosen.best.step_time_s * 1e3:.1f} ms a step, "
            f"with them {other.chosen.best.step_time_s * 1e3:.1f} ms (a ReLU that keeps its "
            f"output can be applied in its convolution's epilogue); the options weighed are "
            f"those without them, the least budget is the one with them")


#: Options whose step, from the scaled profile, is within this fraction of the chosen one's
#: are planned again from profiles measured at their own batches too (at most MAX_REMEASURED
#: of them besides the chosen), and the fastest measured plan runs: a profile scaled from the
#: step's batch prices a pass of fewer images less well than its own (ResNet-50 bf16 in 6 GiB
#: on the H200: one pass, predicted 43.6 ms and measured 47.4, was chosen over 2 passes of
#: 128, which its own profiles predict at 42.0 ms and which measured 42.8).
REMEASURE_WITHIN = 0.2
MAX_REMEASURED = 2


def _split(option) -> bool:
    """Does the option run passes or pieces smaller than the step's batch?"""
    return option.micro_batches > 1 or bool(option.chunks)


def _worth_measuring(split: SplitPlan, chosen) -> list:
    """The options to plan again from measured profiles: the chosen one where it is split,
    then the split options that fit within REMEASURE_WITHIN of it, the closest first."""
    limit = chosen.best.step_time_s * (1 + REMEASURE_WITHIN)
    close = sorted((o for o in split.options if o is not chosen and _split(o) and o.trains
                    and o.best is not None and o.best.fits and o.best.step_time_s <= limit),
                   key=lambda o: o.best.step_time_s)
    return ([chosen] if _split(chosen) else []) + close[:MAX_REMEASURED]


#: How much faster a step split with --split-batch-statistics must be predicted for a run
#: whose BatchNorm layers keep it whole to say so (statistics_note).
SPLIT_STATISTICS_GAIN = 1.2


def statistics_note(net, spec, whole_s: float, source: ProfileSource, maps, lookaheads,
                    options: dict) -> str | None:
    """What --split-batch-statistics would give a step that its whole-batch BatchNorm
    layers keep to one pass (StepSpec.whole_batch) under a budget, predicted at `whole_s`
    seconds: a one-line note naming the split dyn would choose and its predicted step, when
    that is SPLIT_STATISTICS_GAIN times faster or more; None otherwise. The split is planned
    from the step's profile scaled to each pass (not measured again: it will not run)."""
    if not spec.whole_batch(net) or spec.memory_budget is None:
        return None
    split = plan_step(net, spec.replace(split_batch_statistics=True), source, maps,
                      lookaheads, options, remeasure=False).chosen
    if split is None or split.micro_batches == 1 or \
            split.best.step_time_s * SPLIT_STATISTICS_GAIN > whole_s:
        return None
    return (f"{len(net.batch_statistics_layers())} BatchNorm layers normalize with the whole "
            f"batch's statistics, which keeps this step to one pass: predicted "
            f"{whole_s * 1e3:.1f} ms; with --split-batch-statistics ({split.micro_batches} "
            f"micro-batches of {split.batch}, each normalized with its own statistics) the "
            f"plan predicts {split.best.step_time_s * 1e3:.1f} ms "
            f"({whole_s / split.best.step_time_s:.1f}x faster)")


# ---- a vDNN policy's one decision ------------------------------------------------------------
class PolicyBudgetError(InfeasibleBudgetError):
    """A budget below what a vDNN policy's one decision needs (its planned peak). `minimum`
    is that least budget (bytes), as for dyn's InfeasibleBudgetError."""

    def __init__(self, minimum: int, budget: int, what: str, policy: str):
        self.requested, self.in_use, self.budget, self.where = minimum, 0, budget, what
        self.minimum = int(minimum)
        suggest = budget_to_give(minimum)
        MinidnnError.__init__(
            self, f"memory budget {fmt_bytes(budget)} is too small for {what} under policy "
                  f"{policy}: the least it can train in is {suggest} (the peak the step "
                  f"model plans for the policy's one decision, which does not change with "
                  f"the budget); give --memory-budget {suggest} or more, or --policy dyn, "
                  f"which plans for the budget")


@dataclass
class PolicyPlan:
    """What plan_policy found. planner: the Planner of the step's pass (its model walked the
    decision); evaluation: the step model's prediction of the decision; least_budget: the
    bytes the decision needs (the larger of what must fit and the arena's peak: with a
    static layout the two agree) with the planner's reserve on top, below which a run is
    refused before step one."""
    planner: Planner
    evaluation: object
    least_budget: int

    def check(self, budget: int | None, policy: str) -> None:
        """Raise PolicyBudgetError when `budget` (bytes; None: no budget) is below the least
        budget."""
        if budget is not None and int(budget) < self.least_budget:
            raise PolicyBudgetError(self.least_budget, int(budget),
                                    self.planner.describe_step(), policy)


def plan_policy(net, spec, source: ProfileSource, maps, offload, conv_algo: dict,
                options: dict) -> PolicyPlan:
    """The step model's prediction for a vDNN policy's one decision: `offload` (storage ids
    of the liveness plan of one pass) and `conv_algo` ({conv name: plan setting}; missing:
    'fastest'), for the step `spec` names (its batch in spec.micro_batches passes, no layer
    chunks, its budget, prefetch lookahead and static layout), its feature maps stored as
    `maps`, from the profiles of `source`. options: as search.Planner takes them (momentum,
    input_batches, relu_bits, ...)."""
    k = spec.micro_batches or 1
    pass_batch = spec.batch // k
    relu_bits = options.get("relu_bits", frozenset())
    # Passes of fewer images are priced from a profile measured at their batch, as dyn's
    # chosen split is (plan_step): scaled from the step's, a fully connected layer's weights,
    # read whatever the batch, and the convolutions' workspaces came out wrong.
    profile = source.measured_at(net, pass_batch, relu_bits, maps) \
        if k > 1 and source.measures else \
        source.pass_profile(net, spec.batch, pass_batch, relu_bits=relu_bits, maps=maps)
    # The decision is not planned for the budget: it is walked with nothing held back, and
    # the reserve is added to what it needs (below).
    options = dict(options, static_layout=spec.static_layout, reserve=0.0)
    planner = Planner(net, pass_batch, profile, budget=spec.memory_budget,
                      prefetch_lookahead=spec.prefetch_lookahead, micro_batches=k,
                      batch_slice=spec.batch_slice, maps=maps, fuse=spec.fuse, **options)
    ev = planner.model.evaluate(frozenset(offload), dict(conv_algo))
    # The least budget keeps dyn's reserve free on top of what the decision needs, as every
    # budget dyn plans for does: at exactly its predicted need, VGG-16 b64 under `all`
    # (deterministic) ran short by 0.1 MiB of a 392 MiB gradient on the H200.
    need = max(ev.required_bytes, ev.peak_bytes)
    return PolicyPlan(planner=planner, evaluation=ev,
                      least_budget=int(math.ceil(need / (1 - DEFAULT_RESERVE))))
