"""Synchronized batch normalization: the statistics of the whole global batch on every rank.

Plain data parallelism normalizes each rank's rows with the mean and variance of those rows
alone: N ranks at a global batch B train N networks of batch B / N, which is a different
network from one process at batch B (and a small share can give wild statistics). With
`--sync-batchnorm` every BatchNorm2d sums its per-channel statistics over the ranks, so N
ranks at batch B compute what one process computes at batch B (up to the order of the sums).

Forward, with m values per channel on each rank and M = N * m over the run:

    mean  = (sum over ranks of sum x) / M                      one all-reduce of C values
    var   = (sum over ranks of sum (x - mean)^2) / M           a second one (two passes, as
                                                               one process computes it)
    y     = (x - mean) / sqrt(var + eps) * weight + bias       the layer's own kernel
    running estimates move with mean and var * M / (M - 1)

Backward, with gy this rank's gradient of its own loss (the mean over its rows):

    gbias   = sum gy,  gweight = sum gy * xhat                 this rank's sums: the buckets'
                                                               all-reduce then averages them
    g1, g2  = the same two sums over all ranks                 one all-reduce of 2 C values
    gx      = weight * invstd * (gy - g1 / M - xhat * g2 / M)

Why gx is right: the run minimises the mean of the ranks' losses L = (1/N) sum_r L_r. Every
term above is linear in gy, and each rank's gy is N times the gradient of L at its rows, so
each rank's gx is N times the gradient of L at its x, as its parameter gradients are; the
all-reduce's division by N (mean.py) then gives the gradient of L. PyTorch's SyncBatchNorm
computes the same.

Sums run in float64 whatever the maps' dtype (as kernels/cpu_batchnorm.py). Every rank calls
the all-reduces in the same order (all run the same schedule), and on the CPU they go through
the gradient buckets' worker thread (cpu_collective.CpuReducer.all_reduce_now), on a GPU
through the NCCL stream (nccl.NcclReducer.all_reduce_now), so they never interleave with a
bucket's. A recomputation in backward (aux None) asks for the statistics again and leaves
the running estimates alone, as the layer does.
"""
from __future__ import annotations

_AXES = (0, 2, 3)   # every axis of (N, C, H, W) but the channels


def _per_channel(v):
    """(C,) -> (1, C, 1, 1), to broadcast over (N, C, H, W)."""
    return v.reshape(1, -1, 1, 1)


class SyncBatchStatistics:
    """Batch-norm kernels whose statistics are the global batch's: what a BatchNorm2d calls
    in training instead of its device's kernels while its `statistics_sync` is set. The same
    functions and arguments as kernels/cpu_batchnorm.py; the per-value passes are the
    device's own kernels or the same formulas. reducer.all_reduce_now(arrays) sums float64
    device arrays in place over the `ranks` ranks.
    """

    def __init__(self, reducer, ranks: int):
        self.reducer = reducer
        self.ranks = int(ranks)

    def _sum(self, *arrays):
        """The arrays (float64, (C,) each) summed over the ranks, stacked: (len(arrays), C)."""
        both = _xp(arrays[0]).stack(arrays)
        self.reducer.all_reduce_now([both])
        return both

    def batchnorm_training_forward(self, x, weight, bias, y, mean, invstd, eps: float,
                                   running=None, relu: bool = False) -> None:
        """As the kernels' batchnorm_training_forward with the statistics of every rank's rows:
        x, y (N, C, H, W) this rank's; mean, invstd (C,) written; running = (running_mean,
        running_var, momentum) moved with the global figures, None leaves them."""
        xp, dt = _xp(x), x.dtype.type
        c = x.shape[1]
        count = (x.size // c) * self.ranks
        mean[...] = self._sum(x.sum(axis=_AXES, dtype=xp.float64))[0] / count
        centred = x - _per_channel(mean)
        squares = xp.square(centred, out=centred).sum(axis=_AXES, dtype=xp.float64)
        var = (self._sum(squares)[0] / count).astype(x.dtype)
        xp.add(var, dt(eps), out=invstd)
        xp.sqrt(invstd, out=invstd)
        xp.reciprocal(invstd, out=invstd)
        _kernels(x).batchnorm_forward(x, mean, invstd, weight, bias, y, relu)
        if running is not None:
            running_mean, running_var, momentum = running
            keep, m = dt(1.0 - momentum), dt(momentum)
            running_mean *= keep
            running_mean += m * mean
            running_var *= keep
            running_var += (m * dt(count / (count - 1))) * var

    def batchnorm_backward(self, x, gy, mean, invstd, weight, gx, gweight, gbias) -> None:
        """As the kernels' batchnorm_backward (see the module docstring): gweight, gbias (C,)
        this rank's sums; gx (N, C, H, W, or None) from the sums over every rank."""
        xp = _xp(x)
        count = (x.size // x.shape[1]) * self.ranks
        centred = x - _per_channel(mean)
        sum_gy = gy.sum(axis=_AXES, dtype=xp.float64)
        sum_gy_centred = (gy * centred).sum(axis=_AXES, dtype=xp.float64)
        istd = invstd.astype(xp.float64)
        gbias[...] = sum_gy
        gweight[...] = sum_gy_centred * istd
        if gx is None:   # the same on every rank (one schedule): none skips an all-reduce alone
            return
        g1, g2 = self._sum(sum_gy, sum_gy_centred)
        a = weight.astype(xp.float64) * istd
        b = -a * istd * istd * g2 / count
        d = -a * g1 / count
        xp.multiply(gy, _per_channel(a.astype(x.dtype)), out=gx)
        centred *= _per_channel(b.astype(x.dtype))
        gx += centred
        gx += _per_channel(d.astype(x.dtype))


def _kernels(x):
    """The batch-norm kernels of x's device (for the affine pass)."""
    import numpy as np
    if _xp(x) is np:
        from ..kernels import cpu_batchnorm
        return cpu_batchnorm
    from ..kernels import cuda_batchnorm
    return cuda_batchnorm


def _xp(a):
    from ..backend import get_array_module
    return get_array_module(a)


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
