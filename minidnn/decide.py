"""Decide, then build: `--policy NAME` and a budget become the decision an Executor runs.

The executor runs a finished decision (memory/policy.MemoryDecision) and decides nothing:
what to keep, offload or recompute, each convolution's plan setting, which ReLUs keep bit
masks, the prefetch lookahead and the planned workspaces all arrive in one value. This module
sits above both the executor and the planner and is the one place that asks a policy (and so,
for `dyn`, the planner) for that value:

    decision = decide(net, 32, policy="all", memory_budget="4GiB", relu_bits=True)
    ex = Executor(net, 32, memory_budget="4GiB", decision=decision)

or both at once, as train.py and the scripts do:

    ex = build_executor(net, 32, policy="dyn", memory_budget="12GiB")

Policies: memory/policy.py (none, all, conv) and planner/dyn.py (dyn), which registers itself
when imported here.
"""
from __future__ import annotations

from dataclasses import replace

from .backend import Device, select_device
from .chunks import chunk_network
from .errors import ConfigError, parse_bytes
from .executor import Executor, check_micro_batches
from .kernels.mapformat import MapFormat, map_layout
from .layers.slices import check_split, deterministic_slice
from .fusion import bias_relu_pairs, bn_relu_pairs
from .memory.plan import LivenessPlan
from .memory.policy import MemoryDecision, Policy, get_policy as _registered_policy, \
    policy_names as _registered_names, relu_bits_for
from .planner import dyn as _dyn  # noqa: F401  (registers the `dyn` policy)


def policy_names() -> list[str]:
    """Every policy `--policy` accepts: none, all, conv, dyn (and any registered later)."""
    return _registered_names()


def get_policy(spec: str | Policy) -> Policy:
    """A Policy instance from a name, or a Policy (returned as is)."""
    return _registered_policy(spec)


