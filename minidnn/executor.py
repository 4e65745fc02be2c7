"""The executor: runs forward and backward of a network layer by layer on one device.

It runs a decision made before it is built (what to keep, offload or recompute, each
convolution's plan setting, the ReLU bit masks, the prefetch lookahead: minidnn/decide.py
makes it from a policy name and a budget) and decides nothing itself: every buffer comes from
the memory manager, every number from a layer. This is the Python API the training loop and
the CLI are built on:

    net = models.build("alexnet", num_classes=10, image_size=64)
    decision = decide(net, 32, policy="all", memory_budget="4GiB")      # minidnn/decide.py
    ex = Executor(net, batch=32, device="auto", seed=0, memory_budget="4GiB", decision=decision)
    loss = ex.forward(x, labels)          # x: (32, 3, 64, 64) float32, labels: (32,) int
    ex.backward()
    grads = ex.gradients()                # {'conv1.weight': ndarray (a copy), ...}
    ex.memory_stats()                     # peak device bytes, offloaded bytes, ...

For checks against another framework: `Executor(..., input_grad=True)` also computes the
gradient of the loss with respect to the input batch (`ex.input_gradient()` after backward),
and `forward(x, labels, dropout=False)` runs a training step with every dropout layer passed
through (the identity), so that the step is deterministic without changing the network.

Memory: everything on the device comes out of one allocator. On the GPU that is always an
Arena (of the budget, or of the free memory when no budget is given) with CuPy's allocator
routed into it for the executor's lifetime, so parameters, gradients, optimizer state, cuDNN
workspaces and temporaries are all counted; on the CPU, the arena when a budget is given and a
counting SimpleAllocator otherwise, with parameters and gradients drawn from it as well.

Micro-batches: a decision with `micro_batches=4` (decide(..., micro_batches=4), or dyn's own
choice) makes the executor plan and run every pass at batch 64 of a step of 256: `train_step`
(or `accumulate_gradients`) runs the step as 4 forward/backward passes, the parameter
gradients of passes after the first added into `p.grad`, and one optimizer update. The loss is
that of the whole batch (each pass starts backward from 1/4, so every gradient is the whole
batch's mean), dropout masks are the whole batch's rows. What changes bits against the
unsplit step: the order of the sums over the batch (a weight or bias gradient is the sum of 4
partial sums, each over 64 images; the reported loss is the mean of 4 means), and whatever a
kernel computes differently at another batch size (a BLAS or cuDNN algorithm chosen by
shape); so split and unsplit steps agree to rounding, and a split step repeats bit for bit.

Layer chunks: a decision with `chunks=(("conv1", "relu2", 4),)` runs those layers in 4
pieces of a pass's batch, forward and backward (minidnn/chunks.py rewrites the network; the
liveness plan, and so every storage id of the decision, is that of the chunked network).
`self.net` stays the network given, whose parameters the pieces share; `self.plan.net` is
the chunked one. The parameter gradients of every piece after the first are added into
p.grad (the temporary-and-add of micro-batches), so a weight's gradient is a sum of the
pieces' sums, in another order than the unchunked step's; everything else (outputs, loss,
input gradients, dropout masks) is the same bits.

Dry run: `Executor(..., compute=False).simulate_step()` walks a whole step through the memory
manager with receipts instead of memory and no layer compute, so the memory figures of networks
far larger than this machine come out in seconds (parameters, gradients and the scratch
blocks of random draws are counted; other temporaries inside layers and optimizer state are
not).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from . import kernels
from .backend import Device, select_device, to_numpy
from .chunks import chunk_network
from .errors import ConfigError, DataError, ShapeError, parse_bytes
from .fusion import bias_relu_pairs, bn_relu_pairs
from .kernels.mapformat import MapFormat, arrange, in_memory_order
from .layers import precision as mixed
from .layers.base import StepContext
from .layers.conv import parse_plan_setting
from .layers.draws import scratch_bytes
from .layers.merge import BatchJoin
from .memory.allocator import Allocator, CountingAllocator, aligned
from .memory.arena import Arena, make_allocator
from .memory.host import HostSlab, check_host_memory
from .memory.layout import PlannedBlocks
from .memory.manager import MemoryManager
from .memory.observer import ObserverGroup
from .memory.plan import LivenessPlan
from .memory.policy import CALL_PHASES, NO_DECISION, MemoryDecision, check_runnable
from .memory.record import layout_for_step
from .memory.schedule import walk
from .network import DATA, LABEL, Network
from .spec import StepSpec, check_micro_batches
from .step_graph import StepGraphs, capturable


class Executor:
    """Training and evaluation steps of `net` at a fixed batch size on one device.

    memory_budget: bytes (int or '12GiB') for everything on the device, or None.
    decision: the finished memory.policy.MemoryDecision to run (minidnn/decide.py; None: keep
    every map, prefetch one layer ahead). Its conv plan settings reach the convolutions
    through the StepContext; the layers keep their own. trace: keep a trace.Tracer in
    `self.tracer`.
    compute=False: dry run (simulate_step only).
    static_layout: place every feature-map block at an address planned before step one
    (memory/layout.py; no fragmentation, a known peak) instead of allocating it at run time.
    None (default): planned when a memory budget is given, where fragmentation can make a
    step fail; without a budget, run-time allocation lets workspaces reuse feature-map bytes
    across the step, which gives a lower peak.
    The decision's `relu_bits` ReLUs keep one bit per value instead of their output
    (layers/relu.py; lossless): the liveness plan is made with them and they reach the ReLUs
    through the StepContext; the layers keep their own setting.
    host_limit: bytes of pinned host memory for offloaded maps (None: no limit).
    math / deterministic: passed to the GPU kernels' `configure` when given (a setting of
    the kernel module, so it stays in force for later executors too).
    allocator / host: a memory.allocator.Allocator for the device / for offloaded maps, to
    use instead of the ones the executor would make (the planner's step model gives a dry run
    its recording allocator this way).
    input_grad: also compute d loss / d input batch in backward (`input_gradient()`); it costs
    the data-gradient pass of the first layers and one input-sized buffer.
    The decision's `micro_batches` (which must divide the batch) runs each training step as
    that many passes of batch / micro_batches images, gradients accumulated, one optimizer
    update. split_batch_statistics: allow that in a network with a layer whose result
    depends on the whole batch (`batch_statistics = True`: BatchNorm), which then sees each
    micro-batch's statistics instead of the batch's; without it such a split is an error.
    The decision's `layout` and `precision` (kernels/mapformat.py) say how feature maps are
    stored: 'nchw' or 'nhwc' (channels last; 4-D parameters, the conv weights, are then laid
    out (O, KH, KW, C) on the device, and state_dict() still gives OIHW), and 'fp32' or
    'bf16' (mixed precision: maps and their gradients in bfloat16, everything else float32;
    layers/precision.py runs layers on them).
    batch_offset / global_batch: this executor's batch is rows batch_offset .. batch_offset
    + batch of a larger global batch (one rank's share in data-parallel training); layers that
    draw per row (dropout) draw for the global batch and use these rows. Default: the batch
    is the whole batch.
    plan: the LivenessPlan to run by, instead of making one: it must be this network's at the
    pass batch, with the decision's ReLU bit masks and map format and this `input_grad`
    (ConfigError otherwise). The plan never changes once made, so the planner's step model
    shares one among the thousands of dry runs it makes.
    blocks: a dry run with the static layout only: the feature-map blocks to take instead of
    planning a layout (none is recorded or packed, and no region is taken): the planner's
    step model passes blocks that record the intervals of the step it walks, and packs them
    afterwards (planner/recorded.py), so that one walk gives both.
    graphs: on the GPU, replay train_step from a CUDA graph of an earlier step where the step
    allows it (minidnn/step_graph.py: same bits, far less host work); False: never.

    Parameters move to the device here; `net.state_dict()` reads them back; `close()` brings
    them back to host memory and releases the device memory.
    """

    def __init__(self, net: Network, spec: StepSpec | int, decision: MemoryDecision | None = None,
                 device: str | Device = "auto", seed: int = 0, trace: bool = False,
                 compute: bool = True, host_limit: int | str | None = None,
                 input_grad: bool = False, allocator: Allocator | None = None,
                 host: Allocator | None = None, plan: LivenessPlan | None = None, blocks=None,
                 **settings):
        self.net = net
        self.decision = decision = NO_DECISION if decision is None else decision
        check_runnable(decision)
        self.spec = spec = self._spec(spec, settings)
        self.batch = spec.batch
        self.batch_offset = spec.batch_offset
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
        self.prefetch_lookahead = int(decision.prefetch_lookahead)
        self.memory_budget = memory_budget = spec.memory_budget
        static_layout = spec.static_layout
        math, deterministic, graphs = spec.math, spec.deterministic, spec.graphs
        self.kernels = kernels.for_device(self.device)
        if (math is not None or deterministic is not None) and hasattr(self.kernels, "configure"):
            opts = {k: v for k, v in (("math", math), ("deterministic", deterministic))
                    if v is not None}
            self.kernels.configure(**opts)
        self.host = host if host is not None else self._make_host(host_limit)
        self._routed = False
        self._held_bufs: list = []
        self._host_params: list = []   # (parameter, its host values) before they moved here
        self.allocator = None
        try:  # from here on, a failure must give the parameters, device memory and CuPy back
            self._check_relu_bits()
            self.maps = MapFormat(decision.layout, decision.precision)
            graph = self._chunked(net)
            if plan is None:
                plan = LivenessPlan(graph, self.micro_batch, relu_bits=decision.relu_bits,
                                    input_grad=input_grad, maps=self.maps)
            self._check_plan(plan, graph, input_grad)
            self.plan = plan
            self._row_offsets = self._piece_offsets()
            self._check_conv_plans()
            self._bias_deferred, self._relu_bias = self._bias_relu()
            self._relu_in_bn, self._relu_done = self._bn_relu()
            self.allocator = allocator if allocator is not None else \
                self._make_allocator(memory_budget)
            self._place_parameters()
            self.layout = None
            # Workspaces are planned blocks only inside a static layout; scratch blocks for
            # random draws are the manager's always, planned or not.
            workspace = self._workspace_blocks() if static_layout else {}
            scratch = self._scratch_blocks()
            if blocks is not None and (self.compute or not static_layout):
                raise ConfigError("blocks are given only to a dry run with a static layout")
            if blocks is None and static_layout:
                blocks = self._plan_layout(self.prefetch_lookahead, workspace, scratch)
            self.manager = MemoryManager(self.plan, self.device, self.allocator, host=self.host,
                                         offload=self.decision.offload,
                                         prefetch_lookahead=self.prefetch_lookahead,
                                         dry=not self.compute, blocks=blocks,
                                         workspace=workspace,
                                         recompute=self.decision.recompute, scratch=scratch,
                                         add=self.kernels.add)
        except BaseException:
            for p, values in self._host_params:  # not views into memory about to go away
                p.data = values
                if hasattr(p, "grad"):   # parameters; buffers have no gradient
                    p.grad = None
            if self.allocator is not None:
                self._release_device_memory()
            raise
        self._host_params = []
        self.tracer = None
        self.observer = None           # what the executor and the manager tell (watch)
        self._watched, self._standing = None, []
        if trace:
            self.enable_trace()
        self.step = 0                  # steps taken; seeds dropout, so resume replays it
        self._peak_before_step = 0     # allocator peak before the current step's reset
        self._outputs = None
        self._input_grad = None
        self._dropout = True           # dropout of the open training step (forward's argument)
        self._accumulate = False       # backward adds parameter gradients to p.grad
        self._in_step = False
        self._closed = False
        self._step_keys = None         # while a step is captured: its dropout keys' table
        self._graphs = self._step_graphs(scratch) if graphs else None

    def _spec(self, spec, settings: dict) -> StepSpec:
        """The StepSpec this executor runs: `spec`, or the keyword form (a batch size and the
        spec's fields, filled in from the decision's spec where it has one). A decision made
        for another spec is refused."""
        made_for = self.decision.spec
        if not isinstance(spec, StepSpec) and made_for is not None:
            spec = made_for.replace(batch=spec, **settings)
        else:
            spec = StepSpec.coerce(spec, settings)
        if made_for is not None and made_for != spec:
            raise ConfigError(f"the memory decision was made for {made_for}, not for this "
                              f"executor's {spec}: decide again for this spec "
                              f"(minidnn/decide.py)")
        return spec

    def _step_graphs(self, scratch: dict):
        """The StepGraphs that replay train_step (minidnn/step_graph.py), where a step can be
        captured: on the GPU, from the arena, and, when maps move to host memory, in a static
        layout; else None."""
        if not (self.compute and self.device.is_gpu and isinstance(self.allocator, Arena)) \
                or not capturable(bool(self.manager.offload), self.layout is not None):
            return None
        draw_layers = {self.plan.nodes[i].layer.index for i, _ in scratch}
        return StepGraphs(self.device, self.allocator, self._step, self.seed, draw_layers,
                          self.kernels.bind_libraries, self.manager.ordered_by_streams)

    # ---- memory set-up ----------------------------------------------------------------------------
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

    def _scratch_blocks(self) -> dict:
        """{(node index, phase): bytes} of the scratch blocks of the calls that draw random
        numbers (layers/draws.py): the whole batch's draws and this device's generator."""
        blocks = {}
        for i, node in enumerate(self.plan.nodes):
            for phase in ("forward", "backward"):
                shape = node.layer.random_draws(phase)
                if shape is not None:
                    blocks[(i, phase)] = scratch_bytes(shape, self.global_batch,
                                                       self.device.generator_bytes)
        return blocks

    def _plan_layout(self, lookahead: int, workspace: dict, scratch: dict):
        """Record one step's blocks (and planned workspaces and scratch blocks), pack them
        (memory/layout.py), and take the region for them from the allocator now, so that a
        budget too small fails before step one."""
        keep = self.layout_keep()
        self.layout = layout_for_step(self.plan, self.decision.offload, lookahead, keep,
                                      workspace, self.decision.recompute, scratch)
        buf = self.allocator.alloc(self.layout.size, "feature maps (static layout)")
        self._held_bufs.append(buf)
        # A dry run only counts: its blocks are views of an empty array.
        region = buf if self.compute else np.empty(0, np.uint8)
        return PlannedBlocks(self.layout, region, self.allocator)

    def layout_keep(self) -> tuple:
        """The tensors the static layout holds to the step's end: the loss, and the logits,
        which forward(..., keep_outputs=True) keeps for outputs()."""
        return (self.net.loss_node.name, self.net.output)

    def _release_device_memory(self) -> None:
        for buf in self._held_bufs:
            self.allocator.free(buf)
        self._held_bufs = []
        if self._routed:
            self.allocator.uninstall()
            self._routed = False
        self.allocator.close()

    def close(self) -> None:
        """Bring parameters back to host memory (NumPy) and release all device memory."""
        if self._closed:
            return
        if self._graphs is not None:
            self._graphs.close()
            self._graphs = None     # it refers back to this executor (its plain step)
        self.manager.close()
        self.device.synchronize()
        if self.compute:
            for _, p in self.net.parameters():
                p.data = np.array(to_numpy(p.data), copy=True, order="C")
                p.grad = None
            for _, b in self.net.buffers():
                b.data = np.array(to_numpy(b.data), copy=True)
        self._release_device_memory()
        self.host.close()
        self._host_params = []
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def watch(self, observer) -> None:
        """Tell `observer` (a memory.observer.StepObserver; None: no one) about every layer
        call, copy and memory level of the steps from now on, instead of the one watching
        before (observers added by `add_observer` keep watching)."""
        self._watched = observer
        self._install_observers()

    def add_observer(self, observer) -> None:
        """Also tell `observer` about every step, beside the one `watch` sets, for this
        executor's lifetime. Data parallelism watches this way for the backward calls after
        which a layer's parameter gradients are final (distributed/buckets.py)."""
        self._standing.append(observer)
        self._install_observers()

    def _install_observers(self) -> None:
        watching = [o for o in [self._watched] + self._standing if o is not None]
        observer = watching[0] if len(watching) == 1 else \
            ObserverGroup(watching) if watching else None
        self.observer = observer
        self.manager.observer = observer

    def enable_trace(self, on: bool = True, max_steps: int | None = None):
        """Start (or stop) recording a trace.Tracer in `self.tracer`; returns it."""
        if on:
            from .trace import Tracer
            self.tracer = Tracer(self.device, max_steps=max_steps, budget=self.memory_budget)
        else:
            self.tracer = None
        self.watch(self.tracer)
        return self.tracer

    # ---- one step -------------------------------------------------------------------------------
    def _check_batch(self, x, labels) -> None:
        want = (self.batch,) + self.net.input_shape
        if tuple(x.shape) != want:
            raise ShapeError(f"input 'data' of network {self.net.name!r} must have shape {want} "
                             f"(batch, channels, height, width), got {tuple(x.shape)}")
        if tuple(labels.shape) != (self.batch,):
            raise ShapeError(f"input 'label' must have shape ({self.batch},), "
                             f"got {tuple(labels.shape)}")
        if isinstance(labels, np.ndarray):  # device labels come from our own generators
            if not np.issubdtype(labels.dtype, np.integer):
                raise DataError(f"labels must be integers, got dtype {labels.dtype}")
            k = self.plan.tensors[self.net.output].shape[-1]
            if labels.size and (labels.min() < 0 or labels.max() >= k):
                bad = labels[(labels < 0) | (labels >= k)][0]
                raise DataError(f"label {bad} is out of range: network {self.net.name!r} has "
                                f"{k} classes (labels 0..{k - 1})")

    def _fusion_pairs(self, field: str, allowed: dict, what: str) -> dict:
        """The decision's `field` pairs (minidnn/fusion.py), checked against those this step's
        plan allows (`allowed`); ConfigError naming the pairs that would change results."""
        pairs = getattr(self.decision, field)
        wrong = {a: b for a, b in pairs.items() if allowed.get(a) != b}
        if wrong:
            raise ConfigError(f"the decision {what} where that would change results: {wrong} "
                              f"(minidnn/fusion.py)")
        return pairs

    def _bias_relu(self) -> tuple:
        """(convolutions whose bias the ReLU after them adds, {ReLU name: that bias
        Parameter}) from the decision's bias_relu."""
        if not self.decision.bias_relu:              # nothing fused, nothing to check
            return frozenset(), {}
        pairs = self._fusion_pairs("bias_relu", bias_relu_pairs(self.plan),
                                   "moves convolution biases into ReLUs")
        return (frozenset(pairs.values()),
                {r: self.net.node(c).layer.params["bias"] for r, c in pairs.items()})

    def _bn_relu(self) -> tuple:
        """(batch norms that apply the ReLU after them, those ReLUs) from the decision's
        bn_relu."""
        if not self.decision.bn_relu:
            return frozenset(), frozenset()
        pairs = self._fusion_pairs("bn_relu", bn_relu_pairs(self.plan),
                                   "moves ReLUs into batch norms")
        return frozenset(pairs.values()), frozenset(pairs)

    def _ctx(self, train: bool, offset: int = 0) -> StepContext:
        return StepContext(self.xp, kernels=self.kernels, train=train, step=self.step,
                           seed=self.seed, device=self.device,
                           conv_plans=self.decision.conv_algo,
                           relu_bits=self.decision.relu_bits, dropout=self._dropout,
                           batch_offset=self.batch_offset + offset,
                           global_batch=self.global_batch,
                           bias_deferred=self._bias_deferred,
                           relu_bias=self._relu_bias, relu_in_bn=self._relu_in_bn,
                           relu_done=self._relu_done, step_keys=self._step_keys)

    def _need_compute(self, what: str) -> None:
        if not self.compute:
            raise ConfigError(f"{what}() needs an executor that computes; this one was made with "
                              f"compute=False (a dry run): use simulate_step()")
        if self._closed:
            raise ConfigError(f"{what}() on a closed executor")

    def _set_where(self, where: str) -> None:
        self.allocator.current_where = where

    def _sample(self, at, phase: str, layer: str, when: str) -> None:
        self.observer.memory(at, phase, layer, when, self.allocator.in_use,
                             self.manager.resident_bytes)

    def _run(self, ctx, part: str) -> None:
        """Walk the 'forward' or 'backward' part of the step's schedule (memory/schedule.py):
        each layer call with the buffers the manager serves for it (ctx None: dry run, no
        compute)."""
        mm = self.manager
        for call in walk(mm.schedule, mm, part):
            node = self.plan.nodes[call.index]
            self._set_where(f"{call.phase} of {node.name}")
            self._call(call, node, ctx, mm.buffers(call))
        self._set_where("")

    def _call(self, call, node, ctx, buffers) -> None:
        """One layer call with its buffers and its planned workspace block in ctx.workspace,
        then the manager's `after(call)`; timed and sampled when tracing (the end sample sees
        the memory the manager released)."""
        observer, phase, i = self.observer, call.phase, call.index
        if observer:
            t0 = observer.begin_layer(self.device.compute, phase, node.name, i)
            self._sample(t0, phase, node.name, "start")
        workspace = self.manager.acquire_workspace(i, phase)
        scratch = self.manager.acquire_scratch(i, phase)
        if ctx is not None and i in self._row_offsets:   # a chunk's piece: its rows
            ctx = replace(ctx, batch_offset=ctx.batch_offset + self._row_offsets[i])
        if ctx is not None:
            ctx.workspace, ctx.scratch = workspace, scratch
            try:
                # layers/precision.py: the layer itself, in float32 around bf16 maps
                if phase == "forward":
                    xs, y, aux = buffers
                    mixed.forward(node.layer, xs, y, aux, ctx)
                elif phase == "recompute":   # aux None: write the output only
                    xs, y = buffers
                    mixed.forward(node.layer, xs, y, None, ctx)
                else:
                    self._layer_backward(node, buffers, ctx)
            finally:
                ctx.workspace = ctx.scratch = None
        self.manager.release_call_blocks()
        self.manager.after(call)
        if observer:
            t1 = observer.mark(self.device.compute)
            observer.layer(phase, node.name, i, t0, t1)
            self._sample(t1, phase, node.name, "end")

    def _layer_backward(self, node, buffers, ctx) -> None:
        """node's backward; in a micro-batch after the first, and in a piece of a layer chunk
        after the first to run backward (the last piece), the parameter gradients it writes
        go to temporaries (a layer overwrites p.grad) that are then added into p.grad."""
        adds = self._accumulate or (node.piece is not None and node.piece[0] < node.piece[1] - 1)
        params = self._gradients_written(node) if adds else []
        if not params:
            mixed.backward(node.layer, *buffers, ctx)
            return
        held = []
        try:
            for p in params:
                _, buf = self.allocator.empty(p.shape, p.grad.dtype,
                                              f"gradient of {node.name} (summed)")
                tmp = self.maps.view(buf, p.shape, p.grad.dtype)   # laid out as p.grad is
                held.append((p, p.grad, tmp, buf))
                p.grad = tmp
            mixed.backward(node.layer, *buffers, ctx)
            for p, grad, tmp, _ in held:
                self.kernels.add(grad, tmp, grad)
        finally:
            for p, grad, _, buf in held:
                p.grad = grad
                self.allocator.free(buf)

    def _gradients_written(self, node) -> list:
        """The Parameters whose gradient node's backward writes: its own, except a bias that
        the ReLU after it adds, whose gradient that ReLU writes (minidnn/fusion.py)."""
        own = [p for key, p in node.layer.params.items()
               if not (key == "bias" and node.name in self._bias_deferred)]
        fused = self._relu_bias.get(node.name)
        return own + ([fused] if fused is not None else [])

    def _start_step_peak(self) -> None:
        """From here on the allocator's peak is this step's; the overall peak is kept aside."""
        self._peak_before_step = max(self._peak_before_step, int(self.allocator.peak))
        self.allocator.reset_peak()

    def _abort(self) -> None:
        """After an error inside a step: release the step's buffers so the next step starts clean."""
        self._set_where("")
        self.manager.end_step()
        self._in_step = False

    def _micro_slices(self):
        """[(offset, slice of rows)] of the step's passes."""
        b = self.micro_batch
        return [(o, slice(o, o + b)) for o in range(0, self.batch, b)]

    def _step_inputs(self, x, labels):
        """x and labels as arrays, checked against the step's batch."""
        x = x if hasattr(x, "shape") else np.asarray(x, dtype=self.net.dtype)
        labels = labels if hasattr(labels, "shape") else np.asarray(labels)
        self._check_batch(x, labels)
        return x, labels

    def forward(self, x, labels, train: bool = True, keep_outputs: bool = False,
                dropout: bool = True):
        """Run forward; returns the mean loss as a 0-d device array (float() reads it).

        With train=True the step stays open for `backward()`. keep_outputs=True keeps the
        logits so that `outputs()` can read them. dropout=False: dropout layers pass their
        input through in this step (forward and its backward); evaluation never drops. With
        micro-batches, evaluation runs pass by pass; training runs through train_step() or
        accumulate_gradients().
        """
        self._need_compute("forward")
        x, labels = self._step_inputs(x, labels)
        if self.micro_batches == 1:
            return self._forward_pass(x, labels, train, keep_outputs, dropout)
        if train:
            raise ConfigError(f"this executor splits a step into {self.micro_batches} "
                              f"micro-batches: train with train_step() or "
                              f"accumulate_gradients(), which run every pass's backward")
        losses, outputs = [], []
        for offset, rows in self._micro_slices():
            losses.append(self._forward_pass(x[rows], labels[rows], False, keep_outputs,
                                             dropout, offset))
            outputs.append(self._outputs)
        if keep_outputs:
            self._outputs = self.xp.concatenate(outputs)
        return self._mean_of_passes(losses)

    def _mean_of_passes(self, losses):
        """The step's mean loss from its passes' mean losses (equal passes: their mean)."""
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return total / len(losses)

    def _forward_pass(self, x, labels, train: bool, keep_outputs: bool, dropout: bool,
                      offset: int = 0):
        """forward() of one pass: x and labels are rows [offset, offset + micro_batch)."""
        if self._in_step:  # a forward without its backward: drop that step's buffers
            self.manager.end_step()
            self._in_step = False
        mm = self.manager
        self._dropout = bool(dropout)
        self._start_step_peak()
        keep = (self.net.loss_node.name,) + ((self.net.output,) if keep_outputs else ())
        if self.observer:
            self.observer.begin_step(self.step)
        try:
            with self.device.compute:
                mm.begin_step(train, keep, loss_gradient=1.0 / self.micro_batches)
                mm.write_input(DATA, x)
                mm.write_input(LABEL, labels)
                self._run(self._ctx(train, offset), "forward")
                loss = mm.view(self.net.loss_node.name).copy()
                self._outputs = mm.view(self.net.output).copy() if keep_outputs else None
        except BaseException:
            self._abort()
            raise
        self._in_step = train
        if not train:
            mm.end_step()
        return loss

    def backward(self) -> None:
        """Backward of the last training forward: fills every parameter's `.grad`."""
        self._need_compute("backward")
        if not self._in_step:
            raise RuntimeError("backward() needs a forward(..., train=True) before it")
        self._input_grad = self._backward_pass()

    def _backward_pass(self, offset: int = 0):
        """backward() of the open pass (rows from `offset`); a pass after the first adds its
        parameter gradients to p.grad. Returns a copy of the pass's input gradient (None
        unless the plan computes it)."""
        self._accumulate = offset > 0
        input_grad = None
        try:
            with self.device.compute:
                self._run(self._ctx(True, offset), "backward")
                if self.plan.input_grad:  # a copy: end_step gives the buffer back
                    input_grad = self.manager.view(f"grad:{DATA}").copy()
                self.manager.end_step()
        except BaseException:
            self._abort()
            raise
        finally:
            self._accumulate = False
        self._in_step = False
        return input_grad

    def accumulate_gradients(self, x, labels, dropout: bool = True):
        """Forward and backward of the whole batch, pass by pass (one pass without
        micro-batches): every p.grad holds the batch's gradient; returns the batch's mean loss
        (0-d device array). dropout=False: see forward()."""
        self._need_compute("accumulate_gradients")
        x, labels = self._step_inputs(x, labels)
        losses, input_grads = [], []
        with self.kernels.shared_weight_copies():     # the weights hold still until the update
            for offset, rows in self._micro_slices():
                losses.append(self._forward_pass(x[rows], labels[rows], True, False, dropout,
                                                 offset))
                input_grads.append(self._backward_pass(offset))
        if self.plan.input_grad:
            self._input_grad = input_grads[0] if len(input_grads) == 1 else \
                self.xp.concatenate(input_grads)
        return losses[0] if len(losses) == 1 else self._mean_of_passes(losses)

    def train_step(self, x, labels, optimizer, dropout: bool = True):
        """forward, backward (per micro-batch), optimizer update; returns the loss (0-d
        device array). dropout=False: see forward(). On the GPU, a step that can be is
        replayed from a CUDA graph of an earlier one (minidnn/step_graph.py): the same bits,
        one call on the host."""
        loss = None
        if self._graphs is not None and self.observer is None:
            loss = self._graphs.step(x, labels, optimizer, dropout, self.step)
        if loss is None:
            loss = self._step(x, labels, optimizer, dropout)
        self.step += 1
        return loss

    def graph_stats(self) -> dict | None:
        """{'captured': graphs captured, 'captured_at': the steps that were captured (a
        capture step also runs: it is timed with its capture), 'replayed_steps': steps
        launched from them, 'given_up': why captures stopped (None: they did not)}; None
        where no step can be replayed (the CPU, offload without a static layout,
        graphs=False)."""
        g = self._graphs
        return None if g is None else {"captured": g.count, "captured_at": list(g.captured_at),
                                       "replayed_steps": g.replays, "given_up": g.given_up}

    def _step(self, x, labels, optimizer, dropout: bool, step_keys=None):
        """One plain training step (train_step without a graph); returns its loss. step_keys:
        while the step is captured, the table its draws read their keys from."""
        self._step_keys = step_keys
        try:
            loss = self.accumulate_gradients(x, labels, dropout)
            self._set_where("optimizer step")
            with self.device.compute:
                optimizer.step()
        finally:
            self._step_keys = None
            self._set_where("")
        return loss

    def evaluate(self, x, labels):
        """(loss, logits as NumPy) in evaluation mode (dropout off)."""
        loss = self.forward(x, labels, train=False, keep_outputs=True)
        return float(loss), self.outputs()

    def simulate_step(self, train: bool = True) -> dict:
        """Walk one step through the memory manager without computing any layer.

        Allocation, offload, prefetch and release happen exactly as in a real step (on a dry
        executor with receipts instead of memory); returns `memory_stats()`.
        """
        if self._in_step:
            self.manager.end_step()
            self._in_step = False
        mm = self.manager
        self._start_step_peak()
        if self.observer:
            self.observer.begin_step(self.step)
        try:
            with self.device.compute:
                mm.begin_step(train, (self.net.loss_node.name,))  # as forward() keeps it
                mm.write_input(DATA, None)
                mm.write_input(LABEL, None)
                self._run(None, "forward")
                if train:
                    self._run(None, "backward")
                mm.end_step()
        except BaseException:
            self._abort()
            raise
        return self.memory_stats()

    # ---- reading results ---------------------------------------------------------------------
    def outputs(self) -> np.ndarray:
        """Logits (batch, classes), in the network's dtype, of the last forward run with
        keep_outputs=True."""
        if self._outputs is None:
            raise RuntimeError("no outputs kept: call forward(..., keep_outputs=True)")
        return to_numpy(self._outputs).astype(self.net.dtype, copy=False)

    def gradients(self) -> dict[str, np.ndarray]:
        """{'conv1.weight': NumPy array, ...} from the last backward: copies on every device,
        which later steps do not change (the live buffers are `parameters()`' `.grad`)."""
        return {name: np.array(to_numpy(p.grad), order="C", copy=True)
                for name, p in self.net.parameters()}

    def input_gradient(self) -> np.ndarray:
        """d loss / d input batch (batch, C, H, W) from the last backward, as NumPy (needs an
        executor made with input_grad=True)."""
        if not self.plan.input_grad:
            raise ConfigError("input_gradient() needs Executor(..., input_grad=True)")
        if self._input_grad is None:
            raise RuntimeError("no input gradient yet: call backward() first")
        grad = np.ascontiguousarray(to_numpy(self._input_grad))   # NCHW whatever the layout
        return grad.astype(self.net.dtype, copy=False)

    def parameters(self):
        """[(name, Parameter)] with data and grad on this device."""
        return self.net.parameters()

    def settled_in_use(self) -> int:
        """Device bytes in use once every copy in flight has finished.

        Synchronizes the device and lets the allocator take back blocks that were freed behind
        copies (it does so lazily, at its next allocation). For checks and benchmarks (does
        every step return to the same level?), not for the hot path.
        """
        self.device.synchronize()
        probe = self.allocator.alloc(1, "settled_in_use")  # an alloc reclaims finished frees
        self.allocator.free(probe)
        return int(self.allocator.in_use)

    def memory_stats(self) -> dict:
        """Memory figures; per-step ones are of the last step (of its last pass, with
        micro-batches: every pass is alike).

        peak_device_bytes: highest bytes in the device allocator since this executor was made
        (everything it holds: parameters, gradients, optimizer state, feature maps, and on the
        GPU workspaces and temporaries). steady_peak_device_bytes: the same during the last
        step only (from its forward to its optimizer update), which leaves out the first step's
        measuring of convolution plans. peak_/avg_feature_map_bytes: feature maps + aux +
        gradient maps on the device, highest and mean over the layer calls of the step.
        offloaded_bytes / prefetched_bytes: copied to host / back (on-demand fetches included).
        network_wide_bytes: every feature map, aux and gradient buffer allocated for the whole
        step (the allocation vDNN compares against); liveness_peak_bytes: the peak when each
        buffer lives exactly from its first write to its last read, nothing offloaded.
        offload_storages / recompute_storages: how many maps the decision offloads / drops
        after forward and rebuilds in backward; recompute_bytes: the bytes of the latter.
        """
        st = self.manager.stats
        frag = self.allocator.fragmentation()
        return {
            "peak_device_bytes": max(self._peak_before_step, int(self.allocator.peak)),
            "steady_peak_device_bytes": int(self.allocator.peak),
            "device_in_use_bytes": int(self.allocator.in_use),
            "memory_budget_bytes": self.memory_budget,
            "peak_feature_map_bytes": int(st.peak_feature_map_bytes),
            "avg_feature_map_bytes": float(st.avg_feature_map_bytes),
            "offloaded_bytes": int(st.offloaded_bytes),
            "prefetched_bytes": int(st.prefetched_bytes),
            "on_demand_fetches": int(st.on_demand_fetches),
            "on_demand_bytes": int(st.on_demand_bytes),
            "deferred_prefetches": int(st.deferred_prefetches),
            "network_wide_bytes": int(self.plan.network_wide_bytes()),
            "liveness_peak_bytes": int(self.plan.liveness_peak_bytes()),
            "host_peak_bytes": int(getattr(self.host, "peak", 0)),
            "fragmentation": float(frag),
            "policy": self.decision.policy,
            "micro_batches": self.micro_batches,
            "offload_storages": len(self.decision.offload),
            "recompute_storages": len(self.decision.recompute),
            "recompute_bytes": sum(self.plan.storages[sid].nbytes
                                   for sid in self.decision.recompute),
            "layout_bytes": int(self.layout.size) if self.layout else None,
            "layout_live_peak_bytes": int(self.layout.live_peak()) if self.layout else None,
            "unplanned_blocks": int(getattr(self.manager.blocks, "unplanned", 0)),
        }
