"""Flatten (N, C, H, W) -> (N, C*H*W), features in PyTorch's (C, H, W) order.

In place on an NCHW map it is a free reshape of the input's buffer. A channels-last map
(kernels/mapformat.py) holds its values in (H, W, C) order, so Flatten reorders them to
(C, H, W) order on the way, and backward reorders the gradient back: the map before the
classifier is small (VGG-16: 100 KB an image in fp32), and the first Linear's weight keeps PyTorch's
(out, C*H*W) layout as it is, in every state_dict and checkpoint. When Flatten writes over
its own input (the liveness plan allows it only when no one else reads that input), the
values go through a temporary of the map, which the step model counts (planner/costs.py,
transient_bytes).
"""
from __future__ import annotations

from ..backend import same_memory
from .base import Layer


class Flatten(Layer):
    kind = "reshape"
    recomputable = True
    inplace = True

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) < 2:
            raise self.shape_error("(N, ...) with at least 2 dimensions", s)
        f = 1
        for d in s[1:]:
            f *= d
        return (s[0], f)

    def forward(self, xs, y, aux, ctx):
        x = xs[0]
        shared = same_memory(x, y)
        if shared and x.flags.c_contiguous:
            return                                  # y is x's buffer, reshaped
        y.reshape(x.shape)[...] = x.copy() if shared else x

    def backward(self, xs, y, gy, gxs, aux, ctx):
        gx = gxs[0]
        if gx is None:
            return
        shared = same_memory(gx, gy)
        if shared and gx.flags.c_contiguous:
            return
        gx[...] = (gy.copy() if shared else gy).reshape(gx.shape)
