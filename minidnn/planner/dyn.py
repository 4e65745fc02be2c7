"""The planner's memory policies: `dyn` (vDNN_dyn: profile the network, then plan for the
budget) and FixedDecision (a decision made beforehand).

    decide(net, 256, policy="dyn", memory_budget="12GiB")        # measures on this GPU
    decide(net, 256, policy=DynPolicy(gpu="k40"), memory_budget="12GiB")
    decide(net, 256, policy=FixedDecision(decision), memory_budget="12GiB")
    (minidnn/decide.py; build_executor takes the same arguments)

DynPolicy.decide(plan, budget) gets a Profile (given; or the analytic model of a named GPU; or
measured on the device, cached on disk: profile.py), runs the planner (search.py) for each
micro-batch count (split.py) and returns its decision: how many micro-batches a step runs,
which feature maps to offload or recompute, and which convolution plan each convolution runs.
Without a budget nothing needs planning: no offload, the fastest plans. A budget below what
any decision needs raises InfeasibleBudgetError (a MemoryBudgetError) naming the minimum.

The planner's full answer (predicted peak and step time, the alternatives it weighed) stays
in `policy.result` for whoever wants to show it.

This module imports the planner only when a decision is asked for, so registering the
policy costs nothing.
"""
from __future__ import annotations

from dataclasses import replace

import sys

from ..chunks import as_chunks
from ..memory.policy import MemoryDecision, Policy, register_policy


def _to_stderr(message: str) -> None:
    """Say why the first run of a network takes longer (the profiling pass)."""
    print(f"minidnn: {message}", file=sys.stderr)


# A training run's input batches live outside the arena (a loader's host buffers, or the
# synthetic source's device batches made before it), so a run's plan counts none of them
# against the budget besides the step's own `data` buffer (minidnn train, minidnn plan).
RUN_INPUT_BATCHES = 0


