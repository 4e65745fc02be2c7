"""StepSpec: one value naming the combination a training step runs, built and checked once.

A training step is a combination of many choices: the batch (and, in data-parallel
training, the global batch and this rank's rows of it), how many micro-batches a step runs,
which runs of layers execute in chunks, how feature maps are stored (precision, layout,
ReLU bit masks), which memory policy decides under which budget, how far backward
prefetches, whether feature maps sit at planned addresses, CUDA graphs, deterministic
kernels and the math mode, whether a network with BatchNorm may be split, and whether
ReLUs fuse with the layer before them. Every one of them is a field here; every check that
does not need the network runs when the value is made, and the two that do (micro-batches
against whole-batch statistics, layer chunks against the graph) run in `check_network`:

    spec = StepSpec(batch=256, policy="dyn", memory_budget="12GiB", relu_bits=True)
    decision = decide(net, spec, device="gpu")             # minidnn/decide.py
    ex = Executor(net, spec, decision, device="gpu")      # or build_executor(net, spec, ...)

`decision.spec` is the spec the decision was made for; an executor refuses a decision made
for another one. Defaults are written once, here: a static layout when a budget is given.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from .chunks import as_chunks, chunk_network, describe
from .errors import ConfigError, parse_bytes
from .kernels.mapformat import LAYOUTS, PRECISIONS
from .layers.slices import check_split, deterministic_slice


def check_micro_batches(net, batch: int, micro_batches, allow_statistics: bool) -> int:
    """micro_batches as an int, checked: it divides the batch (passes of equal size, so each
    pass's mean loss weighs the same), and a network whose layers compute whole-batch
    statistics splits only when `allow_statistics`. ConfigError otherwise."""
    k = _count(micro_batches, "micro-batches", 1)
    if batch % k:
        raise ConfigError(f"micro-batches {k} must divide the batch {batch} into equal "
                          f"micro-batches")
    stats = net.batch_statistics_layers() if net is not None else []
    if k > 1 and stats and not allow_statistics:
        raise ConfigError(f"network {net.name!r} has layers that normalize with the whole "
                          f"batch's statistics ({', '.join(stats)}): split into {k} "
                          f"micro-batches they would see {batch // k} images each and train "
                          f"differently; allow it explicitly (split_batch_statistics, "
                          f"--split-batch-statistics) or do not split")
    return k


def _count(value, what: str, least: int, unit: str = "an integer") -> int:
    """`value` as an int >= least (ConfigError otherwise, saying `what` must be `unit`; a
    bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ConfigError(f"{what} must be {unit} >= {least}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class StepSpec:
    """The combination a training step runs (see the module docstring).

    batch: images this executor's step runs (one rank's share in data-parallel training).
    global_batch: images of the whole step over every rank (None: batch); batch_offset:
    the first of this rank's rows in it; ranks: processes the global batch is split over.
    micro_batches: passes a step runs, each of batch / micro_batches images (None: one, or
    what a planning policy chooses). chunks: ((first node, last node, pieces), ...): runs
    of layers a pass executes piece by piece (minidnn/chunks.py; None: none, or what a
    planning policy chooses; (): none). precision: 'fp32' or 'bf16' feature maps; layout:
    'nchw', 'nhwc' or None (the device's default). relu_bits: ReLUs whose output only their
    own backward reads keep one bit per value. policy: a memory policy's name ('none',
    'all', 'conv', 'dyn') or a Policy; memory_budget: bytes (or '12GiB') for everything on
    the device, or None. prefetch_lookahead: layers ahead backward prefetches (a planning
    policy may choose its own). static_layout: feature maps at addresses planned before
    step one (None: when a budget is given). graphs: replay steps from CUDA graphs where
    possible. deterministic / math: the GPU kernels' settings (None: leave them).
    split_batch_statistics: allow micro-batches in a network with BatchNorm. fuse: a ReLU
    adds the bias of the convolution before it, or runs inside the batch norm before it,
    where that gives the same bits (minidnn/fusion.py).
    """
    batch: int
    global_batch: int | None = None
    batch_offset: int = 0
    ranks: int = 1
    micro_batches: int | None = None
    chunks: tuple | None = None
    precision: str = "fp32"
    layout: str | None = None
    relu_bits: bool = False
    policy: object = "none"
    memory_budget: int | None = None
    prefetch_lookahead: int = 1
    static_layout: bool | None = None
    graphs: bool = True
    deterministic: bool | None = None
    math: str | None = None
    split_batch_statistics: bool = False
    fuse: bool = True

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("batch", _count(self.batch, "batch", 1))
        put("global_batch", self.batch if self.global_batch is None
            else _count(self.global_batch, "global batch", 1))
        put("batch_offset", _count(self.batch_offset, "batch offset", 0))
        put("ranks", _count(self.ranks, "ranks", 1))
        if self.batch_offset > self.global_batch - self.batch:
            raise ConfigError(f"rows {self.batch_offset}..{self.batch_offset + self.batch} do "
                              f"not lie in a global batch of {self.global_batch}")
        if self.micro_batches is not None:
            put("micro_batches", check_micro_batches(None, self.batch, self.micro_batches,
                                                     self.split_batch_statistics))
        if self.chunks is not None:
            put("chunks", as_chunks(self.chunks))
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                              f"{self.precision!r}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got "
                              f"{self.layout!r}")
        if isinstance(self.memory_budget, str):
            put("memory_budget", parse_bytes(self.memory_budget))
        elif self.memory_budget is not None:
            put("memory_budget", int(self.memory_budget))
        put("prefetch_lookahead", _count(self.prefetch_lookahead, "prefetch_lookahead", 0,
                                         "a number of layers"))
        if self.static_layout is None:  # the default, written once: planned under a budget
            put("static_layout", self.memory_budget is not None)
        for name in ("relu_bits", "static_layout", "graphs", "split_batch_statistics", "fuse"):
            put(name, bool(getattr(self, name)))

    @classmethod
    def coerce(cls, spec, settings: dict) -> StepSpec:
        """`spec` as a StepSpec: a StepSpec as it is, or a batch size (an int) with the
        fields in `settings` (the keyword form decide(), build_executor() and Executor()
        also accept). ConfigError for settings beside a StepSpec, or a field it lacks."""
        if isinstance(spec, StepSpec):
            if settings:
                raise ConfigError(f"give the step's settings in its StepSpec, not beside it: "
                                  f"{', '.join(sorted(settings))}")
            return spec
        unknown = sorted(set(settings) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"a training step has no setting {', '.join(unknown)}")
        return cls(batch=spec, **settings)

    def replace(self, **changes) -> StepSpec:
        """This spec with `changes` (checked again)."""
        return replace(self, **changes)

    def differences(self, other: StepSpec) -> str:
        """'batch 32 vs 64, ...': the fields where `other` differs, this spec's value first."""
        return ", ".join(f"{f.name} {getattr(self, f.name)!r} vs {getattr(other, f.name)!r}"
                         for f in fields(self) if getattr(self, f.name) != getattr(other, f.name))

    def check_network(self, net) -> None:
        """The checks that need the network: a forced micro-batch count splits a network with
        whole-batch statistics only when allowed, and the forced layer chunks are runs the
        network can run in pieces (ConfigError otherwise)."""
        if self.micro_batches is not None:
            check_micro_batches(net, self.batch, self.micro_batches,
                                self.split_batch_statistics)
            if self.deterministic:   # parts of whole slices (layers/slices.py)
                check_split(self.batch, self.micro_batches, self.chunks or ())
        if self.chunks:
            chunk_network(net, self.chunks)

    def check_policy(self, policy) -> None:
        """Forcing layer chunks needs a policy that plans (`policy.plans`): the maps any other
        policy offloads or recomputes are the unchunked network's."""
        if self.chunks and not policy.plans:
            raise ConfigError(f"layer chunks are planned: policy {policy.name!r} decides for "
                              f"the unchunked network ({describe(self.chunks)}); use the dyn "
                              f"policy (--policy dyn)")

    @property
    def batch_slice(self) -> int | None:
        """Under --deterministic, the images of one slice the sums over the batch run in
        (layers/slices.py); None otherwise."""
        return deterministic_slice(self.batch) if self.deterministic else None

    def whole_batch(self, net) -> bool:
        """Does a planning policy keep one pass because the network normalizes with the whole
        batch's statistics and nothing allows or forces a split?"""
        return self.micro_batches is None and not self.split_batch_statistics and \
            bool(net.batch_statistics_layers())
