"""ReLU: y = max(x, 0). Backward reads only the output (y > 0 <=> x > 0), so the input can be
overwritten: the liveness plan runs it in place whenever no one else needs the input."""
from __future__ import annotations

from .base import Layer


class ReLU(Layer):
    kind = "relu"
    retain_output = True
    inplace = True

    def infer(self, in_shapes):
        return in_shapes[0]

    def forward(self, xs, y, aux, ctx):
        ctx.kernels.relu_forward(xs[0], y)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        if gxs[0] is not None:
            ctx.kernels.relu_backward(y, gy, gxs[0])  # gxs[0] may be gy itself

    def flops(self):
        n = 1
        for d in self.out_shape:
            n *= d
        return n
