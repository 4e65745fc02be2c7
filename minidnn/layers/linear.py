"""Fully connected layer: y = x W^T + b, with W of shape (out, in) as in PyTorch."""
from __future__ import annotations

from ..errors import ConfigError
from . import precision as mixed
from .base import Layer
from .conv import check_init
from .slices import row_slices, sum_in_slices


class Linear(Layer):
    kind = "linear"
    recomputable = True
    retain_inputs = (0,)
    kernel_ops = ("linear_forward", "linear_backward")
    adds_in_place = ("weight",)    # the weight gradient's product adds (kernels: add)

    def __init__(self, out_features: int, bias: bool = True, init: str = "uniform_fan_in",
                 name: str | None = None):
        super().__init__(name)
        owner = f"Linear {name!r}" if name else "Linear"
        if isinstance(out_features, bool) or not isinstance(out_features, int) or \
                out_features <= 0:
            raise ConfigError(f"{owner}: out_features must be a positive int, got "
                              f"{out_features!r}")
        self.out_features = out_features
        self.bias = bool(bias)
        self.init = check_init(init, owner)

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 2:
            raise self.shape_error("(N, features); put a Flatten before it", s)
        n, f = s
        self.in_features = f
        self.add_param("weight", (self.out_features, f), self.init, fan_in=f)
        if self.bias:
            self.add_param("bias", (self.out_features,), "zeros" if self.init == "he_normal"
                           else self.init, fan_in=f)
        return (n, self.out_features)

    def forward(self, xs, y, aux, ctx):
        """x: (N, in), y: (N, out)."""
        b = self.params["bias"].data if self.bias else None
        x, w = xs[0], self.params["weight"].data
        y32 = mixed.output_buffer(ctx, y)     # where the GPU's bf16 product rounds from
        if ctx.batch_slice is None:
            ctx.kernels.linear_forward(x, w, b, y, y32)
            return
        for part in row_slices(x.shape[0], ctx.batch_slice):   # deterministic: slice by slice
            ctx.kernels.linear_forward(x[part], w, b, y[part],
                                       None if y32 is None else y32[part])

    def backward(self, xs, y, gy, gxs, aux, ctx):
        w = self.params["weight"]
        gb = self.params["bias"].grad if self.bias else None
        x, gx = xs[0], gxs[0]
        if ctx.params_gathered:       # the input gradient only (minidnn/gathered.py)
            if gx is not None:
                for part in row_slices(x.shape[0], ctx.batch_slice or x.shape[0]):
                    ctx.kernels.linear_backward(x[part], gy[part], w.data, None, None,
                                                gx[part])
            return
        if ctx.batch_slice is None:   # add_grads: the weight's gradient is added to
            ctx.kernels.linear_backward(x, gy, w.data, w.grad, gb, gx, ctx.add_grads)
            return
        # Deterministic (layers/slices.py): each slice's gx with its share of the gradients,
        # the weight's added in place after the first.
        def slice_gradients(part, out, adding):
            ctx.kernels.linear_backward(x[part], gy[part], w.data, out[0], out[1],
                                        None if gx is None else gx[part], adding)

        sum_in_slices(ctx, x.shape[0], [w.grad, gb], slice_gradients, in_place=(0,))

    def flops(self):
        return 2 * self.out_shape[0] * self.in_features * self.out_features

    def describe(self):
        return f"{getattr(self, 'in_features', '?')} -> {self.out_features}"
