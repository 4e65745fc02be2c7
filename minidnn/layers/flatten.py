"""Flatten (N, C, H, W) -> (N, C*H*W), features in PyTorch's (C, H, W) order.

In place on an NCHW map it is a free reshape of the input's buffer. A channels-last map
(kernels/mapformat.py) holds its values in (H, W, C) order, so Flatten reorders them to
(C, H, W) order on the way, and backward reorders the gradient back: the map before the
classifier is small (VGG-16: 100 KB an image in fp32), and the first Linear's weight keeps PyTorch's
(out, C*H*W) layout as it is, in every state_dict and checkpoint. Writing over its own input
would take a temporary of the map, which no plan counts (an H200 run in a budget of its
unconstrained peak failed on its 32 KiB), so on channels-last maps Flatten writes a buffer of
its own (`inplace_in`), which the plan counts.
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

    def inplace_in(self, layout: str) -> bool:
        """In place on NCHW maps (a reshape) and on 2-D inputs; not on channels-last maps."""
        return layout == "nchw" or len(self.in_shapes[0]) <= 2

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
