"""ReLU: y = max(x, 0). Backward needs only where y > 0 (which is where x > 0), so the input
can be overwritten: the liveness plan runs it in place whenever no one else needs the input.

keep='output' (default): backward reads the output itself, which costs nothing extra when the
next layer keeps that map anyway (a convolution keeps its input). keep='bits': forward also
writes one bit per value (y > 0) as an aux buffer and backward reads only that, 1/32 of the
bytes; the output is then free after its last forward reader. Worth it where no one else keeps
the output (a ReLU before a max-pool, which keeps only its argmax). Lossless either way: the
gradients are bit-identical.

A ReLU before a max pool may keep nothing at all: the pool applies its mask in its own
backward (minidnn/fusion.py, the decision's pool_relu), and this ReLU's backward only passes
the gradient on (and sums the bias it added, if it did, unless the pool sums it as well:
pool_bias). The pool may apply its forward too
(pool_relu_forward): this ReLU's forward then leaves its input in place for the pool.

`keep` is the layer's own setting. A step's memory decision may have more ReLUs keep bits
(MemoryDecision.relu_bits, node names): the liveness plan reads what each one keeps from
`keep_in(relu_bits)` and the calls receive the same names through StepContext.relu_bits, so
the layer itself never changes.
"""
from __future__ import annotations

import numpy as np

from ..backend import same_memory
from ..errors import ConfigError
from ..kernels import relu_mask_bytes
from .base import Layer
from .slices import sum_in_slices

KEEP = ("output", "bits")


class ReLU(Layer):
    """y = max(x, 0), any shape; keep: what backward reads, 'output' or 'bits' (module
    docstring). It may add the bias of the convolution before it, or leave its forward and
    backward to the batch norm or add before it (minidnn/fusion.py)."""
    kind = "relu"
    recomputable = True
    inplace = True
    kernel_ops = ("relu_forward", "relu_backward", "relu_forward_bits", "relu_backward_bits")

    def __init__(self, keep: str = "output", name: str | None = None):
        super().__init__(name)
        self.keep = keep

    @property
    def keep(self) -> str:
        return self._keep

    @keep.setter
    def keep(self, keep: str) -> None:
        if keep not in KEEP:
            raise ConfigError(f"ReLU {self.name!r}: keep must be one of {', '.join(KEEP)}, "
                              f"got {keep!r}")
        self._keep = keep
        self.retain_output = keep == "output"

    def keep_in(self, relu_bits=()) -> str:
        """What this ReLU keeps for backward in a step whose decision has the ReLUs
        `relu_bits` (node names) keep bit masks: 'bits' if it is one of them, else `keep`."""
        return "bits" if self.name in relu_bits else self.keep

    def infer(self, in_shapes):
        return in_shapes[0]

    def aux_specs(self, relu_bits=()):
        if self.keep_in(relu_bits) == "bits":
            return {"mask": ((relu_mask_bytes(int(np.prod(self.in_shapes[0]))),), np.uint8)}
        return {}

    def forward(self, xs, y, aux, ctx):
        """y = max(x, 0), or max(x + b, 0) when this ReLU adds the bias b of the convolution
        before it (ctx.relu_bias; minidnn/fusion.py); nothing when the convolution, the
        batch norm or the add before it applied it, or the max pool after it applies it
        (ctx.relu_forward_done, ctx.relu_done): y, in place, keeps x."""
        if self.name in ctx.relu_forward_done or self.name in ctx.relu_done:
            if not same_memory(xs[0], y):   # bf16 maps widened to float32 copies (precision.py)
                y[...] = xs[0]
            return
        # A ReLU whose max pool applies its mask keeps nothing, bits neither.
        keep_bits = self.keep_in(ctx.relu_bits) == "bits" and self.name not in ctx.relu_mask_done
        bias = ctx.relu_bias.get(self.name)
        bias = None if bias is None else bias.data
        if keep_bits and aux is not None:   # aux None: recomputed, the mask is kept
            ctx.kernels.relu_forward_bits(xs[0], y, aux["mask"], bias)
        else:
            ctx.kernels.relu_forward(xs[0], y, bias)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        """gx = gy where y > 0; and, when this ReLU added a convolution's bias, that bias's
        gradient (the sum of gx over all but the channel axis) in the same pass. Nothing
        when the batch norm or the add before it applies the mask in its own backward
        (ctx.relu_done): gx is gy's buffer, which that layer reads. Only the bias's
        gradient when the max pool after it applied the mask (ctx.relu_mask_done): gy is
        masked already, in gx's buffer; not that when the pool summed it (ctx.bias_in_pool)."""
        if self.name in ctx.relu_done or self.name in ctx.bias_in_pool:
            if gxs[0] is not None and not same_memory(gy, gxs[0]):   # widened copies
                gxs[0][...] = gy
            return
        bias = ctx.relu_bias.get(self.name)
        gb = None if bias is None else bias.grad
        if gxs[0] is None:
            if gb is not None:
                raise ValueError(f"ReLU {self.name!r} adds a bias but gets no input gradient")
            return
        gx = gxs[0]
        sliced = gb is not None and ctx.batch_slice is not None   # deterministic: gb below
        if self.name in ctx.relu_mask_done:
            if not same_memory(gy, gx):                # widened copies
                gx[...] = gy
            if gb is not None and not sliced:
                ctx.kernels.bias_grad(gx, gb)
        elif self.keep_in(ctx.relu_bits) == "bits":  # gxs[0] may be gy itself
            ctx.kernels.relu_backward_bits(aux["mask"], gy, gx, None if sliced else gb)
        else:
            ctx.kernels.relu_backward(y, gy, gx, None if sliced else gb)
        if sliced:   # the bias gradient summed slice by slice (layers/slices.py)
            sum_in_slices(ctx, gx.shape[0], [gb],
                          lambda part, out: ctx.kernels.bias_grad(gx[part], out[0]))

    def flops(self):
        return int(np.prod(self.out_shape))

    def describe(self, relu_bits=()):
        return "" if self.keep_in(relu_bits) == "output" else "keep bits"
