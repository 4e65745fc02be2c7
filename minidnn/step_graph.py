"""A training step captured once as a CUDA graph, then replayed: the host's work done once.

Every layer call costs the host tens of microseconds: the memory manager's bookkeeping, the
kernels' arguments, cuDNN's and cuBLAS's calls. When a step's kernels are short, the device
waits for the host. On the H200, ResNet-50 at batch 256 in 2 micro-batches took the host
148 ms to issue, for 87 ms of device work; OverFeat's bf16 step took 12.9 ms to issue, for
12.1 ms of device work.

A step with the same inputs, optimizer and parameters runs the same kernels with the same
arguments at the same addresses every time. So `StepGraphs.step` captures the executor's
plain step once, on the compute stream, into a CUDA graph, and from then on launches the
graph: one call on the host per step. Why a replay gives the plain step's bits:

* every kernel and its arguments are the plain step's, recorded as it ran;
* the blocks the step takes from the arena stay the graph's between replays
  (memory/graph_pool.py), so nothing else is handed the addresses the graph writes;
* dropout's keys, which change every step, are read from device memory when the draws run
  (kernels/cuda_random.StepKeys), and written before each replay as a plain step passes them;
  so is the learning rate, which a schedule changes every step (the optimizer's write_lr:
  kernels/cuda_sgd.DeviceRate);
* the loss of each replay is copied to a slot of its own (a ring of LOSS_SLOTS), so a loss
  kept and read later is that step's.

Offload and prefetch are captured too: their copies run on their own streams, which the
capture forks from the compute stream at their first wait on it and joins back into it at the
step's end. A plain step asks events whether a copy is done before it reuses a block behind
it; inside a capture nothing has run, so the memory manager orders those reuses by stream
waits instead (MemoryManager.ordered_by_streams), and the graph carries them.

A step is captured when it runs on the GPU from device arrays (one graph per input address:
the graph reads them where they were), no observer watches it (a trace times layers on the
host; data parallelism all-reduces during backward), and, when its decision moves maps to
host memory, its blocks have planned addresses (a static layout: blocks freed behind copies
are then waited for by their next occupant's stream, where the arena would hold compute back
until the copy ends). The first WARMUP steps run plainly: they choose the convolution plans
and make the optimizer's momentum. If a capture fails, the executor warns once and runs plain
steps from then on. A plain step after captures (a traced one) and an evaluation take blocks
of their own; under a budget, which holds one step's blocks and not two, the graphs give
theirs back first (Executor._leave_graphs) and a later step is captured again.
"""
from __future__ import annotations

import contextlib
import traceback
import warnings

import numpy as np

from .memory.allocator import aligned
from .memory.arena import Arena
from .memory.graph_pool import GraphPool

WARMUP = 2           # plain steps before the first capture
MAX_GRAPHS = 4       # graphs kept (one per input address); past that, plain steps
LOSS_SLOTS = 4096    # a replay's loss stays readable for this many later steps


def loss_ring_bytes(dtype) -> int:
    """Device bytes of the ring of LOSS_SLOTS losses, made at the first capture and kept to
    the run's end: the step's memory model counts it."""
    return aligned(LOSS_SLOTS * np.dtype(dtype).itemsize)


def capturable(offloads: bool, static_layout: bool) -> bool:
    """Can a GPU step of a decision be captured: one that moves no map to host memory, or
    one whose blocks have planned addresses (see above)? The executor asks before it makes
    its StepGraphs, and the planner's step model to know which steps replay."""
    return static_layout or not offloads


