"""The layer contract: setup, forward, backward, and what backward needs.

A layer is pure compute. It never allocates feature maps, never keeps arrays between calls and
never copies between host and device: the memory manager hands it every buffer. In exchange the
layer says, before any compute, what it needs:

* `setup(in_shapes)` returns the output shape and declares parameters (Caffe's SetUp/Reshape),
  so every buffer's size is known before step one;
* `retain_inputs` / `retain_output` say which feature maps its backward reads (Chainer's
  retain_inputs); the manager keeps, offloads or drops exactly those;
* `aux_specs()` names the small side buffers forward leaves for backward (a dropout mask,
  a pooling argmax, a softmax), which the manager owns like feature maps;
* `random_draws(phase)` gives the shape of the random numbers a call draws, for which the
  manager hands it a scratch block (layers/draws.py);
* `inplace` says the output may share input 0's buffer (and the input gradient the output
  gradient's), which the liveness plan (memory/plan.py) grants only when no one else needs
  the input;
* `recomputable` says forward may run again in backward to rebuild a dropped output, and
  `grad_over_input` that backward may write input 0's gradient over input 0;
* `batch_statistics` says forward computes statistics over the whole batch (BatchNorm), so
  splitting the batch would change the result;
* `masks_relu_before` says backward may apply the mask of the ReLU whose output is its input
  (a max pool), so that ReLU keeps nothing for backward (minidnn/fusion.py);
* `adds_in_place` names the parameters whose gradient backward can add to what p.grad holds
  (a micro-batch after a step's first) in the product that makes it, with no temporary;
* `buffers` (declared in setup) hold state that is not learned but belongs in the state
  dict (BatchNorm's running statistics); the executor moves them with the parameters.

Shapes always include the batch: (N, C, H, W) for images, (N, F) for vectors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..kernels import cpu as cpu_kernels
from . import draws


@dataclass(eq=False)
class Parameter:
    """A learnable array and its gradient. `data`/`grad` live on the executor's device.

    init: 'he_normal' (conv/linear weights feeding ReLUs), 'uniform_fan_in' (PyTorch's default
    U(-1/sqrt(fan_in), 1/sqrt(fan_in))), 'normal_0.01', 'zeros' or 'ones'.
    """
    shape: tuple
    init: str
    fan_in: int = 1
    data: Any = None
    grad: Any = None

    def initial_value(self, rng: np.random.Generator, dtype) -> np.ndarray:
        if self.init == "he_normal":
            v = rng.standard_normal(self.shape) * math.sqrt(2.0 / self.fan_in)
        elif self.init == "uniform_fan_in":
            bound = 1.0 / math.sqrt(self.fan_in)
            v = rng.uniform(-bound, bound, self.shape)
        elif self.init == "normal_0.01":
            v = rng.standard_normal(self.shape) * 0.01
        elif self.init == "zeros":
            v = np.zeros(self.shape)
        elif self.init == "ones":
            v = np.ones(self.shape)
        else:
            raise ValueError(f"unknown initializer {self.init!r}")
        return v.astype(dtype)


@dataclass(eq=False)
class Buffer:
    """State a layer keeps between steps that no gradient updates (running statistics, a
    counter): in the state dict and checkpoints, on the executor's device, never seen by the
    optimizer. init: 'zeros' or 'ones'; dtype None means the network's dtype."""
    shape: tuple
    init: str
    dtype: Any = None
    data: Any = None

    def initial_value(self, dtype) -> np.ndarray:
        fill = {"zeros": 0, "ones": 1}.get(self.init)
        if fill is None:
            raise ValueError(f"unknown buffer initializer {self.init!r}")
        return np.full(self.shape, fill, dtype=self.dtype or dtype)


