"""Decide, then build: `--policy NAME` and a budget become the decision an Executor runs.

The executor runs a finished decision (memory/policy.MemoryDecision) and decides nothing:
what to keep, offload or recompute, each convolution's plan setting, which ReLUs keep bit
masks, the prefetch lookahead and the planned workspaces all arrive in one value. This module
sits above both the executor and the planner and is the one place that asks a policy (and so,
for `dyn`, the planner) for that value:

    spec = StepSpec(batch=32, policy="all", memory_budget="4GiB", relu_bits=True)
    decision = decide(net, spec)                  # decision.spec is spec
    ex = Executor(net, spec, decision)

or both at once, as train.py and the scripts do:

    ex = build_executor(net, StepSpec(batch=32, policy="dyn", memory_budget="12GiB"))

Policies: memory/policy.py (none, all, conv) and planner/dyn.py (dyn), which registers itself
when imported here. A vDNN policy (none, all, conv) under a budget is weighed here too: the
step model predicts what its one decision needs (planner/planning.plan_policy, the figure
`minidnn plan --policy NAME` prints), and a smaller budget is refused before any executor
exists, naming that least budget (planning.PolicyBudgetError).
"""
from __future__ import annotations

from dataclasses import replace

from .backend import Device, select_device
from .chunks import chunk_network
from .executor import Executor
from .kernels.mapformat import MapFormat, map_layout
from .fusion import (add_relu_pairs, add_sum_pairs, bias_relu_pairs, bn_add_pairs, bn_grad_pairs,
                     bn_relu_pairs, bn_sums_pairs, conv_relu_pairs, pool_bias_pairs,
                     pool_relu_forward_pairs, pool_relu_pairs)
from .gathered import gathered_layers
from .memory.plan import LivenessPlan
from .memory.policy import MemoryDecision, Policy, get_policy as _registered_policy, \
    policy_names as _registered_names, relu_bits_for
from .planner import dyn as _dyn  # noqa: F401  (registers the `dyn` policy)
from .spec import StepSpec


def policy_names() -> list[str]:
    """Every policy `--policy` accepts: none, all, conv, dyn (and any registered later)."""
    return _registered_names()


def get_policy(spec: str | Policy) -> Policy:
    """A Policy instance from a name, or a Policy (returned as is)."""
    return _registered_policy(spec)