class StepGraphs:
    """The captured steps of one executor.

    Args:
        device: the executor's backend.Device (GPU); graphs capture and replay on its
            compute stream.
        allocator: its arena (memory/arena.Arena), which keeps the captured steps' blocks.
        run_step: run_step(x, labels, optimizer, dropout, step_keys) -> loss: the
            executor's plain step (forward and backward of every pass, and the update),
            drawing dropout's keys from `step_keys` when it is given.
        seed: the executor's seed (dropout's keys are (seed, step, layer)).
        draw_layers: the indices of the layers that draw random numbers.
        bind: bind() makes the libraries the kernels call (cuBLAS, cuDNN) work on the current
            stream; called before each capture, inside which their handles must not change.
        ordered_by_streams: a context inside which the step's copies are ordered by stream
            waits alone (MemoryManager.ordered_by_streams); the capture runs inside it.
        loss_dtype: the dtype of the step's loss (the ring of replayed losses has it).
    """

    def __init__(self, device, allocator, run_step, seed: int, draw_layers, bind,
                 ordered_by_streams=contextlib.nullcontext, loss_dtype=np.float32):
        self.device = device
        self.allocator = allocator
        self._run_step = run_step
        self._bind = bind
        self._ordered_by_streams = ordered_by_streams
        self.seed = int(seed)
        self._keys = None
        if draw_layers:
            from .kernels.cuda_random import StepKeys
            self._keys = StepKeys(draw_layers)
        self._pool = GraphPool()
        self._graphs: dict = {}      # key -> (graph, the captured step's loss array)
        self._plain_steps = 0
        self._losses = None          # LOSS_SLOTS device scalars, made at the first capture
        self._loss_dtype = np.dtype(loss_dtype)
        self._turn = 0
        self.replays = 0                   # steps launched from a graph
        self.captured_at: list[int] = []   # the steps that were captured (each also ran)
        self.given_up: str | None = None   # why captures stopped, or None

    @property
    def count(self) -> int:
        """Graphs captured so far."""
        return len(self._graphs)

    def step(self, x, labels, optimizer, dropout: bool, step: int):
        """Run training step `step` as a graph: returns its loss (a 0-d device array), or
        None when this step must run plainly (the caller runs it)."""
        key = self._key(x, labels, optimizer, dropout)
        if key is None or self.given_up is not None:
            return None
        if self._plain_steps < WARMUP:
            self._plain_steps += 1
            return None
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= MAX_GRAPHS:
                return None
            entry = self._capture(key, x, labels, optimizer, dropout)
            if entry is None:
                return None
            self.captured_at.append(step)
        graph, loss = entry
        stream = self.device.compute
        with stream:
            if self._keys is not None:
                self._keys.fill(self.seed, step)
            optimizer.write_lr()       # this step's rate, where the captured update reads it
            graph.launch(stream)
            self.replays += 1
            out = self._losses[self._turn]
            self._turn = (self._turn + 1) % LOSS_SLOTS
            out[...] = loss
        return out

    def release(self) -> None:
        """Drop every graph and give their blocks back to the arena, for plain work to use;
        a later step is captured again (into the same loss ring, with the same dropout
        keys)."""
        if self._graphs:
            self.device.synchronize()   # the last replay has let go of the blocks
        self._graphs.clear()
        self.allocator.release_graph_pool(self._pool)

    def close(self) -> None:
        """Drop every graph and the device arrays kept for them, and give their blocks back to
        the arena."""
        self.release()
        self._losses = self._keys = None

    # ---- internals ----------------------------------------------------------------------------
    @staticmethod
    def _key(x, labels, optimizer, dropout):
        """What a graph depends on: the inputs' addresses and shapes, the optimizer and its
        settings (not the learning rate: SGD.graph_key), the addresses of every weight,
        gradient and momentum buffer. None when the inputs are not device arrays (a host batch
        is copied in by the host)."""
        import cupy as cp
        if not (isinstance(x, cp.ndarray) and isinstance(labels, cp.ndarray)):
            return None
        inputs = tuple((a.data.ptr, a.shape, a.strides, a.dtype.str) for a in (x, labels))
        return inputs, bool(dropout), id(optimizer), optimizer.graph_key()

    def _capture(self, key, x, labels, optimizer, dropout):
        """Capture one plain step into a graph (nothing runs on the device while it is
        captured); (graph, loss), or None after a failure, which stops further captures."""
        import cupy as cp
        stream = self.device.compute
        if self._losses is None:     # before the capture's pool takes the arena's free space
            with stream:
                self._losses = cp.zeros(LOSS_SLOTS, dtype=self._loss_dtype)
        self.device.synchronize()    # no event of an earlier step is waited for in the graph
        try:
            with self.allocator.capturing(self._pool), self._ordered_by_streams(), stream:
                self._bind()
                stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    loss = self._run_step(x, labels, optimizer, dropout, self._keys)
                    self._join_copy_streams()
                finally:
                    graph = stream.end_capture()
            graph.upload(stream)
        except Exception as e:   # noqa: BLE001 -- any failure: plain steps from here on
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "minidnn" in f.filename]
            where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" \
                if frames else ""
            self.given_up = f"{type(e).__name__}{where}: {e}"
            warnings.warn(f"minidnn: a training step could not be captured as a CUDA graph "
                          f"({self.given_up}); every step runs without one", RuntimeWarning,
                          stacklevel=4)
            self.close()
            return None
        self._graphs[key] = (graph, loss)
        return graph, loss

    def _join_copy_streams(self) -> None:
        """A capture must end with every stream it forked joined back into the compute stream:
        the compute stream waits for the copy streams' last work (so a replay ends with its
        copies)."""
        compute = self.device.compute
        for side in (self.device.offload, self.device.prefetch):
            if side.is_capturing():
                joined = self.device.event()
                joined.record(side)
                compute.wait_event(joined)


