"""The executor: runs forward and backward of a network layer by layer on one device.

It owns the step's order and nothing else: every buffer comes from the memory manager, every
number from a layer. This is the Python API the training loop and the CLI are built on:

    net = models.build("alexnet", num_classes=10, image_size=64)
    ex = Executor(net, batch=32, device="auto", seed=0, policy="all", memory_budget="4GiB")
    loss = ex.forward(x, labels)          # x: (32, 3, 64, 64) float32, labels: (32,) int
    ex.backward()
    grads = ex.gradients()                # {'conv1.weight': ndarray, ...}
    ex.memory_stats()                     # peak device bytes, offloaded bytes, ...

Memory: everything on the device comes out of one allocator. On the GPU that is always an
Arena (of the budget, or of the free memory when no budget is given) with CuPy's allocator
routed into it for the executor's lifetime, so parameters, gradients, optimizer state, cuDNN
workspaces and temporaries are all counted; on the CPU, the arena when a budget is given and a
counting SimpleAllocator otherwise, with parameters and gradients drawn from it as well.

Dry run: `Executor(..., compute=False).simulate_step()` walks a whole step through the memory
manager with receipts instead of memory and no layer compute, so the memory figures of networks
far larger than this machine come out in seconds (parameters and gradients are counted;
temporaries inside layers and optimizer state are not).
"""
from __future__ import annotations

import numpy as np

from . import kernels
from .backend import Device, select_device, to_numpy
from .errors import ConfigError, DataError, ShapeError, parse_bytes
from .layers.base import StepContext
from .memory.allocator import CountingAllocator
from .memory.arena import make_allocator
from .memory.host import HostSlab
from .memory.layout import PlannedBlocks, StaticLayout
from .memory.manager import MemoryManager
from .memory.plan import LivenessPlan
from .memory.policy import CALL_PHASES, get_policy, use_relu_bits
from .network import DATA, LABEL, Network