@dataclass
class StepContext:
    """What a layer may know about the step it runs in.

    xp: numpy or cupy; kernels: the kernel module for the device (minidnn/kernels; the CPU's
    reference by default); train:
    training or evaluation mode; step and seed: for layers that draw random numbers (dropout),
    so that a resumed run draws the same numbers again. workspace: during a call, the cuDNN
    workspace block the memory manager planned for it (a flat uint8 device array), or None.
    conv_plans: {convolution node name: plan setting} the step runs (the executor's decision;
    layers/conv.py); a convolution not named runs its own setting. relu_bits: names of the
    ReLU nodes that keep one bit per value for backward instead of their output (the
    decision's; layers/relu.py); a ReLU not named keeps what its own setting says.
    dropout: False passes dropout layers through in a training step (Executor.forward).
    batch_offset, global_batch: the rows of the whole batch this call computes are
    [batch_offset, batch_offset + N) of global_batch (None: the call's own N), so that a
    batch split into micro-batches draws the same random numbers as the whole batch.
    scratch: during a call that draws random numbers, the block the memory manager planned
    for them (layers/draws.py; a flat uint8 device array), or None.
    bias_deferred: names of the convolution nodes whose bias the ReLU after them adds;
    relu_bias: {ReLU node name: the bias Parameter (C,) it adds} (the decision's bias_relu;
    minidnn/fusion.py). relu_in_conv: names of the convolution nodes that add their bias
    and apply the ReLU after them in their forward; relu_forward_done: those ReLUs, whose
    forward has nothing left to do (the decision's conv_relu), and those of relu_before_pool. relu_in_bn: names of the batch norm nodes that apply the ReLU after
    them; relu_done: names of those ReLUs, whose forward and backward have nothing left to do
    (the decision's bn_relu): the batch norm's backward applies the ReLU's mask too.
    relu_in_add: names of the add nodes that apply the ReLU after them and mask their
    gradient with its output (the decision's add_relu); relu_done names those ReLUs too.
    add_in_bn: names of the batch norm nodes that apply the add after them (and its ReLU),
    reading the add's other input as their second input; add_done: those adds, whose
    forward has nothing left to do (the decision's bn_add).
    relu_in_pool: names of the max pool nodes that apply the mask of the ReLU before them in
    their backward; relu_mask_done: those ReLUs, whose backward has nothing to mask and
    which keep nothing for it (the decision's pool_relu). relu_before_pool: {max pool node
    name: the ReLU node before it}: the pools that apply that ReLU in their forward too,
    reading its input (the decision's pool_relu_forward); relu_forward_done names those
    ReLUs too. pool_bias: {max pool node name: the bias Parameter (C,) whose gradient its
    backward sums}: the bias the ReLU before it adds; bias_in_pool: those ReLUs, whose
    backward has nothing left to do (the decision's pool_bias).
    gy_addend: in the backward of an add that takes over a gradient sum (the decision's
    add_sum), the part of its output gradient a second reader wrote, to add to gy (a map
    of gy's shape and layout); else None.
    add_grad_to: {add node name: k}: the adds that write their masked gradient to input k's
    gradient alone (input 0's: gy's buffer when it has none of its own), which the batch
    norm writing their other input reads as its gy (the decision's bn_grad).
    gradient_sums: in the backward of such an add, and of that batch norm next, a
    layers/batchnorm.GradientSums: the add takes the batch norm's sums of the gradient it
    writes, and the batch norm starts from them (the decision's bn_sums); else None.
    maps: the step's feature-map format (kernels/mapformat.MapFormat; bf16 under mixed
    precision), in which a batch norm recomputes the output of the ReLU it applies; None:
    the layer's dtype. step_keys: while a step is captured as a CUDA graph, the device table
    its draws read their keys from (kernels/cuda_random.StepKeys); else None.
    batch_slice: under deterministic mode, the images of one slice (layers/slices.py):
    convolutions and fully connected layers run slice by slice and sum their parameter
    gradients in slice order; None (the default): one call over the call's rows.
    statistics_slice: the rows a BatchNorm normalizes with statistics of their own, each
    slice of that many (deterministic mode with split statistics); None: all the call's.
    add_grads: under batch_slice, the call adds its parameter gradients to p.grad, which
    holds the sum of the slices before it (a micro-batch or chunk piece after the first);
    without batch_slice, it adds those its layer's `adds_in_place` names, and the executor
    adds the others itself (each written to a temporary in p.grad's place).
    params_gathered: the call writes its input gradient only; its layer's parameter
    gradients are computed once a step, over the rows every pass copies aside
    (minidnn/gathered.py: a fully connected layer of a split step).
    """
    xp: Any
    kernels: Any = cpu_kernels
    train: bool = True
    step: int = 0
    seed: int = 0
    device: Any = None
    workspace: Any = None
    conv_plans: dict = field(default_factory=dict)
    relu_bits: frozenset = frozenset()
    dropout: bool = True
    batch_offset: int = 0
    global_batch: int | None = None
    scratch: Any = None
    bias_deferred: frozenset = frozenset()
    relu_bias: dict = field(default_factory=dict)
    relu_in_conv: frozenset = frozenset()
    relu_forward_done: frozenset = frozenset()
    relu_in_bn: frozenset = frozenset()
    relu_done: frozenset = frozenset()
    relu_in_add: frozenset = frozenset()
    add_in_bn: frozenset = frozenset()
    add_done: frozenset = frozenset()
    relu_in_pool: frozenset = frozenset()
    relu_mask_done: frozenset = frozenset()
    relu_before_pool: dict = field(default_factory=dict)
    pool_bias: dict = field(default_factory=dict)
    bias_in_pool: frozenset = frozenset()
    gy_addend: Any = None
    add_grad_to: dict = field(default_factory=dict)
    gradient_sums: Any = None
    maps: Any = None
    step_keys: Any = None
    batch_slice: int | None = None
    statistics_slice: int | None = None
    add_grads: bool = False
    params_gathered: bool = False
    extras: dict = field(default_factory=dict)

    def stored_dtype(self, dtype):
        """The dtype this step's feature maps are stored in, for a layer of `dtype` (bf16
        under mixed precision, where a widened call sees float32 copies): what a fused
        kernel rounds a value to where the unfused layer would have stored it; None without
        a map format (the layer's own dtype)."""
        return None if self.maps is None else self.maps.map_dtype(dtype)

    def rng(self, layer: "Layer"):
        """A generator seeded by (seed, step, layer index): reproducible, and independent per layer."""
        key = [self.seed, self.step, max(layer.index, 0)]  # -1: a layer outside a network
        if self.xp is np:
            return np.random.default_rng(key)
        # On the GPU a counter-based generator: no state to set up (kernels/cuda_random.py).
        from ..kernels.cuda_random import CounterUniform, counter_generator
        if self.step_keys is not None:   # a captured step: the key is read when it replays
            return CounterUniform(self.step_keys.slot(key[2]))
        return counter_generator(key)

    def uniform_rows(self, layer: "Layer", shape: tuple):
        """float32 draws in [0, 1) of `shape` (N, ...): rows [batch_offset, batch_offset + N)
        of the draws of the whole batch, so a split batch sees the same numbers row for row.
        Only those rows are drawn (the generator skips the ones before them), in `scratch`
        when the call has one (layers/draws.py)."""
        return draws.uniform_rows_into(lambda: self.rng(layer), tuple(shape),
                                       self.batch_offset, self.scratch, self.device)


