"""Flatten (N, C, H, W) -> (N, C*H*W), features in PyTorch's (C, H, W) order.

In place on an NCHW map it is a free reshape of the input's buffer. A channels-last map
(kernels/mapformat.py) holds its values in (H, W, C) order, so Flatten reorders them to
(C, H, W) order on the way, and backward reorders the gradient back: the map before the
classifier is small (VGG-16: 100 KB an image in fp32), and the first Linear's weight keeps PyTorch's
(out, C*H*W) layout as it is, in every state_dict and checkpoint. When Flatten writes over
its own input (the liveness plan allows it only when no one else reads that input), the
values go through a copy of the map in the call's scratch block (`copy_bytes`), which the
memory manager plans like every block: an arena temporary taken there, which no plan counted,
failed an H200 run in a budget of its unconstrained peak (32 KiB), and inside a step replayed
from a CUDA graph it would stay the graph's while a plain evaluation took another.
"""
from __future__ import annotations

import math

from ..backend import same_memory
from ..kernels.mapformat import layout_of, shaped
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

    def copy_bytes(self, phase: str, layout: str, shared: bool) -> int:
        """A copy of the map where Flatten reorders channels-last maps over their own
        buffer (a 4-D input; in every phase the map has the input's size)."""
        if not shared or layout != "nhwc" or len(self.in_shapes[0]) < 3:
            return 0
        return math.prod(self.in_shapes[0]) * self.dtype.itemsize

    def forward(self, xs, y, aux, ctx):
        x = xs[0]
        shared = same_memory(x, y)
        if shared and x.flags.c_contiguous:
            return                                  # y is x's buffer, reshaped
        y.reshape(x.shape)[...] = _apart(x, ctx) if shared else x

    def backward(self, xs, y, gy, gxs, aux, ctx):
        gx = gxs[0]
        if gx is None:
            return
        shared = same_memory(gx, gy)
        if shared and gx.flags.c_contiguous:
            return
        gx[...] = (_apart(gy, ctx) if shared else gy).reshape(gx.shape)


def _apart(a, ctx):
    """A copy of `a`, in its layout, in the call's scratch block (copy_bytes); outside an
    executor (no block), from the array module."""
    if ctx.scratch is None:
        return a.copy()
    out = shaped(ctx.scratch, a.shape, a.dtype, layout_of(a))
    out[...] = a
    return out
