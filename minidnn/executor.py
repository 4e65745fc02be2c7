"""The executor: runs forward and backward of a network layer by layer on one device.

It runs a decision made before it is built (what to keep, offload or recompute, each
convolution's plan setting, the ReLU bit masks, the prefetch lookahead: minidnn/decide.py
makes it from a policy name and a budget) and decides nothing itself: every buffer comes from
the memory manager, every number from a layer. This is the Python API the training loop and
the CLI are built on:

    net = models.build("alexnet", num_classes=10, image_size=64)
    spec = StepSpec(batch=32, policy="all", memory_budget="4GiB")     # minidnn/spec.py
    decision = decide(net, spec)                                        # minidnn/decide.py
    ex = Executor(net, spec, decision, device="auto", seed=0)
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
partial sums, each over 64 images, but a fully connected layer's that the decision gathers,
one sum over the batch: minidnn/gathered.py; the reported loss is the mean of 4 means), and
whatever a kernel computes differently at another batch size (a BLAS or cuDNN algorithm
chosen by shape); so split and unsplit steps agree to rounding, and a split step repeats bit
for bit. Under `deterministic=True` nothing does: the layers compute in fixed slices of the
batch and sum them in one order, and the passes run last to first (layers/slices.py), so
every count and layer chunk gives the same bits; a split into parts smaller than a slice is refused.

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
blocks of calls are counted: random draws, and bf16 maps widened to float32; other
temporaries inside layers and optimizer state are not).
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np

from .assembly import SET_UP, Assembly, resolve_spec
from .backend import Device, to_numpy
from .errors import ConfigError, DataError, ShapeError
from .kernels.mapformat import copy_values
from .layers import precision as mixed
from .layers.base import StepContext
from .layers.slices import pairwise_sum, row_slices
from .memory.observer import ObserverGroup
from .memory.plan import grad_name
from .memory.policy import NO_DECISION, MemoryDecision
from .memory.schedule import walk
from .network import DATA, LABEL, Network
from .spec import StepSpec
from .step_graph import step_graphs


def check_step_inputs(net: Network, plan, batch: int, x, labels) -> None:
    """x (batch, C, H, W) and labels (batch,) integers below the classes of `net` (its
    `plan` says how many); ShapeError or DataError otherwise."""
    want = (batch,) + net.input_shape
    if tuple(x.shape) != want:
        raise ShapeError(f"input 'data' of network {net.name!r} must have shape {want} "
                         f"(batch, channels, height, width), got {tuple(x.shape)}")
    if tuple(labels.shape) != (batch,):
        raise ShapeError(f"input 'label' must have shape ({batch},), "
                         f"got {tuple(labels.shape)}")
    if isinstance(labels, np.ndarray):  # device labels come from our own generators
        if not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"labels must be integers, got dtype {labels.dtype}")
        k = plan.tensors[net.output].shape[-1]
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            bad = labels[(labels < 0) | (labels >= k)][0]
            raise DataError(f"label {bad} is out of range: network {net.name!r} has "
                            f"{k} classes (labels 0..{k - 1})")


def mean_of_passes(losses):
    """The step's mean loss from its passes' mean losses (equal passes: their mean), summed
    as a balanced tree (layers/slices.pairwise_sum: a deterministic step's loss has the same
    bits however it is split)."""
    return pairwise_sum(losses) / len(losses)


class Executor:
    """Training and evaluation steps of `net` for one StepSpec on one device.

    spec: the StepSpec (minidnn/spec.py: batch, budget, static layout, ranks' rows, graphs,
    math, deterministic, ...), or a batch size with the spec's fields as keywords
    (`settings`, filled in from the decision's spec where it has one). decision: the
    finished memory.policy.MemoryDecision to run (minidnn/decide.py; None: keep every map,
    prefetch one layer ahead); one made for another spec is refused. Its conv plan settings,
    ReLU bit masks and fused pairs reach the layers through the StepContext; the layers keep
    their own. Its `micro_batches` runs each training step as that many passes, gradients
    accumulated, one optimizer update; its `layout` and `precision` say how feature maps are
    stored (kernels/mapformat.py, layers/precision.py). trace: keep a trace.Tracer in
    `self.tracer`. compute=False: a dry run (simulate_step only). host_limit: bytes of pinned
    host memory for offloaded maps (None: no limit). input_grad: also compute d loss / d
    input batch (`input_gradient()`). An Assembly (minidnn/assembly.py) sets up everything
    before a step: parameters move to the device there; `close()` brings them back.
    """

    def __init__(self, net: Network, spec: StepSpec | int, decision: MemoryDecision | None = None,
                 device: str | Device = "auto", seed: int = 0, trace: bool = False,
                 compute: bool = True, host_limit: int | str | None = None,
                 input_grad: bool = False, **settings):
        decision = NO_DECISION if decision is None else decision
        spec = resolve_spec(spec, decision, settings)
        self._start(Assembly(net, spec, decision, device, seed, compute, host_limit,
                             input_grad), trace)

    @classmethod
    def assembled(cls, setup: Assembly, trace: bool = False) -> Executor:
        """An executor of what `setup` (minidnn/assembly.py) set up: the planner's dry runs
        assemble theirs with a recording allocator and shared plans (DryParts)."""
        ex = cls.__new__(cls)
        ex._start(setup, trace)
        return ex

    def _start(self, setup: Assembly, trace: bool) -> None:
        """Take what `setup` made (the executor runs with it) and start with no step."""
        self.setup = setup
        for name in SET_UP:
            setattr(self, name, getattr(setup, name))
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
        # bn_grad: (batch norm node index, its add's gradient, the GradientSums the add took
        # of it (bn_sums) or None)
        self._handed = None
        self._gathered_rows = {}       # while a split step runs: gathered.py's rows
        self._graphs = step_graphs(self, setup) if self.spec.graphs else None

    def close(self) -> None:
        """Bring parameters back to host memory (NumPy) and release all device memory."""
        if self._closed:
            return
        if self._graphs is not None:
            self._graphs.close()
            self._graphs = None     # it refers back to this executor (its plain step)
        self.manager.close()
        self.device.synchronize()
        self.setup.release()
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

    def enable_trace(self, on: bool = True, max_steps: int | None = None, hold: bool = False):
        """Start (or stop) recording a trace.Tracer in `self.tracer`; returns it. hold: a held
        trace, each layer call's span the device's time for it (trace.py)."""
        if on:
            from .trace import Tracer
            self.tracer = Tracer(self.device, max_steps=max_steps, budget=self.memory_budget,
                                 hold=hold)
        else:
            self.tracer = None
        self.watch(self.tracer)
        return self.tracer

    # ---- one step -------------------------------------------------------------------------------
    def _ctx(self, train: bool, offset: int = 0) -> StepContext:
        return StepContext(self.xp, kernels=self.kernels, train=train, step=self.step,
                           seed=self.seed, device=self.device,
                           conv_plans=self.decision.conv_algo,
                           relu_bits=self.decision.relu_bits, dropout=self._dropout,
                           batch_offset=self.batch_offset + offset,
                           global_batch=self.global_batch, maps=self.maps,
                           bias_deferred=self._bias_deferred, relu_in_add=self._relu_in_add,
                           relu_bias=self._relu_bias, relu_in_bn=self._relu_in_bn,
                           relu_in_conv=self._relu_in_conv,
                           relu_forward_done=self._relu_forward_done,
                           relu_done=self._relu_done, add_in_bn=self._add_in_bn,
                           add_done=self._add_done, relu_in_pool=self._relu_in_pool,
                           relu_mask_done=self._relu_mask_done,
                           relu_before_pool=self._relu_before_pool, pool_bias=self._pool_bias,
                           bias_in_pool=self._bias_in_pool, step_keys=self._step_keys,
                           add_grad_to=self._add_grad_to,
                           batch_slice=self.batch_slice, statistics_slice=self.statistics_slice)

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

    def _begin_call(self, phase: str, name: str, i: int):
        """The observer is told a layer call starts (callers ask only when there is one):
        its start mark, after a memory sample."""
        t0 = self.observer.begin_layer(self.device.compute, phase, name, i)
        self._sample(t0, phase, name, "start")
        return t0

    def _end_call(self, phase: str, name: str, i: int, t0) -> None:
        """... and that it ended (timed from t0), with a memory sample."""
        t1 = self.observer.mark(self.device.compute)
        self.observer.layer(phase, name, i, t0, t1)
        self._sample(t1, phase, name, "end")

    def _call(self, call, node, ctx, buffers) -> None:
        """One layer call with its buffers and its planned workspace block in ctx.workspace,
        then the manager's `after(call)`; observed (the end sample sees the memory the
        manager released)."""
        observer, phase, i = self.observer, call.phase, call.index
        if observer:
            t0 = self._begin_call(phase, node.name, i)
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
                    buffers, ctx = self._handed_gradient(i, buffers, ctx)
                    addend = self.manager.addend(i)   # a gradient sum the add takes over
                    self._layer_backward(node, buffers, ctx if addend is None else
                                         replace(ctx, gy_addend=addend))
            finally:
                ctx.workspace = ctx.scratch = None
        self.manager.release_call_blocks()
        self.manager.after(call)
        if observer:
            self._end_call(phase, node.name, i, t0)

    def _handed_gradient(self, i: int, buffers, ctx):
        """The backward buffers (xs, y, gy, gxs, aux) and StepContext of node i, where the
        decision's bn_grad (minidnn/fusion.py) hands a gradient on: an add's masked gradient,
        written to one input's gradient alone (StepContext.add_grad_to), is the gy of the
        batch norm whose backward comes next, which writes its own gradient over the buffer
        it would have read. Where the decision's bn_sums says so, the add also takes that
        batch norm's sums of it (StepContext.gradient_sums, for both calls), reading the
        batch norm's input, which the step keeps on the device until then."""
        if i in self._grad_handed:                       # the add: what it writes
            xs, y, gy, gxs, aux = buffers
            k, bn = self._grad_handed[i]
            sums = None
            if bn in self._sums_handed:
                node = self.plan.nodes[bn]
                mean = dict(self.plan.aux_tensors(bn))["mean"]
                sums = node.layer.gradient_sums(self.manager.resident_view(node.inputs[0]),
                                                self.manager.resident_view(mean), ctx)
                ctx = replace(ctx, gradient_sums=sums)
            self._handed = (bn, gy if gxs[k] is None else gxs[k], sums)
        elif self._handed is not None and self._handed[0] == i:   # its batch norm
            xs, y, _, gxs, aux = buffers
            _, gy, sums = self._handed
            buffers, self._handed = (xs, y, gy, gxs, aux), None
            if sums is not None:
                ctx = replace(ctx, gradient_sums=sums)
        return buffers, ctx

    def _layer_backward(self, node, buffers, ctx) -> None:
        """node's backward; in a micro-batch after the first, and in a piece of a layer chunk
        after the first to run backward (the last piece), the parameter gradients it writes
        are added into p.grad: by the layer itself where it adds in place (its
        `adds_in_place`), else written to temporaries (a layer overwrites p.grad) that are
        then added here."""
        if node.name in self._gathered_rows:
            self._gather_rows(node, buffers, ctx)
            return
        adds = self._accumulate or (node.piece is not None and node.piece[0] < node.piece[1] - 1)
        if self.batch_slice is not None:    # the layer adds slice by slice (layers/slices.py)
            mixed.backward(node.layer, *buffers, replace(ctx, add_grads=adds) if adds else ctx)
            return
        if adds and node.layer.adds_in_place:
            ctx = replace(ctx, add_grads=True)
        params = self._gradients_apart(node) if adds else []
        if not params:
            mixed.backward(node.layer, *buffers, ctx)
            return
        held = []
        try:
            with self.allocator.lasting():     # they outlive this call: kept apart
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

    def _gather_rows(self, node, buffers, ctx) -> None:
        """A gathered layer's backward in one pass (minidnn/gathered.py): its input and its
        output gradient copied into their rows of the step's, its input gradient written."""
        xs, _, gy, _, _ = buffers
        x_all, gy_all = self._gathered_rows[node.name]
        start = ctx.batch_offset - self.batch_offset
        rows = slice(start, start + gy.shape[0])
        copy_values(x_all[rows], xs[0])
        copy_values(gy_all[rows], gy)
        mixed.backward(node.layer, *buffers, replace(ctx, params_gathered=True))

    @contextlib.contextmanager
    def _gathering(self):
        """Inside, in a step of several passes, `_gathered_rows` holds {gathered node name:
        (its input (batch, in), its output gradient (batch, out))}, the step's rows of each
        (minidnn/gathered.py), in the maps' dtype, kept apart, to the body's end;
        `_gathered_gradients` writes the parameter gradients from them."""
        if self.micro_batches == 1 or not self._gathered:
            yield
            return
        dtype = self.maps.map_dtype(self.net.dtype)
        taken = []
        try:
            with self.allocator.lasting():
                for node in self._gathered.values():
                    pair = []
                    for what, tensor in (("input", node.inputs[0]),
                                         ("output gradient", node.name)):
                        shape = (self.batch,) + tuple(self.plan.tensors[tensor].shape[1:])
                        rows, buf = self.allocator.empty(shape, dtype,
                                                         f"{what} of {node.name} (gathered)")
                        taken.append(buf)
                        pair.append(rows)
                    self._gathered_rows[node.name] = tuple(pair)
            yield
        finally:
            self._gathered_rows = {}
            for buf in taken:
                self.allocator.free(buf)

    def _gathered_gradients(self) -> None:
        """After a step's last pass: each gathered layer's parameter gradients from its
        rows of every pass, in one backward call over the step's batch (no input gradient),
        as an unsplit step writes them; the observer is told of it as one more backward
        call of the layer (data parallelism's buckets wait for it: distributed/buckets.py)."""
        ctx, observer = self._ctx(True), self.observer
        for i, node in self._gathered.items():
            x_all, gy_all = self._gathered_rows[node.name]
            self._set_where(f"gathered gradients of {node.name}")
            if observer:
                t0 = self._begin_call("backward", node.name, i)
            mixed.backward(node.layer, [x_all], None, gy_all, [None], None, ctx)
            if observer:
                self._end_call("backward", node.name, i, t0)
        self._set_where("")

    def _gradients_apart(self, node) -> list:
        """The Parameters whose gradient node's backward writes, and, to add it, writes apart
        from p.grad: its own, but those it adds in place (the layer's `adds_in_place`) and a
        bias that the ReLU after it adds, whose gradient that ReLU writes, or the max pool
        after the ReLU (minidnn/fusion.py)."""
        own = [p for key, p in node.layer.params.items()
               if key not in node.layer.adds_in_place
               and not (key == "bias" and node.name in self._bias_deferred)]
        fused = self._pool_bias.get(node.name)
        if fused is None and node.name not in self._bias_in_pool:
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
        return [(s.start, s) for s in row_slices(self.batch, self.micro_batch)]

    def _training_passes(self):
        """_micro_slices in the order a training step runs them: last to first under
        deterministic mode, the order in which backward meets the slices of a chunk's
        pieces (layers/slices.py: in_order)."""
        passes = self._micro_slices()
        return passes if self.batch_slice is None else passes[::-1]

    def _step_inputs(self, x, labels):
        """x and labels as arrays, checked against the step's batch."""
        x = x if hasattr(x, "shape") else np.asarray(x, dtype=self.net.dtype)
        labels = labels if hasattr(labels, "shape") else np.asarray(labels)
        check_step_inputs(self.net, self.plan, self.batch, x, labels)
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
        if not train:
            self._leave_graphs()
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
        return mean_of_passes(losses)

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

    def _backward_pass(self, offset: int = 0, accumulate: bool = False):
        """backward() of the open pass (rows from `offset`); accumulate: a pass after the
        first, which adds its parameter gradients to p.grad. Returns a copy of the pass's
        input gradient (None unless the plan computes it)."""
        self._accumulate = accumulate
        input_grad = None
        try:
            with self.device.compute:
                self._run(self._ctx(True, offset), "backward")
                if self.plan.input_grad:  # a copy: end_step gives the buffer back
                    input_grad = self.manager.view(grad_name(DATA)).copy()
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
        # The weights hold still until the update; their copies last the batch (kept apart).
        with self.kernels.shared_weight_copies(self.allocator.lasting), self._gathering():
            for n, (offset, rows) in enumerate(self._training_passes()):
                losses.append(self._forward_pass(x[rows], labels[rows], True, False, dropout,
                                                 offset))
                input_grads.append((offset, self._backward_pass(offset, accumulate=n > 0)))
            with self.device.compute:
                self._gathered_gradients()
        if self.plan.input_grad:
            input_grads = [grad for _, grad in sorted(input_grads, key=lambda p: p[0])]
            self._input_grad = input_grads[0] if len(input_grads) == 1 else \
                self.xp.concatenate(input_grads)
        return losses[0] if len(losses) == 1 else mean_of_passes(losses)

    def train_step(self, x, labels, optimizer, dropout: bool = True):
        """forward, backward (per micro-batch), optimizer update; returns the loss (0-d
        device array). dropout=False: see forward(). On the GPU, a step that can be is
        replayed from a CUDA graph of an earlier one (minidnn/step_graph.py): the same bits,
        one call on the host."""
        loss = None
        if self._graphs is not None and self.observer is None:
            loss = self._graphs.step(x, labels, optimizer, dropout, self.step)
        if loss is None:
            self._leave_graphs()
            loss = self._step(x, labels, optimizer, dropout)
        self.step += 1
        return loss

    def _leave_graphs(self) -> None:
        """A plain step (a traced one) or an evaluation is about to run after steps were
        captured: under a budget, the graphs' blocks go back to the arena first. The plain
        work takes blocks as the captured step did, and the budget holds one step's, not
        two; kept, the graphs' blocks made a traced last step, or an evaluation, exceed a
        budget the plan had filled. The next step that can be is captured again."""
        if self._graphs is not None and self._graphs.count and self.memory_budget is not None:
            self._graphs.release()

    def gathered_nodes(self) -> frozenset:
        """The node indices of the layers whose parameter gradients a training step computes
        once after its passes (minidnn/gathered.py; none in a step of one pass)."""
        return frozenset(self._gathered)

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
