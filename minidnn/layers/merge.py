"""Layers that join branches: Concat (along the channel axis by default), Add, and
BatchJoin (the pieces of a layer chunk back into one batch, along the batch axis).

None keeps anything for backward: the gradient of a concatenation is a slice of the output
gradient, that of a sum is the output gradient itself. An add that applies the ReLU after it
(minidnn/fusion.py) reads its output in backward, for the ReLU's mask.
"""
from __future__ import annotations

from ..backend import same_memory
from ..errors import ConfigError, ShapeError
from ..kernels.mapformat import copy_values, pointwise_views
from .base import Layer


class Concat(Layer):
    """y = the inputs joined along `axis` (a non-batch axis of the logical NCHW shape, 1:
    channels): xs[k] (N, ..., C_k, ...) -> y (N, ..., sum C_k, ...); backward hands each input
    its slice of gy. One kernel call each way (kernels' concat_forward / concat_backward)."""
    kind = "concat"
    recomputable = True
    num_inputs = None
    kernel_ops = ()           # copies only: bf16 maps as they are (layers/precision.py)

    def __init__(self, axis: int = 1, name: str | None = None):
        super().__init__(name)
        if not isinstance(axis, int) or axis == 0:
            raise ConfigError(f"Concat {name!r}: axis must be a non-batch axis (an int other "
                              f"than 0), got {axis!r}")
        self.axis = axis

    def infer(self, in_shapes):
        if not in_shapes:
            raise ShapeError(f"layer {self.name!r} (Concat) needs at least one input")
        rank = len(in_shapes[0])
        axis = self.axis + rank if self.axis < 0 else self.axis
        if not 1 <= axis < rank:
            raise self.shape_error(f"inputs with an axis {self.axis} besides the batch axis",
                                   in_shapes[0])
        first = in_shapes[0]
        for k, s in enumerate(in_shapes[1:], start=1):
            if len(s) != rank or any(a != b for d, (a, b) in enumerate(zip(s, first)) if d != axis):
                raise ShapeError(f"layer {self.name!r} (Concat) expected every input to match "
                                 f"input 0 {tuple(first)} except along axis {axis}, "
                                 f"got input {k} of shape {tuple(s)}")
        self._axis = axis
        self.sizes = [s[axis] for s in in_shapes]
        out = list(first)
        out[axis] = sum(self.sizes)
        return tuple(out)

    def forward(self, xs, y, aux, ctx):
        """xs[k] (N, ..., C_k, ...) -> y (N, ..., sum C_k, ...)."""
        ctx.kernels.concat_forward(xs, y, self._axis)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        """gxs[k] = gy's slice k along the axis (None: not wanted)."""
        ctx.kernels.concat_backward(gy, gxs, self.sizes, self._axis)

    def describe(self):
        return f"axis {self.axis}"