def decide(net, batch: int, policy="none", memory_budget: int | str | None = None, *,
           relu_bits: bool = False, prefetch_lookahead: int = 1, device=None,
           static_layout: bool | None = None, precision: str = "fp32",
           layout: str | None = None, micro_batches: int | None = None,
           split_batch_statistics: bool = False, fuse: bool = True,
           chunks=None, deterministic: bool = False) -> MemoryDecision:
    """The finished decision for `net` at `batch` under `policy` (a name or a Policy).

    memory_budget: bytes (or '12GiB') the step must fit, for the policies that plan (dyn).
    relu_bits: ReLUs whose output no other layer keeps for backward keep one bit per value
    instead (memory/policy.relus_worth_bits); the policy plans with them. prefetch_lookahead:
    layers ahead backward prefetches, unless the policy chooses it (dyn does). device: where a
    planning policy measures its profile (a Device or 'auto'/'gpu'/'cpu'). static_layout: the
    executor will place feature maps at planned addresses (default: when a budget is given);
    a planning policy plans its workspaces into that layout. precision ('fp32' or 'bf16') and
    layout ('nchw', 'nhwc', or None: the device's default) say how feature maps are stored
    (kernels/mapformat.py); the policy plans with their bytes. micro_batches: run each step
    as this many passes of batch / micro_batches images (None: one, or what a planning
    policy chooses: dyn weighs the counts with a budget); split_batch_statistics: allow a
    split of a network with BatchNorm (see Executor). fuse: ReLUs add the bias of the
    convolution before them where that gives the same bits (minidnn/fusion.py). chunks:
    ((first node, last node, pieces), ...): runs of layers each pass executes piece by piece
    (minidnn/chunks.py; None: none, or what a planning policy chooses: dyn weighs them with
    a budget; (): none). Forcing chunks needs a planning policy: the maps it offloads or
    recomputes are the chunked network's. deterministic: every micro-batch and chunk piece
    must be whole slices of the batch (layers/slices.py); a planning policy weighs only those.

    Returns a MemoryDecision with prefetch_lookahead, relu_bits, policy, precision and layout
    filled in.
    """
    if isinstance(memory_budget, str):
        memory_budget = parse_bytes(memory_budget)
    if prefetch_lookahead is None or int(prefetch_lookahead) < 0:
        raise ConfigError(f"prefetch_lookahead must be a number of layers >= 0, "
                          f"got {prefetch_lookahead!r}")
    if static_layout is None:
        static_layout = memory_budget is not None
    if micro_batches is not None:   # checked before any planning
        check_micro_batches(net, int(batch), micro_batches, split_batch_statistics)
        if deterministic:
            check_split(int(batch), int(micro_batches), chunks or ())
    chosen = get_policy(policy)
    relus = relu_bits_for(net) if relu_bits else frozenset()
    planning = chosen.plans
    if chunks and not planning:
        raise ConfigError(f"layer chunks are planned: policy {chosen.name!r} decides for the "
                          f"unchunked network; use the dyn policy (--policy dyn)")
    if chunks:
        chunk_network(net, chunks)      # ConfigError for a run that cannot be chunked
    if planning:  # a planning policy learns what it plans for
        # A network with whole-batch statistics is not split unless the user allows it.
        whole = micro_batches is None and not split_batch_statistics and \
            bool(net.batch_statistics_layers())
        chosen.bind(device=device, prefetch_lookahead=int(prefetch_lookahead),
                    static_layout=static_layout, batch=int(batch),
                    micro_batches=1 if whole else micro_batches, chunks=chunks,
                    batch_slice=deterministic_slice(batch) if deterministic else None)
    if isinstance(device, str):
        device = select_device(device)
    maps = MapFormat(map_layout(device, layout) if device is not None else layout or "nchw",
                     precision)
    # A policy that does not plan splits decides for one pass of the count asked for.
    count = 1 if planning or micro_batches is None else int(micro_batches)
    # The policy plans with the ReLUs as the executor will run them, and the maps' format.
    plan = LivenessPlan(net, int(batch) // count, relu_bits=relus, maps=maps)
    decision = chosen.decide(plan, memory_budget)
    if not planning and micro_batches is not None:
        decision = replace(decision, micro_batches=int(micro_batches))
    check_micro_batches(net, int(batch), decision.micro_batches, split_batch_statistics)
    lookahead = decision.prefetch_lookahead
    if decision.chunks:     # the pairs fused are the chunked network's (pieces are not fused)
        plan = LivenessPlan(chunk_network(net, decision.chunks), plan.batch, relu_bits=relus,
                            maps=maps)
    return replace(decision, prefetch_lookahead=int(prefetch_lookahead) if lookahead is None
                   else lookahead, relu_bits=relus, policy=chosen.name,
                   precision=maps.precision, layout=maps.layout,
                   bias_relu=bias_relu_pairs(plan) if fuse else {},
                   bn_relu=bn_relu_pairs(plan) if fuse else {})


def build_executor(net, batch: int, device: str | Device = "auto", seed: int = 0,
                   memory_budget: int | str | None = None, policy="none",
                   prefetch_lookahead: int = 1, trace: bool = False, compute: bool = True,
                   host_limit: int | str | None = None, math: str | None = None,
                   deterministic: bool | None = None, static_layout: bool | None = None,
                   relu_bits: bool = False, precision: str = "fp32",
                   layout: str | None = None, micro_batches: int | None = None,
                   split_batch_statistics: bool = False, batch_offset: int = 0,
                   global_batch: int | None = None, fuse: bool = True,
                   graphs: bool = True, chunks=None) -> Executor:
    """`decide(...)`, then an Executor of that decision (the arguments as there; batch is
    the executor's, one rank's share of `global_batch` in data-parallel training)."""
    device = device if isinstance(device, Device) else select_device(device)
    decision = decide(net, batch, policy, memory_budget, relu_bits=relu_bits,
                      prefetch_lookahead=prefetch_lookahead, device=device,
                      static_layout=static_layout, precision=precision, layout=layout,
                      micro_batches=micro_batches, split_batch_statistics=split_batch_statistics,
                      fuse=fuse, chunks=chunks, deterministic=bool(deterministic))
    return Executor(net, batch, device=device, seed=seed, memory_budget=memory_budget,
                    decision=decision, trace=trace, compute=compute, host_limit=host_limit,
                    math=math, deterministic=deterministic, static_layout=static_layout,
                    split_batch_statistics=split_batch_statistics,
                    batch_offset=batch_offset, global_batch=global_batch, graphs=graphs)
