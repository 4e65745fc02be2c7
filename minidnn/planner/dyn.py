"""The planner's memory policies: `dyn` (vDNN_dyn: profile the network, then plan for the
budget) and FixedDecision (a decision made beforehand).

    decide(net, StepSpec(batch=256, policy="dyn", memory_budget="12GiB"))  # measures here
    decide(net, StepSpec(batch=256, policy=DynPolicy(gpu="k40"), memory_budget="12GiB"))
    decide(net, StepSpec(batch=256, policy=FixedDecision(decision)))
    (minidnn/decide.py, minidnn/spec.py; build_executor takes the same spec)

DynPolicy.decide(plan, budget) plans the StepSpec decide.py bound with planning.plan_step, the
road `minidnn plan` takes too: a Profile (given; or the analytic model of a named GPU; or
measured on the device, cached on disk: profile.py), the planner (search.py) for each
micro-batch count and layer chunks (split.py), and returns its decision: how many
micro-batches a step runs, which feature maps to offload or recompute, and which
convolution plan each convolution runs.
Without a budget nothing needs planning: no offload, the fastest plans. A budget below what
any decision needs raises InfeasibleBudgetError (a MemoryBudgetError) naming the minimum.

The planner's full answer (predicted peak and step time, the alternatives it weighed) stays
in `policy.result` for whoever wants to show it.

This module imports the planner only when a decision is asked for, so registering the
policy costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..errors import ConfigError
from ..memory.policy import MemoryDecision, Policy, register_policy

# A training run's input batches live outside the arena (a loader's host buffers, or the
# synthetic source's device batches made before it), so a run's plan counts none of them
# against the budget besides the step's own `data` buffer (minidnn train, minidnn plan).
RUN_INPUT_BATCHES = 0


@dataclass(frozen=True)
class DynOptions:
    """How dyn plans, besides the step's spec and the profile's source. momentum,
    input_batches, reserve: as the run will use them (see search.Planner). choose_lookahead
    (default): the plan also picks the prefetch lookahead (search.LOOKAHEADS) and the
    decision carries it, else it plans for the spec's. recompute: the planner may drop maps
    after forward and run their layers again in backward (default); False: offload only."""
    momentum: bool = True
    input_batches: int = 2
    reserve: float | None = None
    choose_lookahead: bool = True
    recompute: bool = True


_SOURCE_FIELDS = ("math", "cache_dir", "log", "host_link_gbps")


@register_policy
class DynPolicy(Policy):
    """vDNN_dyn with minidnn's planner (see the module docstring).

    profile: a Profile to plan from. gpu: plan from the analytic model of this GPU ('k40',
    'h200', ...) instead of measuring. device: where to measure (a Device or 'auto'/'gpu'/
    'cpu'; the executor's device when it sets one). options: DynOptions' fields (momentum,
    input_batches, reserve, choose_lookahead, recompute) and ProfileSource's (math,
    cache_dir, log, host_link_gbps: planning.py). The step's batch, forced micro-batch
    count and layer chunks, prefetch lookahead and static layout come from the StepSpec
    that decide.py binds (unbound: the plan's batch, one lookahead, a static layout, the
    counts and chunks the planner chooses).
    """
    name = "dyn"
    plans = True
    description = ("vDNN_dyn: profile the network, then choose per layer what to offload or "
                   "recompute and which convolution plan to run, to fit the budget at the best "
                   "step time")

    def __init__(self, profile=None, gpu=None, device=None, **options):
        from .planning import ProfileSource
        source = {k: options.pop(k) for k in _SOURCE_FIELDS if k in options}
        unknown = sorted(set(options) - {f.name for f in fields(DynOptions)})
        if unknown:
            raise ConfigError(f"the dyn policy has no option {', '.join(unknown)}")
        self.source = ProfileSource(profile=profile, gpu=gpu, device=device, **source)
        self.options = DynOptions(**options)
        self.spec = None
        self.result = None
        self.split = None
        self.remeasured = None   # the chosen count planned again from its own measured profile

    def bind(self, spec, device=None) -> None:
        """What the executor the decision is for will run with (minidnn/decide.py calls this
        before `decide`): its StepSpec and the device to profile (a device given at
        construction stays). A network that normalizes with the whole batch keeps one pass
        unless the spec allows a split (planning.step_counts)."""
        self.spec = spec
        if device is not None and self.source.device is None:
            self.source.device = device

    def _spec_for(self, plan, budget):
        """The spec to plan: the bound one, or one of the plan's batch; with the budget
        asked for."""
        from ..spec import StepSpec
        spec = self.spec or StepSpec(batch=plan.batch)
        return spec.replace(memory_budget=budget)

    def decide(self, plan, budget=None):
        from .search import LOOKAHEADS
        from .step_model import DEFAULT_RESERVE
        from .planning import plan_step, relu_bits_note, statistics_note
        spec = self._spec_for(plan, budget)
        convs = {n.name: "fastest" for n in plan.nodes if n.layer.kind == "conv"}
        if budget is None:
            self.result = self.split = None
            return MemoryDecision(conv_algo=convs, micro_batches=spec.micro_batches or 1,
                                  chunks=spec.chunks or (), relu_bits=plan.relu_bits)
        o = self.options
        # plan.maps: the feature maps' format (bf16 maps plan at half the bytes).
        options = dict(momentum=o.momentum, input_batches=o.input_batches,
                       static_layout=spec.static_layout if self.spec else True,
                       recompute=o.recompute,
                       reserve=DEFAULT_RESERVE if o.reserve is None else o.reserve,
                       relu_bits=plan.relu_bits)
        lookaheads = LOOKAHEADS if o.choose_lookahead else (spec.prefetch_lookahead,)
        planned = plan_step(plan.net, spec, self.source, plan.maps, lookaheads, options,
                            weigh_relu_bits=True)
        self.split, self.remeasured = planned.split, planned.remeasured
        chosen = planned.chosen
        if chosen is None:
            raise planned.infeasible_error()
        self.result = chosen.result
        options["relu_bits"] = planned.relu_bits
        notes = (relu_bits_note(planned),
                 statistics_note(plan.net, spec, chosen.best.step_time_s, self.source,
                                 plan.maps, lookaheads, options))
        self.notes = tuple(n for n in notes if n)
        return replace(self.result.decision, micro_batches=chosen.micro_batches,
                       prefetch_lookahead=chosen.lookahead if o.choose_lookahead else None,
                       relu_bits=planned.relu_bits)

    def __repr__(self) -> str:
        source = f"gpu={self.source.gpu!r}" if self.source.gpu else \
            ("profile" if self.source.profile is not None else "measured")
        return f"DynPolicy({source})"


class FixedDecision(Policy):
    """A decision made beforehand (by the planner, or a vDNN policy with one conv plan), handed
    to an executor as it is: the planner's dry runs and the benchmarks run decisions this way."""
    name = "fixed"

    def __init__(self, decision: MemoryDecision):
        self.decision = decision

    def decide(self, plan, budget=None):
        return self.decision

    def __repr__(self) -> str:
        return f"FixedDecision({self.decision!r})"
