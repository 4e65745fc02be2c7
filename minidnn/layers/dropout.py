"""Inverted dropout: in training y = x * mask / (1 - p) with mask ~ Bernoulli(1 - p); in
evaluation (and for p = 0, or a step run with dropout off: StepContext.dropout) the identity.

The mask (1 byte per value) is the aux buffer 'mask' and is drawn from `ctx.rng(self)`, seeded
by (seed, step, layer index), so a resumed run draws the same masks; a micro-batch takes its
rows of the whole batch's mask (StepContext.uniform_rows), so splitting a batch keeps them.
The draws and the generator making them lie in the call's scratch block, which the memory
manager plans and counts (layers/draws.py). Backward reads only the mask, so the layer runs
in place.
"""
from __future__ import annotations

import numpy as np

from ..backend import same_memory
from ..errors import ConfigError
from .base import Layer


class Dropout(Layer):
    kind = "dropout"
    inplace = True
    kernel_ops = ("scale_by_mask",)

    def __init__(self, p: float = 0.5, name: str | None = None):
        super().__init__(name)
        if not 0.0 <= float(p) < 1.0:
            raise ConfigError(f"Dropout {name!r}: p must be in [0, 1), got {p!r}")
        self.p = float(p)

    def infer(self, in_shapes):
        return in_shapes[0]

    def aux_specs(self):
        return {"mask": (self.in_shapes[0], np.bool_)}

    def random_draws(self, phase: str):
        """Forward draws one number per value (in a scratch block the manager hands it)."""
        return self.in_shapes[0] if phase == "forward" and self.p > 0 else None

    def _active(self, ctx) -> bool:
        return ctx.train and ctx.dropout and self.p > 0

    def forward(self, xs, y, aux, ctx):
        """x, y, aux['mask']: same shape; y may be x itself."""
        xp = ctx.xp
        x = xs[0]
        if not self._active(ctx):
            if not same_memory(x, y):
                y[...] = x
            return
        mask = aux["mask"]
        # float32 draws whatever the layer's dtype: the same mask in float32 and float64 runs;
        # the rows of the whole batch's draws, so a micro-batch has its rows of the same mask.
        draws = ctx.uniform_rows(self, mask.shape)
        xp.greater_equal(draws, np.float32(self.p), out=mask)
        ctx.kernels.scale_by_mask(x, mask, y, 1.0 / (1.0 - self.p))

    def backward(self, xs, y, gy, gxs, aux, ctx):
        gx = gxs[0]
        if gx is None:
            return
        if not self._active(ctx):
            if not same_memory(gx, gy):
                gx[...] = gy
            return
        ctx.kernels.scale_by_mask(gy, aux["mask"], gx, 1.0 / (1.0 - self.p))

    def flops(self):
        return int(np.prod(self.out_shape))

    def describe(self):
        return f"p {self.p:g}"