class Add(Layer):
    """y = xs[0] + xs[1] + ...; backward hands gy to every input. In place: y may be input 0's
    buffer, and input 0's gradient the output gradient's buffer (then it costs no copy).
    With two inputs it may apply the ReLU after it (ctx.relu_in_add; minidnn/fusion.py):
    y = max(xs[0] + xs[1], 0), and backward hands every input gy where y > 0."""
    kind = "add"
    recomputable = True
    inplace = True
    num_inputs = None

    def infer(self, in_shapes):
        if len(in_shapes) < 2:
            raise ShapeError(f"layer {self.name!r} (Add) needs at least 2 inputs, "
                             f"got {len(in_shapes)}")
        first = in_shapes[0]
        for k, s in enumerate(in_shapes[1:], start=1):
            if tuple(s) != tuple(first):
                raise ShapeError(f"layer {self.name!r} (Add) expected every input to have the "
                                 f"shape of input 0 {tuple(first)}, got input {k} of shape "
                                 f"{tuple(s)}")
        return first

    @property
    def kernel_ops(self):
        """Two inputs: one kernel add, rounded once, which the GPU's kernels do on bf16 maps
        as the widening path does (layers/precision.py); more inputs would be rounded
        between the adds, so they are widened."""
        return ("add", "add_relu", "relu_mask_copy", "relu_mask_sum_copy", "relu_backward",
                "relu_mask_sum") \
            if len(self.in_shapes) == 2 else None

    def forward(self, xs, y, aux, ctx):
        """y = xs[0] + xs[1] + ...; all the same shape. max(xs[0] + xs[1], 0) when this add
        applies the ReLU after it (ctx.relu_in_add). Nothing when the batch norm writing
        input 0 applied both (ctx.add_done): y, input 0's buffer, holds their output."""
        if self.name in ctx.add_done:
            if not same_memory(xs[0], y):   # bf16 maps widened to float32 copies (precision.py)
                y[...] = xs[0]
            return
        if self.name in ctx.relu_in_add:
            ctx.kernels.add_relu(xs[0], xs[1], y)
            return
        ctx.kernels.add(xs[0], xs[1], y)
        for x in xs[2:]:
            ctx.kernels.add(y, x, y)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        """gxs[k] = gy (None: not wanted); gy where y > 0, else 0, when this add applies the
        ReLU after it (ctx.relu_in_add): y is then that ReLU's output, retained (the liveness
        plan's `fuse`), and gy is masked in place when input 0's gradient shares it. With
        ctx.gy_addend (minidnn/fusion.py, add_sum) the gradient is gy + that addend, summed
        in the same pass. An add of ctx.add_grad_to (bn_grad) writes input k's gradient
        alone; the batch norm writing the other input reads it from there, and with
        ctx.gradient_sums (bn_sums) this pass takes that batch norm's sums of it too."""
        if self.name in ctx.relu_in_add:
            k = ctx.add_grad_to.get(self.name)
            if k is not None:     # one input's gradient: the batch norm after reads it (bn_grad)
                gx = gy if gxs[k] is None else gxs[k]
                if ctx.gradient_sums is not None:
                    ctx.gradient_sums.take(y, gy, ctx.gy_addend, gx)
                elif ctx.gy_addend is None:
                    ctx.kernels.relu_backward(y, gy, gx)
                else:
                    ctx.kernels.relu_mask_sum(y, gy, ctx.gy_addend, gx)
                return
            gx0 = gy if gxs[0] is None else gxs[0]
            if ctx.gy_addend is None:
                ctx.kernels.relu_mask_copy(y, gy, gx0, gxs[1])
            else:                 # gy + the addend, masked in the same pass (add_sum)
                ctx.kernels.relu_mask_sum_copy(y, gy, ctx.gy_addend, gx0, gxs[1])
            return
        if ctx.gy_addend is not None:     # no mask to fold it into: the sum first
            ctx.kernels.add(gy, ctx.gy_addend, gy)
        for gx in gxs:
            if gx is not None and not same_memory(gx, gy):
                copy_values(*pointwise_views(gx, gy))

    def flops(self):
        n = 1
        for d in self.out_shape:
            n *= d
        return n * (len(self.in_shapes) - 1)


class BatchJoin(Layer):
    """The p pieces of a layer chunk (minidnn/chunks.py) as one map of the whole batch:
    input j (b, ...) is rows j*b .. (j+1)*b of the output (p*b, ...). Backward hands each
    piece its rows of the output gradient. Pure copies: no bit changes."""
    kind = "join"
    recomputable = True
    num_inputs = None
    kernel_ops = ()           # copies only: bf16 maps as they are (layers/precision.py)

    def infer(self, in_shapes):
        first = tuple(in_shapes[0])
        for k, s in enumerate(in_shapes[1:], start=1):
            if tuple(s) != first:
                raise ShapeError(f"layer {self.name!r} (BatchJoin) expected every piece to "
                                 f"have the shape of piece 0 {first}, got piece {k} of shape "
                                 f"{tuple(s)}")
        return (first[0] * len(in_shapes),) + first[1:]

    def forward(self, xs, y, aux, ctx):
        """xs[j] (b, ...) -> y[j*b:(j+1)*b]."""
        b = xs[0].shape[0]
        for j, x in enumerate(xs):
            copy_values(y[j * b:(j + 1) * b], x)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        b = gy.shape[0] // len(gxs)
        for j, gx in enumerate(gxs):
            if gx is not None:
                copy_values(gx, gy[j * b:(j + 1) * b])

    def describe(self):
        return f"{len(self.in_shapes)} pieces"
