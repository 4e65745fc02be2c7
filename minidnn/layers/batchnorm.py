"""Batch normalization over channels (Ioffe & Szegedy 2015), as PyTorch's BatchNorm2d defines it.

Training: each channel is normalized with the mean and biased variance of its N * H * W values
in this batch, y = (x - mean) / sqrt(var + eps) * weight + bias, and the running estimates
move towards them:

    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)   (unbiased)
    num_batches_tracked += 1

Evaluation: the running estimates take the batch statistics' place. momentum 0.1, eps 1e-5.
State dict names and layouts are PyTorch's: weight, bias (C,); buffers running_mean,
running_var (C,) and num_batches_tracked (an int64 scalar).

What backward keeps: the input x (retain_inputs) and the batch's mean and 1/sqrt(var + eps)
per channel (aux 'mean', 'invstd': C values each). The memory manager may offload x like any
retained map, and may drop the output and recompute it in backward: forward then runs with
aux=None, computes the batch statistics again from the same x (the same bytes reduced in the
same order give the same bits, on the CPU and with the GPU kernels of cuda_batchnorm.py, which
reduce in a fixed order) and leaves the running estimates alone, so they move once per step.

The ReLU after a batch norm may be folded into it (minidnn/fusion.py, ctx.relu_in_bn): forward
stores max(y, 0), and backward takes the ReLU's output gradient and masks it where that
output, recomputed from x with the forward's operations, is not positive. So may the residual
add after it and that add's ReLU (ctx.add_in_bn): forward then reads the add's other input z
as a second input and stores max(y + z, 0), y rounded as stored first; backward is unchanged.
In backward, that add may take the per-channel sums of the gradient it hands this layer in
the pass that writes it (GradientSums; minidnn/fusion.py, bn_sums): backward then starts
from those sums.

The statistics are the whole batch's (`batch_statistics`): a step split into micro-batches
would normalize each part with its own, which is a different network.

Deterministic mode (layers/slices.py). With whole-batch statistics the layer always sees the
whole batch (a split needs split_batch_statistics, and layer chunks leave batch norms out),
so its sums have the same operands in every plan and it runs as above. With split statistics
(ctx.statistics_slice) every slice of S images is normalized with its own statistics, in
every plan, split or not ("ghost" batches of S), and its running estimates move once per
slice; the gradients of weight and bias are summed over the slices in slice order. Backward
computes each slice's statistics again from x with the forward's own kernel (the aux buffers
hold one slice's), so they are the forward's bits.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ShapeError
from .base import Layer
from .slices import in_order, sum_in_slices


class GradientSums:
    """The per-channel sums a batch norm's backward takes of its output gradient (sum gy and
    sum gy * (x - mean)), taken instead by the residual add after it, in the pass that
    writes that gradient (minidnn/fusion.py, bn_sums). The executor makes one (with the
    batch norm's `gradient_sums`) for the add's backward and hands it on to the batch
    norm's, the next call.

    Args:
        kernels: the batch norm's kernels (cpu_batchnorm or cuda_batchnorm).
        x: the batch norm's input (N, C, H, W); mean: its batch mean (C,).
    """

    def __init__(self, kernels, x, mean):
        self._kernels, self._x, self._mean = kernels, x, mean
        self.sums = None

    def take(self, y, gy, addend, gx) -> None:
        """The add's backward: gx = (gy + addend) where y > 0, else 0 (addend None: gy
        there), all (N, C, H, W); and the sums of gx, kept for the batch norm."""
        self.sums = self._kernels.handed_sums(y, gy, addend, gx, self._x, self._mean)


class BatchNorm2d(Layer):
    kind = "batchnorm"
    retain_inputs = (0,)
    recomputable = True
    batch_statistics = True
    #: Kernels with the global batch's statistics in a data-parallel run under
    #: --sync-batchnorm (distributed/sync_batchnorm.py); None: the device's, this batch's.
    statistics_sync = None
    # Computed by cpu_batchnorm / cuda_batchnorm (_kernels), under these names.
    kernel_ops = ("batchnorm_training_forward", "batchnorm_forward", "batchnorm_backward")

    def __init__(self, eps: float = 1e-5, momentum: float = 0.1, name: str | None = None):
        super().__init__(name)
        if not eps > 0:
            raise ConfigError(f"BatchNorm2d {name!r}: eps must be positive, got {eps!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ConfigError(f"BatchNorm2d {name!r}: momentum must be in [0, 1], "
                              f"got {momentum!r}")
        self.eps, self.momentum = float(eps), float(momentum)

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 4:
            raise self.shape_error("(N, C, H, W)", s)
        c = s[1]
        self.add_param("weight", (c,), "ones")
        self.add_param("bias", (c,), "zeros")
        self.add_buffer("running_mean", (c,), "zeros")
        self.add_buffer("running_var", (c,), "ones")
        self.add_buffer("num_batches_tracked", (), "zeros", dtype=np.int64)
        return s

    def aux_specs(self):
        c = self.in_shapes[0][1]
        return {"mean": ((c,), self.dtype), "invstd": ((c,), self.dtype)}

    def _kernels(self, ctx):
        """The batch-norm kernels of the step's device (their own modules; see kernels/); in
        training under --sync-batchnorm, statistics_sync's (the global batch's statistics)."""
        if self.statistics_sync is not None and ctx.train:
            return self.statistics_sync
        return self._device_kernels(ctx)

    @staticmethod
    def _device_kernels(ctx):
        """The batch-norm kernels of the step's device."""
        if ctx.xp is np:
            from ..kernels import cpu_batchnorm
            return cpu_batchnorm
        from ..kernels import cuda_batchnorm
        return cuda_batchnorm

    def forward(self, xs, y, aux, ctx):
        """x, y: (N, C, H, W); aux['mean'], aux['invstd']: (C,), written in training. aux None:
        a recomputation in backward (statistics again from x, running estimates untouched).
        y then goes through the ReLU after this layer when ctx.relu_in_bn names it; through
        the add after it and its ReLU when ctx.add_in_bn does (xs[1]: the add's other input,
        (N, C, H, W))."""
        x, xp, k = xs[0], ctx.xp, self._kernels(ctx)
        w, b = self.params["weight"].data, self.params["bias"].data
        relu = self.name in ctx.relu_in_bn    # the ReLU after it too (minidnn/fusion.py)
        # (z, the maps' dtype): y is rounded as stored before z is added (minidnn/fusion.py)
        residual = (xs[1], ctx.stored_dtype(self.dtype)) \
            if self.name in ctx.add_in_bn else None
        if not ctx.train:
            running = self.buffers
            invstd = 1.0 / xp.sqrt(running["running_var"].data + self.dtype.type(self.eps))
            k.batchnorm_forward(x, running["running_mean"].data, invstd, w, b, y, relu,
                                residual)
            return
        rows = ctx.statistics_slice or x.shape[0]    # normalized with statistics of their own
        if rows * x[0, 0].size < 2:
            raise ShapeError(f"layer {self.name!r} (BatchNorm2d) needs more than one value per "
                             f"channel in training, got input shape {tuple(x.shape)}"
                             + (f" in slices of {rows}" if rows < x.shape[0] else ""))
        c = x.shape[1]
        # per-channel arrays in the layer's dtype (float32 beside bf16 maps)
        mean = aux["mean"] if aux is not None else xp.empty(c, self.dtype)
        invstd = aux["invstd"] if aux is not None else xp.empty(c, self.dtype)
        running = None
        if aux is not None:   # the step's own forward; a recomputation leaves them alone
            running = (self.buffers["running_mean"].data, self.buffers["running_var"].data,
                       self.momentum)
        if ctx.statistics_slice is None:
            if running is not None:
                self.buffers["num_batches_tracked"].data += 1
            k.batchnorm_training_forward(x, w, b, y, mean, invstd, self.eps, running, relu,
                                         residual)
            return
        for part in in_order(x.shape[0], rows):   # deterministic: each slice on its own
            if running is not None:
                self.buffers["num_batches_tracked"].data += 1
            k.batchnorm_training_forward(x[part], w, b, y[part], mean, invstd, self.eps,
                                         running, relu, residual and (residual[0][part],
                                                                      residual[1]))

    def gradient_sums(self, x, mean, ctx) -> GradientSums | None:
        """What the add after this layer fills with the sums of the gradient it hands on
        (x: this layer's input, mean: its aux 'mean'), for this layer's next backward; None
        where this backward would not start from them: under --sync-batchnorm (the sums are
        the global batch's) or with statistics of each slice (ctx.statistics_slice)."""
        if ctx.statistics_slice is not None or \
                self._kernels(ctx) is not self._device_kernels(ctx):
            return None
        return GradientSums(self._device_kernels(ctx), x, mean)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        """gy: the output gradient, or, when this layer applies the ReLU after it
        (ctx.relu_in_bn), that ReLU's output gradient, which the kernels mask where the
        ReLU's output (recomputed from x as forward computed it) is not positive. With
        ctx.gradient_sums (minidnn/fusion.py, bn_sums) the add before took gy's sums."""
        w = self.params["weight"]
        b = self.params["bias"]
        k, x, gx = self._kernels(ctx), xs[0], gxs[0]
        # (bias, the maps' dtype) for the kernels: the ReLU's output is recomputed, stored.
        relu = None
        if self.name in ctx.relu_in_bn:
            relu = (b.data, ctx.stored_dtype(self.dtype))
        if relu is not None and k is not self._device_kernels(ctx):
            # Statistics from elsewhere (--sync-batchnorm): the ReLU's backward first.
            self._device_kernels(ctx).relu_mask(x, gy, aux["mean"], aux["invstd"], w.data,
                                                *relu)
            relu = None
        through = {} if relu is None else {"relu": relu}
        if ctx.gradient_sums is not None:    # whole-batch statistics, this batch norm's kernels
            through["sums"] = ctx.gradient_sums.sums
        if ctx.batch_slice is None:
            k.batchnorm_backward(x, gy, aux["mean"], aux["invstd"], w.data, gx, w.grad, b.grad,
                                 **through)
            return
        if ctx.statistics_slice is None:
            # Deterministic with whole-batch statistics: the call is the whole batch, one slice.
            def whole_batch(part, out):
                k.batchnorm_backward(x, gy, aux["mean"], aux["invstd"], w.data, gx, *out,
                                     **through)

            sum_in_slices(ctx, x.shape[0], [w.grad, b.grad], whole_batch, size=x.shape[0])
            return
        mean, invstd = ctx.xp.empty_like(aux["mean"]), ctx.xp.empty_like(aux["invstd"])

        def slice_gradients(part, out):
            # The slice's statistics again, as forward made them; its normalized values go
            # to gx's rows (or a temporary), which the gradient then overwrites.
            scratch = gx[part] if gx is not None else ctx.xp.empty_like(x[part])
            k.batchnorm_training_forward(x[part], w.data, b.data, scratch, mean, invstd,
                                         self.eps)
            k.batchnorm_backward(x[part], gy[part], mean, invstd, w.data,
                                 None if gx is None else gx[part], *out, **through)

        sum_in_slices(ctx, x.shape[0], [w.grad, b.grad], slice_gradients,
                      size=ctx.statistics_slice)

    def flops(self):
        # statistics (sum, square, sum) and the scale and shift.
        return 5 * int(np.prod(self.out_shape))

    def describe(self):
        return f"eps {self.eps:g}, momentum {self.momentum:g}"