class Layer:
    """Base class of every layer. Subclasses override `infer`, `forward`, `backward`."""

    kind = "other"            # 'conv', 'pool', 'relu', 'lrn', 'linear', 'loss', ...: policies use it
    num_inputs = 1            # None: any number >= 1 (Concat, Add)
    retain_inputs: tuple = ()  # indices of the inputs backward reads
    retain_output = False     # backward reads the output
    inplace = False           # output may alias input 0 (and grad input the grad output)
    has_grad_inputs = True    # False for layers whose inputs never need a gradient (the loss's labels)
    # Forward is a fixed function of the inputs and parameters (no randomness, no mode) and,
    # given aux=None, writes only y: running it again in backward rewrites the output bit for
    # bit, so the memory manager may drop that output after forward and recompute it
    # (memory/policy.py). Aux buffers forward filled the first time stay as they are.
    recomputable = False
    # Backward reads input 0 only before it writes input 0's gradient (a convolution: weight
    # gradient first, then data gradient), so that gradient may overwrite input 0 when no
    # one else reads it in backward (memory/plan.py).
    grad_over_input = False
    # Forward normalizes with statistics of the whole batch (BatchNorm in training): running it
    # on part of the batch gives other numbers, so batch splitting must not do so silently.
    batch_statistics = False
    # Backward may also apply the mask of a ReLU whose output is its input, so that the
    # ReLU's backward has nothing to mask (a max pool: minidnn/fusion.py, memory/plan.py).
    masks_relu_before = False
    # The parameters (keys of `params`) whose gradient backward adds to p.grad, in the product
    # that computes it, when ctx.add_grads says so without a batch_slice (a fully connected
    # layer's weight: cuBLAS adds to the output it writes). The executor hands every other
    # parameter a temporary then and adds it itself (executor.py, planner/costs.py).
    adds_in_place: tuple = ()
    # The ops of ctx.kernels that forward and backward compute with, when they compute only
    # with those: where the kernels take bf16 maps in all of them (kernels BF16_OPS), the layer
    # runs on bf16 maps as they are; otherwise (None: it computes with array code of its own)
    # it sees them widened to float32 (layers/precision.py).
    kernel_ops: tuple | None = None

    def __init__(self, name: str | None = None):
        self.name = name
        self.index = -1                      # position in the network, set when added
        self.params: dict[str, Parameter] = {}
        self.buffers: dict[str, Buffer] = {}
        self.in_shapes: list[tuple] = []
        self.out_shape: tuple = ()
        self.dtype = np.dtype(np.float32)

    def copy_bytes(self, phase: str, layout: str, shared: bool) -> int:
        """Bytes of the copy of a map that a `phase` call makes inside itself, on maps stored
        in `layout` ('nchw' or 'nhwc') in the layer's dtype, where its output shares input
        0's buffer (forward, recompute) or its input gradient the output gradient's
        (backward) when `shared`. The memory manager hands the call a scratch block that
        large (ctx.scratch), planned like every block, so that no copy is taken unplanned. 0:
        none (every layer but Flatten)."""
        return 0

    # ---- setup ---------------------------------------------------------------------------
    def setup(self, in_shapes: list[tuple], dtype=np.float32) -> tuple:
        """Check the input shapes, declare parameters, return the output shape."""
        in_shapes = [tuple(int(d) for d in s) for s in in_shapes]
        if self.num_inputs is not None and len(in_shapes) != self.num_inputs:
            raise ShapeError(f"layer {self.name!r} ({type(self).__name__}) takes "
                             f"{self.num_inputs} input(s), got {len(in_shapes)}")
        self.dtype = np.dtype(dtype)
        self.in_shapes = in_shapes
        self.out_shape = tuple(int(d) for d in self.infer(in_shapes))
        return self.out_shape

    def infer(self, in_shapes: list[tuple]) -> tuple:
        """Subclasses: validate input shapes (raise via `self.shape_error`), declare params."""
        raise NotImplementedError

    def add_param(self, name: str, shape: tuple, init: str, fan_in: int = 1) -> Parameter:
        """Declare a parameter; a second setup (another batch size) keeps the existing one."""
        shape = tuple(int(d) for d in shape)
        p = self.params.get(name)
        if p is None:
            p = self.params[name] = Parameter(shape, init, fan_in)
        elif p.shape != shape:
            raise ShapeError(f"layer {self.name!r}: parameter {name} has shape {p.shape}, "
                             f"new input shapes need {shape}")
        return p

    def add_buffer(self, name: str, shape: tuple, init: str, dtype=None) -> Buffer:
        """Declare a buffer (see Buffer); a second setup keeps the existing one."""
        shape = tuple(int(d) for d in shape)
        b = self.buffers.get(name)
        if b is None:
            b = self.buffers[name] = Buffer(shape, init, None if dtype is None else np.dtype(dtype))
        elif b.shape != shape:
            raise ShapeError(f"layer {self.name!r}: buffer {name} has shape {b.shape}, "
                             f"new input shapes need {shape}")
        return b

    def shape_error(self, expected: str, got) -> ShapeError:
        return ShapeError(f"layer {self.name!r} ({type(self).__name__}) expected input {expected}, "
                          f"got shape {tuple(got)}")

    def aux_specs(self) -> dict[str, tuple[tuple, Any]]:
        """Side buffers that forward fills for backward: {name: (shape, dtype)}."""
        return {}

    def random_draws(self, phase: str) -> tuple | None:
        """The shape (N, ...) of the uniform draws (StepContext.uniform_rows) a call of
        `phase` ('forward', 'backward') makes, or None: the memory manager hands such a call
        a scratch block for them (layers/draws.py)."""
        return None

    # ---- compute --------------------------------------------------------------------------
    def forward(self, xs: list, y, aux: dict, ctx: StepContext) -> None:
        """Compute the output into `y` (which may be xs[0] itself when `inplace`). aux is None
        when a `recomputable` layer runs again in backward: then write y only."""
        raise NotImplementedError

    def backward(self, xs: list, y, gy, gxs: list, aux: dict, ctx: StepContext) -> None:
        """Write input gradients into `gxs` (None where none is wanted) and parameter
        gradients into `p.grad` (overwritten, not accumulated; added to under
        ctx.add_grads: all of them in slices of ctx.batch_slice, layers/slices.py; without
        it, those `adds_in_place` names).

        xs[i] is None unless i is in retain_inputs; y is None unless retain_output.
        gxs[0] may be gy itself when `inplace`.
        """
        raise NotImplementedError

    # ---- accounting ------------------------------------------------------------------------
    def flops(self) -> int:
        """Forward floating-point operations for the shapes of the last setup (multiply-add = 2)."""
        return 0

    def describe(self) -> str:
        """Short text of the layer's settings for summaries."""
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"
