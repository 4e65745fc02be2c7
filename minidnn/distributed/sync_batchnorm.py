"""Synchronized batch normalization: the statistics of the whole global batch on every rank.

Plain data parallelism normalizes each rank's rows with the mean and variance of those rows
alone: N ranks at a global batch B train N networks of batch B / N, which is a different
network from one process at batch B (and a small share can give wild statistics). With
`--sync-batchnorm` every BatchNorm2d sums its per-channel statistics over the ranks, so N
ranks at batch B compute what one process computes at batch B (up to the order of the sums).

Forward, rank r with m values per channel and M = N * m over the run:

    mean_r, var_r   this rank's, by the device's own kernel (batchnorm_stats)
    mean  = sum_r m * mean_r / M                                   one all-reduce of C values
    var   = sum_r m * (var_r + (mean_r - mean)^2) / M              a second one: the spread of
                                                                   each part around the whole
                                                                   mean, no cancellation
    y     = (x - mean) / sqrt(var + eps) * weight + bias           the device's affine kernel
    running estimates move with mean and var * M / (M - 1)

Backward, with gy this rank's gradient of its own loss (the mean over its rows):

    gbias_r = sum gy,  gweight_r = sum gy * xhat      the device's kernel, this rank's rows:
                                                      the buckets' all-reduce averages them
    G1, G2  = sum_r gbias_r, sum_r gweight_r          one all-reduce of 2 C values
    gx      = weight * invstd * (gy - G1 / M - xhat * G2 / M)
            = gy * a + d + (x - mean) * b             two passes of the affine kernel

Why gx is right: the run minimises the mean of the ranks' losses L = (1/N) sum_r L_r. Every
term above is linear in gy, and each rank's gy is N times the gradient of L at its rows, so
each rank's gx is N times the gradient of L at its x, as its parameter gradients are; the
all-reduce's division by N (mean.py) then gives the gradient of L. PyTorch's SyncBatchNorm
computes the same.

Per-channel figures are combined in float64. Every rank calls the all-reduces in the same
order (all run the same schedule), and on the CPU they go through the gradient buckets'
worker thread (cpu_collective.CpuReducer.all_reduce_now), on a GPU through the NCCL stream
(nccl.NcclReducer.all_reduce_now), so they never interleave with a bucket's. A recomputation
in backward (running None) asks for the statistics again and leaves the running estimates
alone, as the layer does. Not counted by the step's memory model: a (C,)-sized handful of
arrays, and in backward one temporary the size of the layer's input (`part`).
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module as _xp


class SyncBatchStatistics:
    """Batch-norm kernels whose statistics are the global batch's: what a BatchNorm2d calls
    in training instead of its device's kernels while its `statistics_sync` is set. The same
    functions and arguments as kernels/cpu_batchnorm.py, built on the device's own kernels.
    reducer.all_reduce_now(arrays) sums float64 device arrays in place over `ranks` ranks.
    """

    def __init__(self, reducer, ranks: int):
        self.reducer = reducer
        self.ranks = int(ranks)

    def _sum(self, *arrays):
        """The arrays (float64, (C,) each) summed over the ranks, stacked: (len(arrays), C)."""
        both = _xp(arrays[0]).stack(arrays)
        self.reducer.all_reduce_now([both])
        return both

    def batchnorm_forward(self, x, mean, invstd, weight, bias, y, relu: bool = False,
                          residual=None) -> None:
        """The device's kernel: y = (x - mean) * invstd * weight + bias (no statistics)."""
        _kernels(x).batchnorm_forward(x, mean, invstd, weight, bias, y, relu, residual)

    def batchnorm_training_forward(self, x, weight, bias, y, mean, invstd, eps: float,
                                   running=None, relu: bool = False, residual=None) -> None:
        """As the kernels' batchnorm_training_forward with the statistics of every rank's rows:
        x, y (N, C, H, W) this rank's; mean, invstd (C,) written; running = (running_mean,
        running_var, momentum) moved with the global figures, None leaves them."""
        xp, dt, k = _xp(x), x.dtype.type, _kernels(x)
        rows = x.size // x.shape[1]
        count = rows * self.ranks
        var = xp.empty_like(mean)
        k.batchnorm_stats(x, mean, var)
        own_mean = mean.astype(xp.float64)
        whole_mean = self._sum(own_mean * rows)[0] / count
        spread = (var.astype(xp.float64) + xp.square(own_mean - whole_mean)) * rows
        var[...] = self._sum(spread)[0] / count
        mean[...] = whole_mean
        xp.reciprocal(xp.sqrt(var + dt(eps)), out=invstd)
        k.batchnorm_forward(x, mean, invstd, weight, bias, y, relu, residual)
        if running is not None:   # as the kernels move them, with the whole batch's count
            running_mean, running_var, momentum = running
            unbiased = dt(momentum) * dt(count / (count - 1))
            for estimate, rate, value in ((running_mean, dt(momentum), mean),
                                          (running_var, unbiased, var)):
                estimate *= dt(1.0 - momentum)
                estimate += rate * value

    def batchnorm_backward(self, x, gy, mean, invstd, weight, gx, gweight, gbias) -> None:
        """As the kernels' batchnorm_backward (see the module docstring): gweight, gbias (C,)
        this rank's sums; gx (N, C, H, W, or None) from the sums over every rank."""
        xp, k = _xp(x), _kernels(x)
        k.batchnorm_backward(x, gy, mean, invstd, weight, None, gweight, gbias)
        if gx is None:   # the same on every rank (one schedule): none skips an all-reduce alone
            return
        count = (x.size // x.shape[1]) * self.ranks
        g1, g2 = self._sum(gbias.astype(xp.float64), gweight.astype(xp.float64))
        istd = invstd.astype(xp.float64)
        a = weight.astype(xp.float64) * istd
        b = (-a * istd * g2 / count).astype(x.dtype)
        d = (-a * g1 / count).astype(x.dtype)
        ones, zeros = xp.ones_like(mean), xp.zeros_like(mean)
        k.batchnorm_forward(x, mean, ones, b, zeros, gx)            # (x - mean) * b
        part = xp.empty_like(gx)
        k.batchnorm_forward(gy, zeros, ones, a.astype(x.dtype), d, part)   # gy * a + d
        gx += part


def _kernels(x):
    """The batch-norm kernels of x's device."""
    if _xp(x) is np:
        from ..kernels import cpu_batchnorm
        return cpu_batchnorm
    from ..kernels import cuda_batchnorm
    return cuda_batchnorm


def synchronize_batchnorm(net, reducer, ranks: int) -> list[str]:
    """Make every batch-statistics layer of `net` (BatchNorm2d) use the global batch's
    statistics through `reducer`; returns their names. `unsynchronize(net)` undoes it."""
    sync = SyncBatchStatistics(reducer, ranks)
    names = []
    for node in net.nodes:
        if hasattr(node.layer, "statistics_sync"):
            node.layer.statistics_sync = sync
            names.append(node.name)
    return names


def unsynchronize(net) -> None:
    """Every batch-statistics layer of `net` back to its own rows' statistics."""
    for node in net.nodes:
        if getattr(node.layer, "statistics_sync", None) is not None:
            node.layer.statistics_sync = None