class Executor:
    """Training and evaluation steps of `net` at a fixed batch size on one device.

    memory_budget: bytes (int or '12GiB') for everything on the device, or None.
    policy: 'none' | 'all' | 'conv' | 'dyn' (planned for the budget; minidnn/planner) or a
    memory.policy.Policy. prefetch_lookahead: layers ahead that backward brings offloaded
    maps back (0: only on demand). trace: keep a trace.Tracer in `self.tracer`.
    compute=False: dry run (simulate_step only).
    static_layout: place every feature-map block at an address planned before step one
    (memory/layout.py; no fragmentation, a known peak) instead of allocating it at run time.
    None (default): planned when a memory budget is given, where fragmentation can make a
    step fail; without a budget, run-time allocation lets workspaces reuse feature-map bytes
    across the step, which gives a lower peak.
    relu_bits: ReLUs whose output no other layer keeps for backward keep one bit per value
    instead (layers/relu.py; lossless), so that map is free after forward.
    host_limit: bytes of pinned host memory for offloaded maps (None: no limit).
    math / deterministic: passed to the GPU kernels' `configure` when given (a setting of
    the kernel module, so it stays in force for later executors too).
    batch_offset / global_batch: this executor's batch is rows batch_offset .. batch_offset
    + batch of a larger global batch (one rank's share in data-parallel training); layers that
    draw per row (dropout) draw for the global batch and use these rows. Default: the batch
    is the whole batch.

    Backward hooks: `backward_hooks` is a list of callables `hook(i)`, each called after the
    backward of node i (of `plan.nodes`) has run (on a GPU: has been issued on the compute
    stream), when the gradients of that node's parameters are final for the step. Data
    parallelism starts the all-reduce of a bucket of gradients there (distributed/buckets.py).

    Parameters move to the device here; `net.state_dict()` reads them back; `close()` brings
    them back to host memory and releases the device memory.
    """

    def __init__(self, net: Network, batch: int, device: str | Device = "auto", seed: int = 0,
                 memory_budget: int | str | None = None, policy="none",
                 prefetch_lookahead: int = 1, trace: bool = False, compute: bool = True,
                 host_limit: int | str | None = None, math: str | None = None,
                 deterministic: bool | None = None, static_layout: bool | None = None,
                 relu_bits: bool = False, batch_offset: int = 0,
                 global_batch: int | None = None):
        self.net = net
        self.batch = int(batch)
        self.batch_offset = int(batch_offset)
        self.global_batch = self.batch if global_batch is None else int(global_batch)
        if not 0 <= self.batch_offset <= self.global_batch - self.batch:
            raise ConfigError(f"rows {self.batch_offset}..{self.batch_offset + self.batch} do "
                              f"not lie in a global batch of {self.global_batch}")
        self.backward_hooks: list = []   # hook(i) after node i's backward (see the class doc)
        self.device = device if isinstance(device, Device) else select_device(device)
        self.xp = self.device.xp
        self.seed = int(seed)
        self.compute = bool(compute)
        if isinstance(memory_budget, str):
            memory_budget = parse_bytes(memory_budget)
        if isinstance(host_limit, str):
            host_limit = parse_bytes(host_limit)
        if prefetch_lookahead is None or int(prefetch_lookahead) < 0:
            raise ConfigError(f"prefetch_lookahead must be a number of layers >= 0, "
                              f"got {prefetch_lookahead!r}")
        self.memory_budget = memory_budget
        self.kernels = kernels.for_device(self.device)
        if (math is not None or deterministic is not None) and hasattr(self.kernels, "configure"):
            opts = {k: v for k, v in (("math", math), ("deterministic", deterministic))
                    if v is not None}
            self.kernels.configure(**opts)
        # Settings of the network's layers that this executor changes while it lives (ReLU
        # masks, the decision's convolution plans); close() gives them back, so a later
        # executor of the same network starts from the layers' own settings.
        self._own_keeps = {n.name: n.layer.keep for n in net.nodes if n.layer.kind == "relu"}
        self._own_plan_settings = {n.name: n.layer.plan_setting for n in net.nodes
                           if n.layer.kind == "conv"}
        self.host = self._make_host(host_limit)
        self._routed = False
        self._held_bufs: list = []
        self._host_params: list = []   # (parameter, its host values) before they moved here
        self.allocator = None
        try:  # from here on, a failure must give the layers, device memory and CuPy back
            if relu_bits:
                use_relu_bits(net)
            self.plan = LivenessPlan(net, self.batch)
            self.policy = get_policy(policy)
            if static_layout is None:
                static_layout = memory_budget is not None
            if hasattr(self.policy, "bind"):  # a planning policy learns what it plans for
                self.policy.bind(device=self.device, prefetch_lookahead=int(prefetch_lookahead),
                                 static_layout=static_layout)
            self.decision = self.policy.decide(self.plan, memory_budget)
            for name, setting in self.decision.conv_algo.items():
                net.node(name).layer.plan_setting = setting
            if self.decision.prefetch_lookahead is not None:  # the policy chose it
                prefetch_lookahead = self.decision.prefetch_lookahead
            self.prefetch_lookahead = int(prefetch_lookahead)
            self.allocator = self._make_allocator(memory_budget)
            self._place_parameters()
            self.layout = None
            # Workspaces are planned blocks only inside a static layout.
            workspace = self._workspace_blocks() if static_layout else {}
            blocks = self._plan_layout(self.prefetch_lookahead, workspace) if static_layout \
                else None
            self.manager = MemoryManager(self.plan, self.device, self.allocator, host=self.host,
                                         offload=self.decision.offload,
                                         prefetch_lookahead=self.prefetch_lookahead,
                                         dry=not self.compute, blocks=blocks,
                                         workspace=workspace,
                                         recompute=self.decision.recompute)
        except BaseException:
            for p, values in self._host_params:  # not views into memory about to go away
                p.data, p.grad = values, None
            self._restore_layers()
            if self.allocator is not None:
                self._release_device_memory()
            raise
        self._host_params = []
        self.tracer = None
        if trace:
            self.enable_trace()
        self.step = 0                  # steps taken; seeds dropout, so resume replays it
        self._peak_before_step = 0     # allocator peak before the current step's reset
        self._outputs = None
        self._in_step = False
        self._closed = False

    # ---- memory set-up ----------------------------------------------------------------------------
    def _make_allocator(self, budget):
        """The dry run counts receipts; otherwise an Arena (GPU, or any budget) with CuPy's
        allocator routed into it, or a counting SimpleAllocator on a CPU without a budget."""
        if not self.compute:
            return CountingAllocator(budget)
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
            for name, p in params:
                for what in ("parameter", "gradient of"):
                    self._held_bufs.append(self.allocator.alloc(
                        int(np.prod(p.shape, dtype=np.int64)) * self.net.dtype.itemsize,
                        f"{what} {name}"))
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
            data, buf = self.allocator.empty(p.shape, self.net.dtype, f"parameter {name}")
            self._held_bufs.append(buf)
            grad, gbuf = self.allocator.empty(p.shape, self.net.dtype, f"gradient of {name}")
            self._held_bufs.append(gbuf)
            if self.device.is_gpu:
                with self.device.compute:
                    data.set(values, stream=self.device.compute)
                    grad.fill(0)
            else:
                data[...] = values
                grad.fill(0)
            p.data, p.grad = data, grad

    def _workspace_blocks(self) -> dict:
        """{(node index, phase): bytes} of the decision's planned workspaces."""
        index = {node.name: i for i, node in enumerate(self.plan.nodes)}
        blocks = {}
        for (name, phase), nbytes in self.decision.workspace.items():
            if name not in index or phase not in CALL_PHASES:
                raise ConfigError(f"memory decision plans a workspace for {name!r} ({phase}), "
                                  f"which is not a layer call of network {self.net.name!r}")
            if int(nbytes) > 0:
                blocks[(index[name], phase)] = int(nbytes)
        return blocks

    def _plan_layout(self, lookahead: int, workspace: dict):
        """Record one step's blocks (and planned workspaces), pack them (memory/layout.py), and
        take the region for them from the allocator now, so that a budget too small fails
        before step one."""
        keep = (self.net.loss_node.name, self.net.output)
        self.layout = StaticLayout.for_step(self.plan, self.decision.offload, lookahead, keep,
                                            workspace, self.decision.recompute)
        buf = self.allocator.alloc(self.layout.size, "feature maps (static layout)")
        self._held_bufs.append(buf)
        # A dry run only counts: its blocks are views of an empty array.
        region = buf if self.compute else np.empty(0, np.uint8)
        return PlannedBlocks(self.layout, region, self.allocator)

    def _restore_layers(self) -> None:
        """Give the layers back the settings this executor changed (conv plans, ReLU masks)."""
        for name, setting in self._own_plan_settings.items():
            self.net.node(name).layer.plan_setting = setting
        for name, keep in self._own_keeps.items():
            self.net.node(name).layer.keep = keep

    def _release_device_memory(self) -> None:
        for buf in self._held_bufs:
            self.allocator.free(buf)
        self._held_bufs = []
        if self._routed:
            self.allocator.uninstall()
            self._routed = False
        if hasattr(self.allocator, "close"):
            self.allocator.close()

    def close(self) -> None:
        """Bring parameters back to host memory (NumPy) and release all device memory."""
        if self._closed:
            return
        self.manager.close()
        self.device.synchronize()
        if self.compute:
            for _, p in self.net.parameters():
                p.data = np.array(to_numpy(p.data), copy=True)
                p.grad = None
        self._release_device_memory()
        if hasattr(self.host, "close"):
            self.host.close()
        self._restore_layers()
        self._host_params = []
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def enable_trace(self, on: bool = True, max_steps: int | None = None):
        """Start (or stop) recording a trace.Tracer in `self.tracer`; returns it."""
        if on:
            from .trace import Tracer
            self.tracer = Tracer(self.device, max_steps=max_steps)
        else:
            self.tracer = None
        self.manager.tracer = self.tracer
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

    def _ctx(self, train: bool) -> StepContext:
        return StepContext(self.xp, kernels=self.kernels, train=train, step=self.step,
                           seed=self.seed, device=self.device, batch_offset=self.batch_offset,
                           global_batch=self.global_batch)

    def _need_compute(self, what: str) -> None:
        if not self.compute:
            raise ConfigError(f"{what}() needs an executor that computes; this one was made with "
                              f"compute=False (a dry run): use simulate_step()")
        if self._closed:
            raise ConfigError(f"{what}() on a closed executor")

    def _set_where(self, where: str) -> None:
        self.allocator.current_where = where

    def _sample(self, at, phase: str, layer: str, when: str) -> None:
        self.tracer.memory(at, phase, layer, when, self.allocator.in_use,
                           self.manager.resident_bytes)

    def _run_forward(self, ctx) -> None:
        """The forward loop (ctx None: dry run, no compute)."""
        mm = self.manager
        for i, node in enumerate(self.plan.nodes):
            self._set_where(f"forward of {node.name}")
            xs, y, aux = mm.forward_buffers(i)
            self._call("forward", i, ctx, ctx and (lambda: node.layer.forward(xs, y, aux, ctx)),
                       mm.after_forward)
        self._set_where("")

    def _run_backward(self, ctx) -> None:
        """The backward loop, in reverse order (ctx None: dry run, no compute); before a
        layer's backward, the forward of the layers whose dropped outputs it reads first."""
        mm = self.manager
        for i in reversed(range(len(self.plan.nodes))):
            for j in mm.recompute_before(i):
                writer = self.plan.nodes[j]
                self._set_where(f"recompute of {writer.name}")
                xs, y = mm.recompute_buffers(j)
                self._call("recompute", j, ctx,
                           ctx and (lambda: writer.layer.forward(xs, y, None, ctx)),
                           lambda j: None)
            node = self.plan.nodes[i]
            self._set_where(f"backward of {node.name}")
            xs, y, gy, gxs, aux = mm.backward_buffers(i)
            self._call("backward", i, ctx,
                       ctx and (lambda: node.layer.backward(xs, y, gy, gxs, aux, ctx)),
                       mm.after_backward)
            if ctx is not None:
                for hook in self.backward_hooks:
                    hook(i)
        self._set_where("")

    def _call(self, phase: str, i: int, ctx, run, after) -> None:
        """One layer call: `run` (None in a dry run) with its planned workspace block in
        ctx.workspace, then the manager's `after(i)`; timed and sampled when tracing (the end
        sample sees the memory the manager released)."""
        tracer = self.tracer
        name = self.plan.nodes[i].name
        if tracer:
            t0 = tracer.mark(self.device.compute)
            self._sample(t0, phase, name, "start")
        workspace = self.manager.acquire_workspace(i, phase)
        if run is not None:
            ctx.workspace = workspace
            try:
                run()
            finally:
                ctx.workspace = None
        self.manager.release_workspace()
        after(i)
        if tracer:
            t1 = tracer.mark(self.device.compute)
            tracer.layer(phase, name, i, t0, t1)
            self._sample(t1, phase, name, "end")

    def _start_step_peak(self) -> None:
        """From here on the allocator's peak is this step's; the overall peak is kept aside."""
        self._peak_before_step = max(self._peak_before_step, int(self.allocator.peak))
        self.allocator.reset_peak()

    def _abort(self) -> None:
        """After an error inside a step: release the step's buffers so the next step starts clean."""
        self._set_where("")
        self.manager.end_step()
        self._in_step = False

    def forward(self, x, labels, train: bool = True, keep_outputs: bool = False):
        """Run forward; returns the mean loss as a 0-d device array (float() reads it).

        With train=True the step stays open for `backward()`. keep_outputs=True keeps the
        logits so that `outputs()` can read them.
        """
        self._need_compute("forward")
        x = x if hasattr(x, "shape") else np.asarray(x, dtype=self.net.dtype)
        labels = labels if hasattr(labels, "shape") else np.asarray(labels)
        self._check_batch(x, labels)
        if self._in_step:  # a forward without its backward: drop that step's buffers
            self.manager.end_step()
            self._in_step = False
        mm = self.manager
        self._start_step_peak()
        keep = (self.net.loss_node.name,) + ((self.net.output,) if keep_outputs else ())
        if self.tracer:
            self.tracer.begin_step(self.step)
        try:
            with self.device.compute:
                mm.begin_step(train, keep)
                mm.write_input(DATA, x)
                mm.write_input(LABEL, labels)
                self._run_forward(self._ctx(train))
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
        try:
            with self.device.compute:
                self._run_backward(self._ctx(True))
                self.manager.end_step()
        except BaseException:
            self._abort()
            raise
        self._in_step = False

    def train_step(self, x, labels, optimizer):
        """forward, backward, optimizer update; returns the loss (0-d device array)."""
        loss = self.forward(x, labels, train=True)
        self.backward()
        self._set_where("optimizer step")
        with self.device.compute:
            optimizer.step()
        self._set_where("")
        self.step += 1
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
        if self.tracer:
            self.tracer.begin_step(self.step)
        try:
            with self.device.compute:
                mm.begin_step(train, (self.net.loss_node.name,))  # as forward() keeps it
                mm.write_input(DATA, None)
                mm.write_input(LABEL, None)
                self._run_forward(None)
                if train:
                    self._run_backward(None)
                mm.end_step()
        except BaseException:
            self._abort()
            raise
        return self.memory_stats()

    # ---- reading results ---------------------------------------------------------------------
    def outputs(self) -> np.ndarray:
        """Logits (batch, classes) of the last forward run with keep_outputs=True."""
        if self._outputs is None:
            raise RuntimeError("no outputs kept: call forward(..., keep_outputs=True)")
        return to_numpy(self._outputs)

    def gradients(self) -> dict[str, np.ndarray]:
        """{'conv1.weight': NumPy array, ...} from the last backward."""
        return {name: to_numpy(p.grad) for name, p in self.net.parameters()}

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
        """Memory figures; per-step ones are of the last step.

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
        """
        st = self.manager.stats
        frag = self.allocator.fragmentation() if hasattr(self.allocator, "fragmentation") else 0.0
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
            "policy": self.policy.name,
            "offload_storages": len(self.decision.offload),
            "layout_bytes": int(self.layout.size) if self.layout else None,
            "layout_live_peak_bytes": int(self.layout.live_peak()) if self.layout else None,
            "unplanned_blocks": int(getattr(self.manager.blocks, "unplanned", 0)),
        }
