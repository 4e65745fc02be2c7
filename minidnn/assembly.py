"""The executor's assembly: everything set up before a step runs, for one StepSpec.

An Executor (executor.py) runs steps; what it runs them with is made here, once: the device
and its kernels' settings, the allocator (an Arena under a budget or on the GPU, with CuPy's
allocator routed into it; a counting allocator otherwise; receipts in a dry run), the host
memory offloaded maps go to, the parameters and layer buffers placed on the device, the
network a pass runs (chunked, where the decision says so) and its liveness plan, the checks
of the decision against the network (ReLU bit masks, convolution plans, fused pairs), the
planned workspace and scratch blocks, the static layout of the feature maps and the memory
manager that serves every buffer.

    setup = Assembly(net, spec, decision, device, seed=0)
    ex = Executor.assembled(setup)       # what Executor(net, spec, decision, ...) does

The planner's step model builds thousands of dry executors: it gives each its recording
allocator and host, the liveness plan it shares, and the blocks that record its step, as
DryParts (planner/recording.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import kernels
from .backend import Device, select_device, to_numpy
from .chunks import chunk_network
from .errors import ConfigError, parse_bytes
from .fusion import (add_relu_pairs, add_sum_pairs, bias_relu_pairs, bn_add_pairs, bn_grad_pairs,
                     bn_relu_pairs, bn_sums_pairs, conv_relu_pairs, pool_bias_pairs,
                     pool_relu_forward_pairs, pool_relu_pairs, widens_backward)
from .kernels.mapformat import BF16_OPS, MapFormat, arrange, in_memory_order
from .layers import precision as mixed
from .layers.conv import parse_plan_setting
from .layers.draws import scratch_bytes
from .layers.merge import BatchJoin
from .layers.slices import check_split
from .memory.allocator import Allocator, CountingAllocator, aligned
from .memory.arena import make_allocator
from .memory.host import HostSlab, check_host_memory
from .memory.layout import PlannedBlocks
from .memory.manager import MemoryManager
from .memory.plan import LivenessPlan, grad_name
from .memory.policy import CALL_PHASES, MemoryDecision, check_runnable
from .memory.record import layout_for_step
from .network import Network
from .spec import StepSpec, check_micro_batches

# What an Executor takes from its Assembly and runs with.
SET_UP = ("net", "spec", "decision", "batch", "batch_offset", "global_batch", "device", "xp",
          "seed", "compute", "micro_batches", "micro_batch", "prefetch_lookahead",
          "memory_budget", "kernels", "host", "allocator", "maps", "plan", "layout", "manager",
          "batch_slice", "statistics_slice", "_row_offsets", "_bias_deferred", "_relu_bias",
          "_relu_in_bn", "_relu_done", "_relu_in_add", "_relu_in_conv", "_relu_forward_done",
          "_add_in_bn", "_add_done", "_relu_in_pool", "_relu_mask_done", "_relu_before_pool",
          "_pool_bias", "_bias_in_pool",
          "_add_grad_to", "_grad_handed", "_sums_handed", "_gathered")


@dataclass
class DryParts:
    """What an assembly takes instead of making it: the planner's step model gives its dry
    runs (compute=False) all four, a test may give a counting allocator. allocator / host:
    the memory.allocator.Allocator for the device / for offloaded maps (a recording
    allocator, planner/recording.py). plan: the LivenessPlan to run by: it
    must be this network's at the pass batch, with the decision's ReLU bit masks and map
    format (ConfigError otherwise); one plan is shared by the thousands of dry runs of a
    step. blocks: with the static layout, the feature-map blocks to take instead of planning
    a layout (planner/recorded.py: they record the intervals of the step walked, packed
    afterwards, so one walk gives both)."""
    allocator: Allocator | None = None
    host: Allocator | None = None
    plan: LivenessPlan | None = None
    blocks: object = None


def resolve_spec(spec, decision: MemoryDecision, settings: dict) -> StepSpec:
    """The StepSpec an executor runs: `spec`, or the keyword form (a batch size and the
    spec's fields, filled in from the decision's spec where it has one). A decision made for
    another spec is refused (ConfigError naming both)."""
    made_for = decision.spec
    if not isinstance(spec, StepSpec) and made_for is not None:
        spec = made_for.replace(batch=spec, **settings)
    else:
        spec = StepSpec.coerce(spec, settings)
    if made_for is not None and made_for != spec:
        raise ConfigError(f"the memory decision was made for another step: "
                          f"{made_for.differences(spec)} (the decision's spec vs this "
                          f"executor's); decide again for this spec (minidnn/decide.py)")
    return spec


def layout_keep(net: Network) -> tuple:
    """The tensors the static layout holds to the step's end: the loss, and the logits,
    which forward(..., keep_outputs=True) keeps for outputs()."""
    return (net.loss_node.name, net.output)


class Assembly:
    """What an executor of `net` runs `spec` and `decision` with (see the module docstring).

    device: a Device or 'auto'/'gpu'/'cpu'. seed: initializes parameters not loaded yet.
    compute=False: a dry run (receipts instead of memory, no parameter values). host_limit:
    bytes of pinned host memory for offloaded maps (None: no limit). input_grad: the plan
    also computes d loss / d input batch. dry: DryParts for the planner's dry runs.
    A failure while assembling gives the parameters, device memory and CuPy back.
    """

    def __init__(self, net: Network, spec: StepSpec, decision: MemoryDecision,
                 device: str | Device = "auto", seed: int = 0, compute: bool = True,
                 host_limit: int | str | None = None, input_grad: bool = False,
                 dry: DryParts | None = None):
        dry = dry or DryParts()
        check_runnable(decision)
        self.net, self.spec, self.decision = net, spec, decision
        self.batch, self.batch_offset = spec.batch, spec.batch_offset
        self.global_batch = spec.global_batch
        self.device = device if isinstance(device, Device) else select_device(device)
        self.xp = self.device.xp
        self.seed = int(seed)
        self.compute = bool(compute)
        if isinstance(host_limit, str):
            host_limit = parse_bytes(host_limit)
        self.micro_batches = check_micro_batches(net, self.batch, decision.micro_batches,
                                                 spec.split_batch_statistics)
        self.micro_batch = self.batch // self.micro_batches  # images in one pass
        # Deterministic: sums over the batch in fixed slices, passes last to first
        # (layers/slices.py); BatchNorm with split statistics normalizes each slice.
        self.batch_slice = spec.batch_slice
        if self.batch_slice is not None:
            check_split(self.batch, self.micro_batches, decision.chunks)
        self.statistics_slice = self.batch_slice if spec.split_batch_statistics else None
        self.prefetch_lookahead = int(decision.prefetch_lookahead)
        self.memory_budget = spec.memory_budget
        self.kernels = kernels.for_device(self.device)
        settings = {k: v for k, v in (("math", spec.math), ("deterministic", spec.deterministic))
                    if v is not None}
        if settings and hasattr(self.kernels, "configure"):
            self.kernels.configure(**settings)
        self.host = dry.host if dry.host is not None else self._make_host(host_limit)
        self._routed = False
        self._held_bufs: list = []
        self._host_params: list = []   # (parameter, its host values) before they moved here
        self.allocator = None
        try:  # from here on, a failure must give the parameters, device memory and CuPy back
            self._assemble(dry, input_grad)
        except BaseException:
            for p, values in self._host_params:  # not views into memory about to go away
                p.data = values
                if hasattr(p, "grad"):   # parameters; buffers have no gradient
                    p.grad = None
            if self.allocator is not None:
                self._release_device_memory()
            raise
        self._host_params = []

    def _assemble(self, dry: DryParts, input_grad: bool) -> None:
        """The checks, the plan, the allocator, the parameters, the layout and the manager."""
        decision, static_layout = self.decision, self.spec.static_layout
        self._check_relu_bits()
        self.maps = MapFormat(decision.layout, decision.precision)
        graph = self._chunked(self.net)
        plan = dry.plan
        if plan is None:
            plan = LivenessPlan(graph, self.micro_batch, relu_bits=decision.relu_bits,
                                input_grad=input_grad, maps=self.maps,
                                fuse=self.spec.fuse)
        self._check_plan(plan, graph, input_grad)
        self.plan = plan
        self._row_offsets = self._piece_offsets()
        self._check_conv_plans()
        self._bias_deferred, self._relu_bias = self._bias_relu()
        self._relu_in_conv, self._relu_forward_done = self._conv_relu()
        self._relu_in_bn, self._relu_done = self._bn_relu()
        self._relu_in_add, folded = self._add_relu()
        self._relu_done |= folded
        self._add_in_bn, self._add_done, extra_inputs = self._bn_add()
        self._relu_in_pool, self._relu_mask_done = self._pool_relu()
        self._relu_before_pool = self._pool_relu_forward()
        self._relu_forward_done |= frozenset(self._relu_before_pool.values())
        self._pool_bias, self._bias_in_pool = self._pool_bias_sums()
        deferred_sums = self._add_sum()
        self._add_grad_to, self._grad_handed = self._bn_grad()
        self._sums_handed = self._bn_sums()
        self._gathered = self._gathered_layers()
        self.allocator = dry.allocator if dry.allocator is not None else \
            self._make_allocator(self.memory_budget)
        self._place_parameters()
        self.layout = None
        # Workspaces are planned blocks only inside a static layout; scratch blocks for
        # random draws are the manager's always, planned or not.
        workspace = self._workspace_blocks() if static_layout else {}
        self.scratch = self._scratch_blocks()
        blocks = dry.blocks
        if blocks is not None and (self.compute or not static_layout):
            raise ConfigError("blocks are given only to a dry run with a static layout")
        if blocks is None and static_layout:
            blocks = self._plan_layout(self.prefetch_lookahead, workspace, self.scratch)
        self.manager = MemoryManager(self.plan, self.device, self.allocator, host=self.host,
                                     decision=decision, dry=not self.compute, blocks=blocks,
                                     workspace=workspace, scratch=self.scratch,
                                     add=self.kernels.add, extra_inputs=extra_inputs,
                                     deferred_sums=deferred_sums)

    def release(self) -> None:
        """Bring parameters and buffers back to host memory (NumPy) and release all device
        and host memory (the executor's close(), after its manager's)."""
        if self.compute:
            for _, p in self.net.parameters():
                p.data = np.array(to_numpy(p.data), copy=True, order="C")
                p.grad = None
            for _, b in self.net.buffers():
                b.data = np.array(to_numpy(b.data), copy=True)
        self._release_device_memory()
        self.host.close()

    def _make_allocator(self, budget):
        """The dry run counts receipts; otherwise an Arena (GPU, or any budget) with CuPy's
        allocator routed into it, or a counting SimpleAllocator on a CPU without a budget."""
        if not self.compute:
            return CountingAllocator(budget)
        if not self.device.is_gpu:   # the CPU's arena and host slab are both host memory
            slab = self.decision.offload_bytes(self.plan)
            limit = getattr(self.host, "limit", None)
            check_host_memory(budget or 0, slab if limit is None else min(slab, limit))
        allocator = make_allocator(self.device, budget)
        if self.device.is_gpu:
            allocator.install()  # every CuPy allocation now comes out of the arena
            self._routed = True
        return allocator

    def _make_host(self, limit):
        return CountingAllocator(limit) if not self.compute else HostSlab(self.device, limit)

    def _place_parameters(self) -> None:
        """Parameters and their gradients out of the device allocator (counted, budgeted)."""
        params = self.net.parameters()
        if not self.compute:
            # A dry run only counts: one receipt of the bytes they would all take, each tensor
            # aligned as its own block would be (a planner makes thousands of dry runs)
            nbytes = sum(2 * aligned(max(math.prod(p.shape) * self.net.dtype.itemsize, 1))
                         for _, p in params)
            if params:
                self._held_bufs.append(self.allocator.alloc(nbytes,
                                                            "parameters and their gradients"))
            self._place_buffers()   # BatchNorm's running statistics are held as well
            return
        if any(p.data is None for _, p in params):
            # Initialize what is missing; values already loaded (a partial state dict) stay.
            loaded = {id(p): p.data for _, p in params if p.data is not None}
            self.net.init_params(self.seed)
            for _, p in params:
                p.data = loaded.get(id(p), p.data)
        for name, p in params:
            values = np.ascontiguousarray(to_numpy(p.data), dtype=self.net.dtype)
            self._host_params.append((p, values))
            _, buf = self.allocator.empty(p.shape, self.net.dtype, f"parameter {name}")
            self._held_bufs.append(buf)
            _, gbuf = self.allocator.empty(p.shape, self.net.dtype, f"gradient of {name}")
            self._held_bufs.append(gbuf)
            data = self.maps.view(buf, p.shape, self.net.dtype)   # conv weights as the maps
            grad = self.maps.view(gbuf, p.shape, self.net.dtype)
            if self.device.is_gpu:
                with self.device.compute:
                    in_memory_order(data).set(arrange(values, self.maps.layout).reshape(-1),
                                              stream=self.device.compute)
                    grad.fill(0)
            else:
                data[...] = values
                grad.fill(0)
            p.data, p.grad = data, grad
        self._place_buffers()

    def _place_buffers(self) -> None:
        """Layer buffers (BatchNorm's running statistics) out of the device allocator too."""
        for name, b in self.net.buffers():
            dtype = b.dtype or self.net.dtype
            if not self.compute:
                self._held_bufs.append(self.allocator.alloc(
                    max(math.prod(b.shape), 1) * np.dtype(dtype).itemsize,
                    f"buffer {name}"))
                continue
            values = b.initial_value(self.net.dtype) if b.data is None else \
                np.array(to_numpy(b.data), dtype=dtype)
            self._host_params.append((b, values))
            data, buf = self.allocator.empty(b.shape, dtype, f"buffer {name}")
            self._held_bufs.append(buf)
            if self.device.is_gpu:
                with self.device.compute:
                    data.set(values, stream=self.device.compute)
            else:
                data[...] = values
            b.data = data

    def _chunked(self, net: Network) -> Network:
        """The network a pass runs: `net`, or, with the decision's layer chunks, the chunked
        network (minidnn/chunks.py), each chunk's pieces dividing the pass batch evenly."""
        if not self.decision.chunks:
            return net
        graph = chunk_network(net, self.decision.chunks)
        for first, last, pieces in self.decision.chunks:
            if self.micro_batch % pieces:
                raise ConfigError(f"layer chunk {first}..{last}: {pieces} pieces must divide "
                                  f"the pass batch {self.micro_batch} into equal pieces")
        # Shapes of `net` inferred here, so that reading its parameters later does not set
        # its layers up again (the chunked plan set them up for the pieces' rows).
        net.infer_shapes(self.micro_batch)
        return graph

    def _piece_offsets(self) -> dict:
        """{node index: first row of its piece in the pass} for the pieces of layer chunks:
        added to the pass's batch offset, so that dropout draws the pass's rows."""
        return {i: node.piece[0] * (self.micro_batch // node.piece[1])
                for i, node in enumerate(self.plan.nodes) if node.piece is not None}

    def _check_plan(self, plan: LivenessPlan, graph: Network, input_grad: bool) -> None:
        """A plan given to the executor is the one it would have made itself: of `graph`
        (the network, or the same chunked network made by another call of chunk_network)."""
        def nodes(g):   # the joins are new layers each time; every other layer is net's
            return [(n.name, n.inputs, n.piece,
                     type(n.layer) if isinstance(n.layer, BatchJoin) else n.layer)
                    for n in g.nodes]

        same = plan.net is graph or bool(self.decision.chunks) and nodes(plan.net) == nodes(graph)
        if not same or plan.batch != self.micro_batch or \
                plan.relu_bits != frozenset(self.decision.relu_bits) or \
                plan.input_grad != bool(input_grad) or plan.maps != self.maps:
            raise ConfigError(f"the liveness plan given is not that of network "
                              f"{self.net.name!r} at batch {self.micro_batch} with this "
                              f"decision's ReLU bit masks and map format")

    def _check_conv_plans(self) -> None:
        """Every plan setting of the decision names a convolution of this network and reads
        as a setting (layers/conv.py); the layers receive them through the StepContext."""
        for name, setting in self.decision.conv_algo.items():
            if self.net.node(name).layer.kind != "conv":
                raise ConfigError(f"memory decision sets a convolution plan for {name!r}, "
                                  f"which is not a convolution of network {self.net.name!r}")
            parse_plan_setting(setting)

    def _check_relu_bits(self) -> None:
        """Every ReLU the decision has keep bit masks is a ReLU of this network; the layers
        receive the names through the StepContext."""
        for name in sorted(self.decision.relu_bits):
            if self.net.node(name).layer.kind != "relu":
                raise ConfigError(f"memory decision has {name!r} keep ReLU bit masks, which "
                                  f"is not a ReLU of network {self.net.name!r}")

    def _workspace_blocks(self) -> dict:
        """{(node index, phase): bytes} of the decision's planned workspaces (a layer of a
        chunk gets its block in each of its pieces)."""
        calls = {}            # layer -> the plan's nodes that run it
        for i, node in enumerate(self.plan.nodes):
            calls.setdefault(id(node.layer), []).append(i)
        index = {node.name: calls[id(node.layer)] for node in self.net.nodes}
        blocks = {}
        for (name, phase), nbytes in self.decision.workspace.items():
            if name not in index or phase not in CALL_PHASES:
                raise ConfigError(f"memory decision plans a workspace for {name!r} ({phase}), "
                                  f"which is not a layer call of network {self.net.name!r}")
            if int(nbytes) > 0:
                for i in index[name]:
                    blocks[(i, phase)] = int(nbytes)
        return blocks

    def _bf16_ops(self) -> frozenset:
        """The kernels' ops that take bf16 maps as they are: the planned device's in a dry
        run for it."""
        return BF16_OPS[getattr(self.device, "planned_kind", self.device.kind)]

    def _scratch_blocks(self) -> dict:
        """{(node index, phase): bytes} of the scratch blocks of the calls that widen bf16
        maps to float32 (layers/precision.py: the copies, first in the block), copy a map
        inside themselves (Layer.copy_bytes: on maps in the layer's own dtype) or draw random
        numbers (layers/draws.py: the call's own rows' draws and this device's generator)."""
        bf16_ops = self._bf16_ops()
        widens = self.plan.maps.precision == "bf16"
        blocks = {}
        for i, node in enumerate(self.plan.nodes):
            for phase in CALL_PHASES:
                if widens:
                    nbytes = mixed.temporary_bytes(node.layer, bf16_ops,
                                                   self.plan.call_maps(i, phase), phase)
                else:
                    shared = self.plan.grad_alias.get(i) if phase == "backward" else \
                        self.plan.inplace.get(i)
                    nbytes = node.layer.copy_bytes(phase, self.plan.maps.layout, bool(shared))
                shape = node.layer.random_draws(phase) if phase != "recompute" else None
                if shape is not None:
                    nbytes += scratch_bytes(shape, self.device.generator_bytes)
                if nbytes:
                    blocks[(i, phase)] = nbytes
        return blocks

    def _plan_layout(self, lookahead: int, workspace: dict, scratch: dict):
        """Record one step's blocks (and planned workspaces and scratch blocks), pack them
        (memory/layout.py), and take the region for them from the allocator now, so that a
        budget too small fails before step one."""
        keep = layout_keep(self.net)
        self.layout = layout_for_step(self.plan, self.decision.offload, lookahead, keep,
                                      workspace, self.decision.recompute, scratch)
        buf = self.allocator.alloc(self.layout.size, "feature maps (static layout)")
        self._held_bufs.append(buf)
        # A dry run only counts: its blocks are views of an empty array.
        region = buf if self.compute else np.empty(0, np.uint8)
        return PlannedBlocks(self.layout, region, self.allocator)

    def _release_device_memory(self) -> None:
        for buf in self._held_bufs:
            self.allocator.free(buf)
        self._held_bufs = []
        if self._routed:
            self.allocator.uninstall()
            self._routed = False
        self.allocator.close()

    def _fusion_pairs(self, field: str, allowed: dict, what: str) -> dict:
        """The decision's `field` pairs (minidnn/fusion.py), checked against those this step's
        plan allows (`allowed`); ConfigError naming the pairs that would change results."""
        pairs = getattr(self.decision, field)
        wrong = {a: b for a, b in pairs.items() if allowed.get(a) != b}
        if wrong:
            raise ConfigError(f"the decision {what} where that would change results: {wrong} "
                              f"(minidnn/fusion.py)")
        return pairs

    def _plan_pairs(self, field: str, planned: dict, what: str) -> dict:
        """The pairs of a fusion the plan's rule decides (it changes what the step holds, so
        a dry run of the step, whose decision names no fusion, must hold what the run
        holds): `planned`. A decision whose `field` names pairs names those: ConfigError
        otherwise (a decision made by hand that names none runs the plan's)."""
        named = getattr(self.decision, field)
        if named and named != planned:
            raise ConfigError(f"the decision {what} {dict(sorted(named.items()))}, where the "
                              f"step's plan has {dict(sorted(planned.items()))} "
                              f"(minidnn/fusion.py)")
        return planned

    def _gathered_layers(self) -> dict:
        """{node index: node} of the fully connected layers whose parameter gradients a
        split step computes once (the decision's gathered, minidnn/gathered.py); none in a
        step of one pass."""
        if not self.decision.gathered or self.micro_batches == 1:
            return {}
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        wrong = sorted(name for name in self.decision.gathered
                       if name not in index or self.plan.nodes[index[name]].layer.kind !=
                       "linear" or self.plan.nodes[index[name]].piece is not None)
        if wrong:
            raise ConfigError(f"the decision gathers the gradients of {wrong}, which are not "
                              f"fully connected layers of this step (minidnn/gathered.py)")
        return {index[name]: self.plan.nodes[index[name]] for name in self.decision.gathered}

    def _bias_relu(self) -> tuple:
        """(convolutions whose bias the ReLU after them adds, {ReLU name: that bias
        Parameter}) from the decision's bias_relu."""
        if not self.decision.bias_relu:              # nothing fused, nothing to check
            return frozenset(), {}
        pairs = self._fusion_pairs("bias_relu", bias_relu_pairs(self.plan),
                                   "moves convolution biases into ReLUs")
        return (frozenset(pairs.values()),
                {r: self.net.node(c).layer.params["bias"] for r, c in pairs.items()})

    def _conv_relu(self) -> tuple:
        """(convolutions that apply their bias and the ReLU after them in their forward,
        those ReLUs) from the decision's conv_relu."""
        if not self.decision.conv_relu:
            return frozenset(), frozenset()
        pairs = self._fusion_pairs("conv_relu", conv_relu_pairs(self.plan,
                                                                self.batch_slice is not None),
                                   "moves ReLUs into convolutions")
        return frozenset(pairs.values()), frozenset(pairs)

    def _bn_relu(self) -> tuple:
        """(batch norms that apply the ReLU after them, those ReLUs) from the decision's
        bn_relu."""
        if not self.decision.bn_relu:
            return frozenset(), frozenset()
        pairs = self._fusion_pairs("bn_relu", bn_relu_pairs(self.plan),
                                   "moves ReLUs into batch norms")
        return frozenset(pairs.values()), frozenset(pairs)

    def _bn_add(self) -> tuple:
        """(batch norms that apply the add and the ReLU after them, those adds, {batch norm
        node index: (the add's other input,)}: what each such batch norm's forward reads
        besides its input) from the decision's bn_add."""
        if not self.decision.bn_add:
            return frozenset(), frozenset(), {}
        pairs = self._fusion_pairs("bn_add", bn_add_pairs(self.plan),
                                   "moves adds into batch norms")
        fused = frozenset(pairs.values())
        extra = {b: (other,) for b, other in self.plan.residual_reads.items()
                 if self.plan.nodes[b].name in fused}
        return fused, frozenset(pairs), extra

    def _pool_relu(self) -> tuple:
        """(max pools that apply the mask of the ReLU before them, those ReLUs): the plan's
        pairs (_plan_pairs), which keep nothing of those ReLUs for backward
        (LivenessPlan.pooled_relus)."""
        pairs = self._plan_pairs("pool_relu", pool_relu_pairs(self.plan),
                                 "has max pools apply the masks of ReLUs")
        return frozenset(pairs.values()), frozenset(pairs)

    def _pool_relu_forward(self) -> dict:
        """{max pool: the ReLU before it, whose forward the pool applies} from the decision's
        pool_relu_forward."""
        if not self.decision.pool_relu_forward:
            return {}
        pairs = self._fusion_pairs("pool_relu_forward",
                                   pool_relu_forward_pairs(self.plan, self.batch_slice is not None),
                                   "moves ReLUs into max pools")
        return {pool: relu for relu, pool in pairs.items()}

    def _pool_bias_sums(self) -> tuple:
        """({max pool: the bias Parameter whose gradient it sums}, the ReLUs that added those
        biases) from the decision's pool_bias. A pool whose backward widens bf16 maps (on
        the CPU) leaves the sums to its ReLU, which sums the gradient as stored, rounded
        once more where windows overlap."""
        if not self.decision.pool_bias:
            return {}, frozenset()
        pairs = self._fusion_pairs("pool_bias",
                                   pool_bias_pairs(self.plan, self.batch_slice is not None),
                                   "has max pools sum bias gradients")
        unbiased = sorted(relu for relu in pairs if relu not in self._relu_bias)
        if unbiased:
            raise ConfigError(f"the decision has max pools sum the bias gradients of ReLUs "
                              f"that add no bias in it (its bias_relu): {unbiased}")
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        bf16_ops = self._bf16_ops()
        pairs = {relu: pool for relu, pool in pairs.items()
                 if not widens_backward(self.plan, index[pool], bf16_ops)}
        return ({pool: self._relu_bias[relu] for relu, pool in pairs.items()},
                frozenset(pairs))

    def _add_sum(self) -> dict:
        """{(reader node index, gradient name): add node index}: the gradient sums the adds'
        backward takes over from the memory manager (its `deferred_sums`): the plan's pairs
        (_plan_pairs), whose temporaries the adds keep. An add whose backward widens bf16
        maps (on the CPU) leaves its sum to the memory manager: the widened copy of gy is
        taken before the add could add to it."""
        pairs = self._plan_pairs("add_sum", add_sum_pairs(self.plan),
                                 "has residual adds take over the gradient sums")
        relu_of = {add: relu for relu, add in add_relu_pairs(self.plan).items()}
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        bf16_ops = self._bf16_ops()
        return {(index[reader], grad_name(relu_of[add])): index[add]
                for add, reader in pairs.items()
                if not widens_backward(self.plan, index[add], bf16_ops)}

    def _bn_grad(self) -> tuple:
        """({add node name: the input k whose gradient alone it writes}, {add node index: (k,
        the index of the batch norm node that reads it)}) from the decision's bn_grad. An add whose
        backward widens bf16 maps (on the CPU) writes both, as unfused: its widened copies
        are written back whole."""
        if not self.decision.bn_grad:
            return {}, {}
        pairs = self._fusion_pairs("bn_grad", bn_grad_pairs(self.plan),
                                   "has batch norms read their gradient from an add's other "
                                   "input")
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        bf16_ops = self._bf16_ops()
        to, handed = {}, {}
        for bn, add in pairs.items():
            a = index[add]
            if widens_backward(self.plan, a, bf16_ops):
                continue
            to[add] = 1 - self.plan.nodes[a].inputs.index(bn)
            handed[a] = (to[add], index[bn])
        return to, handed

    def _bn_sums(self) -> frozenset:
        """Indices of the batch norm nodes whose sums the add before them takes (the
        decision's bn_sums), among those the bn_grad pairs in force hand a gradient to and
        whose input this decision keeps on the device (a decision made by hand may move
        one its bn_sums names: that pair runs unfused)."""
        if not self.decision.bn_sums:
            return frozenset()
        pairs = self._fusion_pairs("bn_sums", bn_sums_pairs(self.plan, frozenset(),
                                                            self.statistics_slice is not None),
                                   "has adds take batch norms' sums")
        kept = bn_sums_pairs(self.plan, self.decision.offload | self.decision.recompute,
                             False)
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        handed = {bn for _, bn in self._grad_handed.values()}
        return frozenset(index[bn] for bn in pairs if bn in kept and index[bn] in handed)

    def _add_relu(self) -> tuple:
        """(adds that apply the ReLU after them, those ReLUs) from the decision's add_relu."""
        if not self.decision.add_relu:
            return frozenset(), frozenset()
        pairs = self._fusion_pairs("add_relu", add_relu_pairs(self.plan),
                                   "moves ReLUs into adds")
        return frozenset(pairs.values()), frozenset(pairs)