@register_policy
class DynPolicy(Policy):
    """vDNN_dyn with minidnn's planner (see the module docstring).

    profile: a Profile to plan from. gpu: plan from the analytic model of this GPU ('k40',
    'h200', ...) instead of measuring. device: where to measure (a Device or 'auto'/'gpu'/
    'cpu'; the executor's device when it sets one). math: math mode of the analytic model
    (default: the kernels' mode, 'tf32'). prefetch_lookahead, momentum, input_batches,
    reserve, static_layout: as the run will use them (see search.Planner); with
    choose_lookahead (default) the plan also picks the prefetch lookahead (search.LOOKAHEADS)
    and the decision carries it, else it plans for `prefetch_lookahead`. cache_dir: where
    measured profiles are kept (default profile.cache_dir()). log: where a one-line notice
    of a profiling pass goes (default: standard error). recompute: the planner may drop maps
    after forward and run their layers again in backward (default); False: offload only.
    micro_batches: the count a step runs (None: the planner chooses it, split.py). chunks:
    the layer chunks each pass runs (MemoryDecision.chunks; None: the planner weighs them,
    planner/chunking.py; (): none).
    batch: images per step (None: the batch of the plan `decide` is given); an executor
    binds both.
    host_link_gbps: plan with pinned copies limited to this many GB/s each way (the share of
    the host link each GPU gets when several offload at once: Profile.with_host_link).
    """
    name = "dyn"
    plans = True
    description = ("vDNN_dyn: profile the network, then choose per layer what to offload or "
                   "recompute and which convolution plan to run, to fit the budget at the best "
                   "step time")

    def __init__(self, profile=None, gpu=None, device=None, math: str | None = None,
                 prefetch_lookahead: int = 1, momentum: bool = True, input_batches: int = 2,
                 reserve: float | None = None, cache_dir=None, static_layout: bool = True,
                 log=None, choose_lookahead: bool = True, recompute: bool = True,
                 micro_batches: int | None = None, batch: int | None = None,
                 host_link_gbps: float | None = None, chunks=None):
        self.profile = profile
        self.gpu = gpu
        self.device = device
        self.math = math
        self.prefetch_lookahead = int(prefetch_lookahead)
        self.momentum = bool(momentum)
        self.input_batches = int(input_batches)
        self.reserve = reserve
        self.cache_dir = cache_dir
        self.static_layout = bool(static_layout)
        self.log = log
        self.choose_lookahead = bool(choose_lookahead)
        self.recompute = bool(recompute)
        self.micro_batches = micro_batches
        self.chunks = None if chunks is None else as_chunks(chunks)
        self.batch = batch
        self.batch_slice = None     # deterministic mode's slice (layers/slices.py); bind sets it
        self.host_link_gbps = host_link_gbps
        self.result = None
        self.split = None
        self.remeasured = None   # the chosen count planned again from its own measured profile

    def bind(self, device=None, prefetch_lookahead=None, static_layout=None, batch=None,
             micro_batches=None, chunks=None, batch_slice=None) -> None:
        """What the executor the decision is for will run with (minidnn/decide.py calls this
        before `decide`): the device to profile, its prefetch lookahead and layout, the
        step's batch, and the micro-batch count and layer chunks it forces (None: the plan
        chooses); batch_slice: under deterministic mode, the images of a slice, which every
        micro-batch and chunk piece of the plan must be whole slices of."""
        self.batch_slice = batch_slice
        if batch is not None:
            self.batch = int(batch)
        if micro_batches is not None:
            self.micro_batches = int(micro_batches)
        if chunks is not None:
            self.chunks = as_chunks(chunks)
        if device is not None and self.device is None:
            self.device = device
        if prefetch_lookahead is not None:
            self.prefetch_lookahead = int(prefetch_lookahead)
        if static_layout is not None:
            self.static_layout = bool(static_layout)

    def profile_for(self, net, batch: int, relu_bits=frozenset(), maps=None):
        """The Profile to plan from (see the class docstring for the order of sources), for
        a run whose ReLUs `relu_bits` keep bit masks and whose feature maps are stored as
        `maps` (a MapFormat; a measured profile is measured in it)."""
        if self.profile is not None:
            self.profile.check_matches(net, batch, relu_bits)
            return self.profile
        if self.gpu is not None:
            from .gpus import analytic_profile
            return analytic_profile(net, batch, self.gpu, self.math or "tf32", relu_bits)
        from .profile import get_profile
        return get_profile(net, batch, self.device or "auto", directory=self.cache_dir,
                           log=self.log or _to_stderr, relu_bits=relu_bits, maps=maps)

    def profile_at(self, net, batch: int, pass_batch: int, relu_bits=frozenset(), maps=None):
        """The Profile of one pass of `pass_batch` images of a step of `batch`: the analytic
        model's at that batch, else the step's profile scaled (split.py)."""
        if self.gpu is not None and self.profile is None:
            profile = self.profile_for(net, pass_batch, relu_bits, maps)
        else:
            from .split import scale_profile
            profile = scale_profile(self.profile_for(net, batch, relu_bits, maps), net,
                                    pass_batch, relu_bits)
        return profile.with_host_link(self.host_link_gbps)

    def decide(self, plan, budget=None):
        from .search import DEFAULT_RESERVE, LOOKAHEADS
        from .split import plan_split
        net = plan.net
        batch = self.batch or plan.batch
        convs = {n.name: "fastest" for n in plan.nodes if n.layer.kind == "conv"}
        if budget is None:
            self.result = self.split = None
            return MemoryDecision(conv_algo=convs, micro_batches=self.micro_batches or 1,
                                  chunks=self.chunks or ())
        # plan.maps: the feature maps' format (bf16 maps plan at half the bytes).
        options = dict(momentum=self.momentum, input_batches=self.input_batches,
                       static_layout=self.static_layout, recompute=self.recompute,
                       reserve=DEFAULT_RESERVE if self.reserve is None else self.reserve,
                       relu_bits=plan.relu_bits, maps=plan.maps)
        lookaheads = LOOKAHEADS if self.choose_lookahead else (self.prefetch_lookahead,)
        counts = None if self.micro_batches is None else [self.micro_batches]
        self.split = plan_split(
            net, batch, lambda b: self.profile_at(net, batch, b, plan.relu_bits, plan.maps),
            int(budget), lookaheads, counts=counts, chunks=self.chunks,
            batch_slice=self.batch_slice, **options)
        chosen = self.split.chosen
        if chosen is None:
            raise self.split.infeasible_error()
        if (chosen.micro_batches > 1 or chosen.chunks) and self.gpu is None and \
                self.profile is None:
            # A profile measured at the step's batch was scaled to the pass's (and a chunk's
            # pieces') batch by a rule (split.py); the plans cuDNN offers there, and their
            # workspaces, can differ. So the option chosen is planned again from profiles
            # measured at its own batches, which is what its steps will run.
            measured = plan_split(
                net, batch, lambda b: self.profile_for(
                    net, b, plan.relu_bits, plan.maps).with_host_link(self.host_link_gbps),
                int(budget), lookaheads, counts=[chosen.micro_batches], chunks=chosen.chunks,
                batch_slice=self.batch_slice, **options)
            if measured.chosen is not None:
                self.remeasured = measured
                chosen = measured.chosen
        self.result = chosen.result
        return replace(self.result.decision, micro_batches=chosen.micro_batches,
                       prefetch_lookahead=chosen.lookahead if self.choose_lookahead else None)

    def __repr__(self) -> str:
        source = f"gpu={self.gpu!r}" if self.gpu else \
            ("profile" if self.profile is not None else "measured")
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
