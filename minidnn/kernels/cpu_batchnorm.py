"""Batch normalization over the channels of (N, C, H, W) maps: the reference (written against
`xp`, NumPy; the same code runs on CuPy arrays). cuda_batchnorm.py is its GPU twin.

With M = N * H * W values per channel, mean and biased variance over them:

    batchnorm_stats(x, mean, var)                       mean, var: (C,), overwritten
    batchnorm_training_forward(x, weight, bias, y, mean, invstd, eps, running=None,
                               relu=False, residual=None)
        a training step's forward: the batch's mean and invstd = 1 / sqrt(var + eps) into
        mean, invstd (C,), then y as batchnorm_forward; running = (running_mean, running_var,
        momentum) moves the running estimates (below), None leaves them (a recomputation)
    batchnorm_forward(x, mean, invstd, weight, bias, y, relu=False, residual=None)
        y = (x - mean) * invstd * weight + bias, computed as x * scale + shift; relu: then
        max(y, 0), the ReLU after the batch norm (minidnn/fusion.py); residual = (z,
        stored): then max(y + z, 0), y rounded to `stored` first (the maps' dtype; None:
        y's), the residual add after the batch norm and its ReLU, add_relu's bits
    batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias, relu=None,
                       sums=None)
        the gradients of a training-mode forward (mean, invstd the batch's):
        gbias = sum gy, gweight = sum gy * xhat   (xhat = (x - mean) * invstd)
        gx = weight * invstd * (gy - gbias / M - xhat * gweight / M)   (gx may be None)
        relu = (bias, stored): the ReLU after the batch norm folded in (minidnn/fusion.py):
        gy is that ReLU's output gradient, masked first as relu_mask masks it;
        sums: handed_sums's, the sums of gy taken already
    handed_sums(y, ay, a2, g, x, mean) -> sums
        the backward of the residual add after the batch norm and its ReLU (y its output,
        ay its output gradient, a2 that gradient's second part or None): its gradient into
        g as cpu.relu_mask_sum (cpu.relu_backward without a2) writes it, and the sums the
        batch norm's backward takes of g as its gy (minidnn/fusion.py, bn_sums)
    relu_mask(x, gy, mean, invstd, weight, bias, stored=None)
        gy *= (y > 0) in place, y = batchnorm_forward's output recomputed from x and stored
        as `stored` (the maps' dtype: bfloat16 under mixed precision, where a positive value
        too small for bf16 is stored as 0; None: x's): the ReLU's backward, with its
        cpu.relu_backward's arithmetic (a product), so the same bits as the two layers

Sums accumulate in float64 whatever the maps' dtype, so that float32 statistics of large
batches keep their digits; the results are written in the arrays' own dtype.
"""
from __future__ import annotations

from ..backend import get_array_module
from . import cpu


def _per_channel(v):
    """(C,) -> (1, C, 1, 1), to broadcast over (N, C, H, W)."""
    return v.reshape(1, -1, 1, 1)


def batchnorm_stats(x, mean, var) -> None:
    """mean and biased variance of each channel of x (N, C, H, W) into mean, var (C,)."""
    xp = get_array_module(x)
    axes = (0, 2, 3)
    m = x.mean(axis=axes, dtype=xp.float64)
    centred = x - _per_channel(m).astype(x.dtype)
    var[...] = xp.square(centred, out=centred).mean(axis=axes, dtype=xp.float64)
    mean[...] = m


def batchnorm_training_forward(x, weight, bias, y, mean, invstd, eps: float,
                               running=None, relu: bool = False, residual=None) -> None:
    """The batch's statistics, y, and (when running is given) the running estimates moved
    as PyTorch moves them: r = (1 - momentum) * r + momentum * v, with the unbiased variance
    var * M / (M - 1) for running_var. Arrays in x's dtype; eps, momentum: floats. relu: y
    then goes through the ReLU after the batch norm (minidnn/fusion.py)."""
    xp = get_array_module(x)
    dt = x.dtype.type
    var = xp.empty_like(mean)
    batchnorm_stats(x, mean, var)
    xp.add(var, dt(eps), out=invstd)
    xp.sqrt(invstd, out=invstd)
    xp.reciprocal(invstd, out=invstd)
    batchnorm_forward(x, mean, invstd, weight, bias, y, relu, residual)
    if running is not None:
        running_mean, running_var, momentum = running
        count = x.size // x.shape[1]
        keep, m = dt(1.0 - momentum), dt(momentum)
        running_mean *= keep
        running_mean += m * mean
        running_var *= keep
        running_var += (m * dt(count / (count - 1))) * var