def decide(net, spec: StepSpec | int, device=None, **settings) -> MemoryDecision:
    """The finished decision for `net` under `spec` (a StepSpec: the batch, the policy, a
    name or a Policy, the budget and the rest of the combination; see minidnn/spec.py).

    device: where a planning policy measures its profile (a Device or 'auto'/'gpu'/'cpu');
    the device also sets the feature maps' default layout. The policy plans with the
    spec's ReLU bit masks (memory/policy.relus_worth_bits; under a budget dyn leaves them
    off where its plan without them is faster: planning.plan_step), precision and layout,
    its prefetch lookahead (unless it chooses one: dyn does), static layout, micro-batches
    and layer chunks (None: what a planning policy chooses; dyn weighs them with a budget).
    Forcing chunks needs a planning policy: the maps it offloads or recomputes are the
    chunked network's. settings: the spec's fields, when `spec` is a batch size (the
    keyword form: decide(net, 32, policy="all", memory_budget="4GiB")).

    Returns a MemoryDecision with prefetch_lookahead, relu_bits, policy, precision, layout,
    the fused pairs and `spec` filled in.
    """
    spec = StepSpec.coerce(spec, settings)
    spec.check_network(net)     # checked before any planning
    chosen = get_policy(spec.policy)
    spec.check_policy(chosen)
    relus = relu_bits_for(net) if spec.relu_bits else frozenset()
    planning = chosen.plans
    if planning:  # a planning policy learns what it plans for
        chosen.bind(spec, device)
    if isinstance(device, str):
        device = select_device(device)
    maps = MapFormat(map_layout(device, spec.layout) if device is not None
                     else spec.layout or "nchw", spec.precision)
    # A policy that does not plan splits decides for one pass of the count asked for.
    count = 1 if planning or spec.micro_batches is None else spec.micro_batches
    # The policy plans with the ReLUs as the executor will run them, and the maps' format.
    plan = LivenessPlan(net, spec.batch // count, relu_bits=relus, maps=maps, fuse=spec.fuse)
    decision = chosen.decide(plan, spec.memory_budget)
    if not planning and spec.micro_batches is not None:
        decision = replace(decision, micro_batches=spec.micro_batches)
    if not planning and spec.memory_budget is not None and chosen.name in VDNN_POLICIES:
        decision = weighed(net, spec, chosen.name, device, maps, decision, relus)
    lookahead = decision.prefetch_lookahead
    if planning and decision.relu_bits != relus:   # dyn left the bit masks off (planning.py)
        relus = decision.relu_bits
        plan = LivenessPlan(net, plan.batch, relu_bits=relus, maps=maps, fuse=spec.fuse)
    if decision.chunks:     # the pairs fused are the chunked network's (pieces are not fused)
        plan = LivenessPlan(chunk_network(net, decision.chunks), plan.batch, relu_bits=relus,
                            maps=maps, fuse=spec.fuse)
    return replace(decision, prefetch_lookahead=spec.prefetch_lookahead if lookahead is None
                   else lookahead, relu_bits=relus, policy=chosen.name,
                   precision=maps.precision, layout=maps.layout,
                   bias_relu=bias_relu_pairs(plan) if spec.fuse else {},
                   conv_relu=conv_relu_pairs(plan, bool(spec.deterministic)) if spec.fuse
                   else {},
                   bn_relu=bn_relu_pairs(plan) if spec.fuse else {},
                   add_relu=add_relu_pairs(plan) if spec.fuse else {},
                   add_sum=add_sum_pairs(plan) if spec.fuse else {},
                   bn_add=bn_add_pairs(plan) if spec.fuse else {},
                   bn_grad=bn_grad_pairs(plan) if spec.fuse else {},
                   bn_sums=bn_sums_pairs(plan, decision.offload | decision.recompute,
                                         bool(spec.deterministic and
                                              spec.split_batch_statistics))
                   if spec.fuse else {},
                   pool_relu=pool_relu_pairs(plan) if spec.fuse else {},
                   pool_relu_forward=pool_relu_forward_pairs(plan, bool(spec.deterministic))
                   if spec.fuse else {},
                   pool_bias=pool_bias_pairs(plan, bool(spec.deterministic)) if spec.fuse
                   else {}, gathered=gathered_layers(plan, decision.micro_batches, spec),
                   spec=spec)


# The policies that decide once, from the liveness plan alone (memory/policy.py).
VDNN_POLICIES = ("none", "all", "conv")


def weighed(net, spec: StepSpec, policy: str, device, maps: MapFormat,
            decision: MemoryDecision, relus: frozenset) -> MemoryDecision:
    """A vDNN policy's `decision` weighed against the spec's budget: PolicyBudgetError (a
    MemoryBudgetError naming the least budget) when the budget is below what it needs, as
    the step model walks it (the spec's micro-batches, static layout and prefetch lookahead;
    the run's input batch, outside the arena, not counted), from the profile dyn would plan
    from on `device` (a GPU's measured once and cached; the CPU's, whose kernels take no
    workspace, not measured: planning.ProfileSource.memory_only). Returns the decision with
    the cuDNN workspaces that walk planned, where it planned any (a GPU's), each
    convolution's plan held to its planned workspace, so that the run is the step planned."""
    from .planner.dyn import RUN_INPUT_BATCHES
    from .planner.planning import ProfileSource, plan_policy
    source = ProfileSource(device=device, memory_only=True)
    static = plan_policy(net, spec, source, maps, decision.offload, decision.conv_algo,
                         dict(relu_bits=relus, input_batches=RUN_INPUT_BATCHES))
    static.check(spec.memory_budget, policy)
    planned = static.evaluation.decision
    if not any(planned.workspace.values()):
        return decision
    return replace(decision, conv_algo=planned.conv_algo, workspace=planned.workspace)


def build_executor(net, spec: StepSpec | int, device: str | Device = "auto", seed: int = 0,
                   trace: bool = False, compute: bool = True,
                   host_limit: int | str | None = None, input_grad: bool = False,
                   **settings) -> Executor:
    """`decide(net, spec, device)`, then an Executor of that decision (see Executor for
    seed, trace, compute, host_limit and input_grad; settings: the spec's fields, when
    `spec` is a batch size)."""
    spec = StepSpec.coerce(spec, settings)
    device = device if isinstance(device, Device) else select_device(device)
    decision = decide(net, spec, device=device)
    return Executor(net, spec, decision, device=device, seed=seed, trace=trace,
                    compute=compute, host_limit=host_limit, input_grad=input_grad)
