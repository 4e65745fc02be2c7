"""Flatten (N, C, H, W) -> (N, C*H*W). In place it is a free reshape of the input's buffer."""
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
        if not same_memory(xs[0], y):  # given its own buffer: copy
            y[...] = xs[0].reshape(y.shape)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        if gxs[0] is not None and not same_memory(gxs[0], gy):
            gxs[0][...] = gy.reshape(gxs[0].shape)
