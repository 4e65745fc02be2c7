"""Memory policies: what the memory manager does with each buffer, decided before step one.

A policy reads the LivenessPlan (every buffer, its size, who writes and reads it and when) and
returns a MemoryDecision: the set of storages to offload to host memory during forward (and
prefetch back during backward), the set to drop after forward and recompute in backward
(running their writers' forward again, right before the first backward reader), and,
optionally, a convolution plan per conv layer. Layers never change for any of it.

    none   keep every feature map on the device (liveness alone frees what is dead)
    all    vDNN_all: offload every feature map that backward reads
    conv   vDNN_conv: offload only the inputs of convolution layers (their long compute
           hides the copy)
    dyn    vDNN_dyn: what the planner finds fastest within the budget, convolution plans
           included (minidnn/planner/dyn.py, which registers itself here on import)

    policy = OffloadAll()                  # minidnn/decide.py finds policies by name
    decision = policy.decide(plan)
    decision.offload                       # frozenset of storage ids

This module only defines policies and the decision they return; it imports nothing above
memory/. Turning `--policy NAME` and a budget into the decision an executor runs is the job
of minidnn/decide.py, above both the executor and the planner.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..kernels.mapformat import MapFormat
from .plan import LivenessPlan, StoragePlan

# Kinds of storage that hold feature maps (as opposed to gradients, which backward produces).
FEATURE_KINDS = ("input", "feature", "aux")
# The layer calls of a training step; a decision's workspace blocks are keyed by them.
CALL_PHASES = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class MemoryDecision:
    """What a policy decided for one (network, batch).

    offload: storage ids to copy to host after their last forward write and evict from the
    device after their last forward read. conv_algo: {conv node name: plan setting}
    ('fastest', 'min_workspace' or 'fastest<=BYTES', see layers/conv.py) for layers whose
    plans the policy sets.
    prefetch_lookahead: layers ahead backward prefetches, when the policy chose it (None: the
    executor's own setting). workspace: {(conv node name, 'forward' | 'backward' |
    'recompute'): bytes} of the cuDNN workspace each call's plan setting needs, for the static
    layout to plan among the feature maps (empty: the kernels allocate workspaces at run time).
    recompute: storage ids (from `recompute_candidates`) to drop after their last forward
    use and rebuild before their first backward use by running their writers' forward again;
    no storage is both offloaded and recomputed, and none is rebuilt from another one that
    is. The rebuilt bytes are the forward's bit for bit wherever forward is deterministic (on
    the GPU: the deterministic math mode, or plans without atomics).
    micro_batches: passes a training step runs, each over batch / micro_batches images
    (executor.py); the storage ids and bytes above are those of one pass.
    chunks: ((first node, last node, pieces), ...): runs of layers each pass executes piece
    by piece over its batch (minidnn/chunks.py, which checks them). With chunks, the storage
    ids above are those of the liveness plan of the chunked network (chunk_network), whose
    piece nodes are named 'conv1@0', ...; weight-gradient sums change order.
    """
    offload: frozenset = frozenset()
    conv_algo: dict = field(default_factory=dict)
    prefetch_lookahead: int | None = None
    workspace: dict = field(default_factory=dict)
    recompute: frozenset = frozenset()
    # Filled in by minidnn/decide.py when the decision is finished for an executor:
    # relu_bits: names of the ReLU nodes that keep one bit per value for backward instead of
    # their output (layers/relu.py); policy: the name of the policy that decided (reports).
    relu_bits: frozenset = frozenset()
    policy: str = ""
    micro_batches: int = 1
    chunks: tuple = ()
    # How feature maps are stored (kernels/mapformat.py): precision 'fp32' or 'bf16' (mixed:
    # bf16 maps and map gradients), layout 'nchw' or 'nhwc' (channels last). decide.py fills
    # in the device's default layout.
    precision: str = "fp32"
    layout: str = "nchw"
    # bias_relu: {ReLU node name: convolution node name}: the ReLU adds that convolution's
    # bias in its own pass (minidnn/fusion.py); the same bits, one pass fewer.
    bias_relu: dict = field(default_factory=dict)
    # conv_relu: {ReLU node name: convolution node name}, a part of bias_relu: that
    # convolution applies the bias and the ReLU in its forward, the ReLU's forward does
    # nothing (float32 maps; minidnn/fusion.py).
    conv_relu: dict = field(default_factory=dict)
    # bn_relu: {ReLU node name: batch norm node name}: the batch norm applies that ReLU in its
    # own pass, whose forward then does nothing (minidnn/fusion.py).
    bn_relu: dict = field(default_factory=dict)
    # add_relu: {ReLU node name: add node name}: the add applies that ReLU in its own pass and
    # masks its gradient with the ReLU's output in backward (minidnn/fusion.py).
    add_relu: dict = field(default_factory=dict)
    # bn_add: {add node name: batch norm node name}, adds of add_relu: the batch norm that
    # writes the add's input 0 applies the add and its ReLU in its own pass, whose forward
    # then does nothing (minidnn/fusion.py).
    bn_add: dict = field(default_factory=dict)
    # add_sum: {add node name: node name}, adds of add_relu: the add's backward adds the
    # gradient of its ReLU's output that node's backward wrote, in its own pass, instead of the
    # memory manager after that backward (minidnn/fusion.py).
    add_sum: dict = field(default_factory=dict)
    # bn_grad: {batch norm node name: add node name}, adds of add_relu: the add's backward
    # writes its masked gradient to its other input's gradient alone, and the batch norm,
    # whose backward comes next, reads it from there (minidnn/fusion.py).
    bn_grad: dict = field(default_factory=dict)
    # bn_sums: {batch norm node name: add node name}, a part of bn_grad: the add's pass also
    # takes the batch norm's sums of the gradient it writes, reading the batch norm's input,
    # which this decision neither offloads nor recomputes (minidnn/fusion.py).
    bn_sums: dict = field(default_factory=dict)
    # pool_relu: {ReLU node name: max pool node name}: the max pool applies that ReLU's mask
    # in its backward, and the ReLU keeps nothing for backward (minidnn/fusion.py).
    pool_relu: dict = field(default_factory=dict)
    # pool_relu_forward: {ReLU node name: max pool node name}, a part of pool_relu: the max
    # pool applies that ReLU (and the bias it adds) in its forward too, reading the ReLU's
    # input, and the ReLU's forward does nothing (minidnn/fusion.py).
    pool_relu_forward: dict = field(default_factory=dict)
    # pool_bias: {ReLU node name: max pool node name}, a part of pool_relu: the max pool's
    # backward also sums the gradient of the convolution bias that ReLU adds, and the ReLU's
    # backward does nothing (minidnn/fusion.py).
    pool_bias: dict = field(default_factory=dict)
    # gathered: names of fully connected nodes whose parameter gradients a split step
    # computes once, after its last pass, over the rows every pass copied aside
    # (minidnn/gathered.py).
    gathered: frozenset = frozenset()
    # spec: the StepSpec (minidnn/spec.py) the decision was made for (decide.py fills it in;
    # None: a decision made by hand, which fits any spec). An executor refuses a decision
    # made for another spec.
    spec: object = None

    def offload_bytes(self, plan: LivenessPlan) -> int:
        return sum(plan.storages[sid].nbytes for sid in self.offload)


# Keep everything on the device, prefetch one layer ahead: an executor given no decision.
NO_DECISION = MemoryDecision(prefetch_lookahead=1, policy="none")


def check_runnable(decision: MemoryDecision) -> None:
    """Raise ConfigError unless an executor can run `decision` as it is: a finished decision
    (minidnn/decide.py fills in its prefetch lookahead) with only the choices it supports.
    (Its micro-batch count and layer chunks the executor checks against the batch and the
    network.)"""
    if not isinstance(decision, MemoryDecision):
        raise ConfigError(f"an executor runs a memory.policy.MemoryDecision (see "
                          f"minidnn/decide.py), got {decision!r}")
    lookahead = decision.prefetch_lookahead
    if lookahead is None or isinstance(lookahead, bool) or int(lookahead) < 0:
        raise ConfigError(f"prefetch_lookahead must be a number of layers >= 0, "
                          f"got {lookahead!r}")
    MapFormat(decision.layout, decision.precision)     # ConfigError for an unknown one


def offload_candidates(plan: LivenessPlan, min_bytes: int = 0) -> list[StoragePlan]:
    """Storages that can usefully leave the device between forward and backward.

    A candidate holds a feature map (graph input, layer output or aux buffer) that backward
    reads, of at least `min_bytes`, and is not needed for at least one layer call in between:
    a buffer read by the very next call (the loss's softmax, the labels, the loss value) would
    come straight back, so moving it only costs copies.
    """
    out = []
    for s in plan.storages:
        if s.kind not in FEATURE_KINDS or not s.needed_in_backward or s.nbytes < min_bytes:
            continue
        if s.first_backward_use - s.last_forward_use <= 1:
            continue
        out.append(s)
    return out


# plan -> inputs: for every storage id, what rebuilding it reads (recompute_inputs, in
# order). A plan does not change once made, and every schedule with a recompute set asks it
# for each storage of the set, so it is worked out once per plan.
_REBUILD_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rebuild_reads(plan: LivenessPlan) -> list:
    inputs = _REBUILD_READS.get(plan)
    if inputs is None:
        inputs = []
        for s in plan.storages:
            out = []
            for j in plan.writers(s.id):
                for name in plan.nodes[j].inputs:
                    t = plan.tensors[name].storage
                    if t != s.id and t not in out:
                        out.append(t)
            inputs.append(tuple(out))
        _REBUILD_READS[plan] = inputs
    return inputs


def recompute_inputs(plan: LivenessPlan, sid: int) -> list[int]:
    """Storages that rebuilding storage `sid` reads: its writers' inputs other than itself."""
    inputs = _rebuild_reads(plan)
    return list(inputs[sid]) if 0 <= sid < len(inputs) else []


# plan -> {min_bytes: recompute_candidates}: every schedule with a recompute set checks it
# against them, and the planner compiles one for every decision it weighs.
_RECOMPUTE_CANDIDATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def recompute_candidates(plan: LivenessPlan, min_bytes: int = 0) -> list[StoragePlan]:
    """Offload candidates (see above) that can instead be rebuilt right before their first
    backward reader by running their writers' forward again.

    Every writer must be `recomputable` (not dropout: random; not a max-pool: its kernel
    writes the argmax too). Every other storage the writers read must still be alive then (a
    convolution's input is: its own backward reads it later) and must hold the bytes the
    writer read in forward (nothing wrote it after that writer ran, no gradient took its
    buffer before). Any set of candidates can be recomputed at once: a storage read to rebuild
    another that is in the set too is rebuilt first (memory/schedule.py: a chain).
    """
    known = _RECOMPUTE_CANDIDATES.setdefault(plan, {})
    if min_bytes not in known:
        known[min_bytes] = tuple(_recompute_candidates(plan, min_bytes))
    return list(known[min_bytes])


def _recompute_candidates(plan: LivenessPlan, min_bytes: int) -> list[StoragePlan]:
    def intact(t: StoragePlan, writer: int, when: int) -> bool:
        """Does storage t still hold, at backward time `when`, what `writer` read in forward?"""
        return t.free_time >= when and t.last_forward_write < writer and \
            (t.gradient_from is None or t.gradient_from >= when)

    def rebuildable(s: StoragePlan) -> bool:
        writers = plan.writers(s.id)
        return all(plan.nodes[j].layer.recomputable for j in writers) and \
            all(intact(plan.storage_of(name), j, s.first_backward_use)
                for j in writers for name in plan.nodes[j].inputs
                if plan.tensors[name].storage != s.id)

    return [s for s in offload_candidates(plan, min_bytes)
            if s.kind == "feature" and rebuildable(s)]


def relus_worth_bits(plan: LivenessPlan) -> list[str]:
    """ReLU nodes whose output is worth keeping as one bit per value (ReLU keep='bits'):

    * only their own backward reads it (a ReLU before a max-pool, say): the map is free after
      forward;
    * besides their own, only one backward reads it: that of a convolution whose input it is,
      which can then write its input gradient over the map (grad_over_input, plan.py) instead
      of into a buffer of its own: one map less at that convolution's backward.
    """
    out = []
    for i, node in enumerate(plan.nodes):
        layer = node.layer
        if layer.kind != "relu" or not plan.retains_output(i):
            continue
        s = plan.storage_of(node.name)
        others = [t for t in s.backward_uses if t != plan.backward_time(i)]
        if not others:
            out.append(node.name)
        elif len(others) == 1:
            reader = plan.nodes[plan.node_at(others[0])]
            if reader.layer.grad_over_input and reader.inputs and \
                    plan.tensors[reader.inputs[0]].storage == s.id and \
                    plan.wants_grad(reader, 0):
                out.append(node.name)
    return out


# net -> relu_bits_for(net): a network's graph does not change once built, and the planner
# asks for every step model it makes.
_RELU_BITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def relu_bits_for(net) -> frozenset:
    """The ReLUs of `net` that `relus_worth_bits` names, as a decision's `relu_bits` (the
    plan and the calls read them from there; the layers stay as they are). Which ones does
    not depend on the batch, so a plan at batch 1 decides; nor on the fusions: the unfused
    plan decides, since an add that folds the ReLU after it retains that ReLU's output only
    when the ReLU keeps it (minidnn/fusion.py), and asked for bits, a ReLU keeps bits."""
    names = _RELU_BITS.get(net)
    if names is None:
        names = _RELU_BITS[net] = frozenset(relus_worth_bits(LivenessPlan(net, 1, fuse=False)))
    return names


class Policy:
    """Base of every policy. Subclasses set `name` and override `decide`.

    A policy that plans (`plans = True`: the planner's dyn) is told, before it decides, what
    the executor will run with (`bind`); it may choose the micro-batch count and layer
    chunks itself. Every other policy decides from the liveness plan alone.
    """

    name = ""
    description = ""
    plans = False
    #: What the last decision found worth telling the user, one line each (a planning
    #: policy's; minidnn train prints them as notes).
    notes: tuple = ()

    def bind(self, spec, device=None) -> None:
        """What the executor will run with (minidnn/decide.py): its StepSpec (spec.py) and
        the device. A policy that does not plan needs neither."""

    def decide(self, plan: LivenessPlan, budget: int | None = None) -> MemoryDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its `name` (the CLI's --policy)."""
    if not cls.name:
        raise ValueError(f"policy class {cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    """Names of the policies registered so far (minidnn/decide.py imports the planner's
    first, so that `dyn` is among them)."""
    return sorted(_REGISTRY)


def get_policy(spec: str | Policy) -> Policy:
    """A Policy instance from a registered name ('none', 'all', 'conv'; 'dyn' once the
    planner is imported) or a Policy (returned as is)."""
    if isinstance(spec, Policy):
        return spec
    cls = _REGISTRY.get(str(spec))
    if cls is None:
        raise ConfigError(f"unknown memory policy {spec!r}; known policies: "
                          f"{', '.join(policy_names())}")
    return cls()


@register_policy
class NoOffload(Policy):
    """Nothing leaves the device; buffers live exactly as long as liveness says."""
    name = "none"
    description = "keep feature maps on the device (liveness only)"

    def decide(self, plan, budget=None):
        return MemoryDecision()


@register_policy
class OffloadAll(Policy):
    """vDNN_all: every feature map that backward reads goes to host memory in between."""
    name = "all"
    description = "vDNN_all: offload every feature map backward reads"

    def __init__(self, min_bytes: int = 0):
        self.min_bytes = int(min_bytes)

    def decide(self, plan, budget=None):
        return MemoryDecision(offload=frozenset(s.id for s in offload_candidates(plan, self.min_bytes)))


@register_policy
class OffloadConv(Policy):
    """vDNN_conv: only what convolution layers' backward reads (their inputs)."""
    name = "conv"
    description = "vDNN_conv: offload the inputs of convolution layers"

    def __init__(self, min_bytes: int = 0):
        self.min_bytes = int(min_bytes)

    def decide(self, plan, budget=None):
        conv_reads = set()
        for i, node in enumerate(plan.nodes):
            if node.layer.kind == "conv":
                conv_reads.update(plan.backward_reads[i])
        return MemoryDecision(offload=frozenset(
            s.id for s in offload_candidates(plan, self.min_bytes) if s.id in conv_reads))
