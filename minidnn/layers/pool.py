"""2-D max and average pooling (PyTorch's semantics, ceil_mode included).

Neither keeps a feature map for backward: max pooling keeps a 1-byte argmax per output (the
winner's offset inside its window), average pooling needs nothing at all.

A max pool after a ReLU may apply that ReLU's mask in its own backward (minidnn/fusion.py,
the decision's pool_relu): its forward then marks, in bit 7 of each argmax, the windows whose
maximum is > 0, and its backward routes a window's gradient only where the bit is set. That
needs windows of at most 128 positions, so that an offset fits in the other 7 bits. It may
apply the ReLU's forward too (pool_relu_forward): it then reads the ReLU's input.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..kernels import PoolSpec, out_size, relu_mask_fits
from .base import Layer
from .conv import as_pair


class _Pool2d(Layer):
    kind = "pool"
    recomputable = True

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 name: str | None = None):
        super().__init__(name)
        owner = f"{type(self).__name__} {name!r}" if name else type(self).__name__
        self.kernel_size = as_pair(kernel_size, "kernel_size", owner, 1)
        self.stride = self.kernel_size if stride is None else as_pair(stride, "stride", owner, 1)
        self.padding = as_pair(padding, "padding", owner, 0)
        if any(p > k // 2 for p, k in zip(self.padding, self.kernel_size)):
            raise ConfigError(f"{owner}: padding {self.padding} must be at most half the kernel "
                              f"{self.kernel_size} (so that every window holds an input value)")
        self.ceil_mode = bool(ceil_mode)

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 4:
            raise self.shape_error("(N, C, H, W)", s)
        n, c, h, w = s
        oh, ow = (out_size(size, k, st, p, ceil_mode=self.ceil_mode) for size, k, st, p in
                  zip((h, w), self.kernel_size, self.stride, self.padding))
        if oh < 1 or ow < 1:
            raise self.shape_error(f"a padded size (H + 2*{self.padding[0]}, W + 2*"
                                   f"{self.padding[1]}) of at least the kernel {self.kernel_size}", s)
        return (n, c, oh, ow)

    def flops(self):
        # One comparison or addition per window element and output.
        kh, kw = self.kernel_size
        return int(np.prod(self.out_shape)) * kh * kw

    def describe(self):
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        text = f"{kh}x{kw} s{sh if sh == sw else self.stride}"
        if self.padding != (0, 0):
            text += f" p{self.padding[0] if self.padding[0] == self.padding[1] else self.padding}"
        if self.ceil_mode:
            text += " ceil"
        return text


class MaxPool2d(_Pool2d):
    """Window maximum. aux 'argmax' (uint8, output shape) = kh * KW + kw of the first maximum."""
    recomputable = False      # its kernels write the argmax with the output
    kernel_ops = ("maxpool2d_forward", "maxpool2d_backward")

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 name: str | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode, name)
        kh, kw = self.kernel_size
        if kh * kw > 256:
            raise ConfigError(f"MaxPool2d {name!r}: a {kh}x{kw} window has more positions than "
                              f"its uint8 argmax can name (at most 256)")

    @property
    def spec(self) -> PoolSpec:
        return PoolSpec(kernel=self.kernel_size, stride=self.stride, padding=self.padding,
                        ceil_mode=self.ceil_mode)

    @property
    def masks_relu_before(self) -> bool:
        """Whether its backward may apply the mask of the ReLU before it: the window's offsets
        leave the argmax's bit 7 free (module docstring)."""
        return relu_mask_fits(self.kernel_size)

    def aux_specs(self):
        return {"argmax": (self.out_shape, np.uint8)}

    def forward(self, xs, y, aux, ctx):
        """x (N, C, H, W) -> y (N, C, OH, OW), argmax (N, C, OH, OW) uint8; bit 7 of argmax
        set where y > 0 when this pool applies the ReLU's mask (ctx.relu_in_pool). When it
        applies the ReLU before it (ctx.relu_before_pool), x is that ReLU's input, and the
        windows hold the ReLU's values, its bias added (ctx.relu_bias), stored as the maps
        store them (ctx.maps)."""
        relu = ctx.relu_before_pool.get(self.name)
        rectify = None
        if relu is not None:
            bias = ctx.relu_bias.get(relu)
            rectify = (None if bias is None else bias.data, ctx.stored_dtype(self.dtype))
        ctx.kernels.maxpool2d_forward(xs[0], y, aux["argmax"], self.spec,
                                      relu=self.name in ctx.relu_in_pool, rectify=rectify)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        """gx (N, C, H, W) = gy routed to each window's winner; only where the window's
        maximum is > 0 when this pool applies the ReLU's mask: the ReLU's backward, done.
        When it sums the gradient of the bias that ReLU added (ctx.pool_bias), that too."""
        bias = ctx.pool_bias.get(self.name)
        if gxs[0] is None:
            if bias is not None:
                raise ValueError(f"MaxPool2d {self.name!r} sums a bias gradient but gets no "
                                 f"input gradient")
            return
        ctx.kernels.maxpool2d_backward(gy, aux["argmax"], gxs[0], self.spec,
                                       relu=self.name in ctx.relu_in_pool,
                                       gb=None if bias is None else bias.grad)


class AvgPool2d(_Pool2d):
    """Window mean over zero padding; count_include_pad=False divides by the input values only."""
    kernel_ops = ("avgpool2d_forward", "avgpool2d_backward")

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, name: str | None = None):
        super().__init__(kernel_size, stride, padding, ceil_mode, name)
        self.count_include_pad = bool(count_include_pad)

    @property
    def spec(self) -> PoolSpec:
        return PoolSpec(kernel=self.kernel_size, stride=self.stride, padding=self.padding,
                        ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad)

    def forward(self, xs, y, aux, ctx):
        """x (N, C, H, W) -> y (N, C, OH, OW)."""
        ctx.kernels.avgpool2d_forward(xs[0], y, self.spec)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        if gxs[0] is not None:
            ctx.kernels.avgpool2d_backward(gy, gxs[0], self.spec)

    def describe(self):
        text = super().describe()
        return text if self.count_include_pad or self.padding == (0, 0) else text + " excl-pad"