def batchnorm_forward(x, mean, invstd, weight, bias, y, relu: bool = False,
                      residual=None) -> None:
    """y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale; then
    relu_forward(y, y) with relu (the ReLU layer's own kernel: the same bits); with residual
    = (z, stored), y rounded to `stored` (None: y's dtype), then add_relu(y, z, y): the
    batch norm's output as stored, then the add and the ReLU after it, their kernel."""
    xp = get_array_module(x)
    scale = invstd * weight
    shift = bias - mean * scale
    xp.multiply(x, _per_channel(scale), out=y)
    y += _per_channel(shift)
    if residual is not None:
        z, stored = residual
        if stored is not None and xp.dtype(stored) != y.dtype:
            y[...] = y.astype(stored)          # a widened call: as the map stores it
        cpu.add_relu(y, z, y)       # the add's own kernel: the same bits
    elif relu:
        cpu.relu_forward(y, y)


def _relu_passes(x, mean, invstd, weight, bias, stored):
    """Where the ReLU after the batch norm passed its gradient: its output > 0, the batch
    norm's output recomputed from x with batchnorm_forward's operations (the forward's bits)
    and stored as `stored` (None: x's dtype)."""
    xp = get_array_module(x)
    y = xp.empty_like(x)
    batchnorm_forward(x, mean, invstd, weight, bias, y)
    if stored is not None and xp.dtype(stored) != y.dtype:
        y = y.astype(stored)
    return y > 0


def relu_mask(x, gy, mean, invstd, weight, bias, stored=None) -> None:
    """gy (in place) = gy * (y > 0): the backward of the ReLU after the batch norm (see the
    module docstring)."""
    xp = get_array_module(x)
    xp.multiply(gy, _relu_passes(x, mean, invstd, weight, bias, stored), out=gy)


def _gradient_sums(x, gy, mean) -> tuple:
    """(sum gy, sum gy * (x - mean)) per channel, float64 (C,) each, and x - mean."""
    xp = get_array_module(x)
    axes = (0, 2, 3)
    centred = x - _per_channel(mean)
    return (gy.sum(axis=axes, dtype=xp.float64),
            (gy * centred).sum(axis=axes, dtype=xp.float64)), centred


def handed_sums(y, ay, a2, g, x, mean) -> tuple:
    """g = (ay + a2) * (y > 0) (a2 None: ay * (y > 0)), the add's gradient, then the sums
    of g that batchnorm_backward takes (see the module docstring)."""
    if a2 is None:
        cpu.relu_backward(y, ay, g)
    else:
        cpu.relu_mask_sum(y, ay, a2, g)
    return _gradient_sums(x, g, mean)[0]


def batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias, relu=None,
                       sums=None) -> None:
    """Training-mode gradients (see the module docstring); gweight, gbias, gx overwritten.
    relu: None, or (bias, stored) to mask gy first (relu_mask), on a copy. sums:
    handed_sums's of gy (no relu)."""
    xp = get_array_module(x)
    if relu is not None:
        if sums is not None:
            raise ValueError("handed sums are of a gradient no ReLU masks")
        gy = xp.multiply(gy, _relu_passes(x, mean, invstd, weight, *relu))
    count = x.size // x.shape[1]
    if sums is None:
        (sum_gy, sum_gy_centred), centred = _gradient_sums(x, gy, mean)
    else:
        (sum_gy, sum_gy_centred), centred = sums, x - _per_channel(mean)
    istd = invstd.astype(xp.float64)
    gbias[...] = sum_gy
    gweight[...] = sum_gy_centred * istd
    if gx is None:
        return
    # gx = a * gy + b * (x - mean) + c per channel, from the formula above.
    a = weight.astype(xp.float64) * istd
    b = -a * istd * istd * sum_gy_centred / count
    c = -a * sum_gy / count
    xp.multiply(gy, _per_channel(a.astype(x.dtype)), out=gx)
    centred *= _per_channel(b.astype(x.dtype))
    gx += centred
    gx += _per_channel(c.astype(x.dtype))