def step_graphs(ex, setup) -> StepGraphs | None:
    """The StepGraphs that replay executor `ex`'s train_step (its plain step, ex._step)
    with what its Assembly `setup` made (this module), where a step can be
    captured: on the GPU, from the arena, and, when maps move to host memory, in a static
    layout; else None."""
    if not (setup.compute and setup.device.is_gpu and isinstance(setup.allocator, Arena)) \
            or not capturable(bool(setup.manager.offload), setup.layout is not None):
        return None
    # The scratch blocks of calls that draw random numbers (others widen bf16 maps only).
    draw_layers = {setup.plan.nodes[i].layer.index for i, phase in setup.scratch
                   if phase != "recompute" and
                   setup.plan.nodes[i].layer.random_draws(phase) is not None}
    loss = setup.plan.tensors[setup.plan.net.loss_node.name]
    return StepGraphs(setup.device, setup.allocator, ex._step, setup.seed, draw_layers,
                      setup.kernels.bind_libraries, setup.manager.ordered_by_streams, loss.dtype)


class DeviceInputs:
    """The device copy of each host batch, always at the same addresses: a step reads its
    inputs where its graph was captured, so batches from the data loader (host arrays, which
    the executor would copy in itself, step by step, and which no graph can read) can be
    replayed too.

    Made before the executor, like a loader's buffers, so that they stay outside its arena.
    Each batch is copied on the compute stream: after the step before has read the last one,
    before this step's kernels.

    Args:
        device: a backend.Device (GPU).
        x_shape: (batch, C, H, W) of the images (float32, data.Dataset's contract);
            the labels are int64 (batch,).
    """

    def __init__(self, device, x_shape):
        self.device = device
        with device.compute:
            self.x = device.xp.empty(tuple(x_shape), np.float32)
            self.labels = device.xp.empty(int(x_shape[0]), np.int64)

    def __call__(self, x, labels):
        """(x, labels) copied into the device arrays; anything but NumPy arrays of the run's
        shapes and dtypes (none in a run: every batch of the loader is) is passed on as it
        is."""
        if not all(isinstance(a, np.ndarray) and a.shape == d.shape and a.dtype == d.dtype
                   for a, d in ((x, self.x), (labels, self.labels))):
            return x, labels
        stream = self.device.compute
        self.x.set(x, stream=stream)      # from pageable memory: staged before set returns
        self.labels.set(labels, stream=stream)
        return self.x, self.labels
