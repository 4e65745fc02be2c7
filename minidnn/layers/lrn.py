"""Local response normalization across channels (AlexNet), PyTorch's LocalResponseNorm:

    scale = k + alpha / size * sum of x**2 over `size` neighbouring channels (centred, zero-padded)
    y = x * scale**-beta

Backward needs x and the scale (kept as the aux buffer 'scale'), not y: y / scale is
x * scale**(-beta - 1). Keeping the input rather than the output is the cheaper choice in
AlexNet, where the input is a ReLU's output that ReLU's own backward keeps anyway, and it leaves
the output free to be overwritten by an in-place layer after it.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..kernels import LRNSpec
from .base import Layer


class LRN(Layer):
    kind = "lrn"
    retain_inputs = (0,)
    kernel_ops = ("lrn_forward", "lrn_backward")

    def __init__(self, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0,
                 name: str | None = None):
        super().__init__(name)
        owner = f"LRN {name!r}" if name else "LRN"
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"{owner}: size must be a positive int, got {size!r}")
        if k <= 0 or alpha < 0:
            # scale must stay positive for scale**-beta to be defined.
            raise ConfigError(f"{owner}: needs k > 0 and alpha >= 0, got k={k}, alpha={alpha}")
        self.spec = LRNSpec(size=size, alpha=float(alpha), beta=float(beta), k=float(k))

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 4:
            raise self.shape_error("(N, C, H, W)", s)
        return s

    def aux_specs(self):
        return {"scale": (self.in_shapes[0], self.dtype)}

    def forward(self, xs, y, aux, ctx):
        """x, y, aux['scale']: (N, C, H, W)."""
        ctx.kernels.lrn_forward(xs[0], y, aux["scale"], self.spec)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        if gxs[0] is not None:
            # y is not retained (see the module docstring); the kernel does not read it.
            ctx.kernels.lrn_backward(xs[0], None, aux["scale"], gy, gxs[0], self.spec)

    def flops(self):
        # square, window sum, scale, power (counted as one), multiply.
        return int(np.prod(self.out_shape)) * (self.spec.size + 4)

    def describe(self):
        s = self.spec
        return f"size {s.size}, alpha {s.alpha:g}, beta {s.beta:g}, k {s.k:g}"
