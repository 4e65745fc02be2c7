"""Reference kernels written against `xp` (NumPy; they also run on CuPy arrays).

See kernels/__init__.py for the ops and their shapes. Every op writes into the arrays it is
given and returns nothing.

How they stay fast without a loop over pixels or images:
* Convolution is im2col + one matrix product per group. The columns are laid out
  (groups, C/groups * KH * KW, n * OH * OW), so each group is one large GEMM rather than n
  small ones; they are filled by one strided-slice copy per kernel offset (kh, kw).
  col2im adds the same strided slices back.
* Pooling and LRN loop only over the window offsets (KH * KW, or the LRN size), each step a
  whole-array operation on a strided slice.
* The batch is processed in chunks so that the temporaries (padded input, columns) stay below
  `TEMP_BUDGET` elements whatever the batch size; every temporary keeps the input's dtype.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..backend import get_array_module
from ..errors import ConfigError
from . import RELU_MASK_BIT, RELU_MASK_POSITIONS, mapformat, relu_mask_fits
from .mapformat import pointwise_views

# Largest temporary (in elements) an op builds per batch chunk: 64 MiB of float32. One image
# whose temporary is larger still goes through alone.
TEMP_BUDGET = 1 << 24

#: The ops that take bf16 feature maps themselves (mixed precision). None here: on the CPU a
#: layer sees bf16 maps widened to float32 and rounds its outputs (layers/precision.py).
BF16_OPS = mapformat.BF16_OPS["cpu"]


def shared_weight_copies(lasting=None):
    """A context for the passes of one batch, in which the GPU's bf16 products share one bf16
    copy of each weight (kernels/cuda_weights.py); nothing to share here."""
    return contextlib.nullcontext()


# ---- helpers -----------------------------------------------------------------------------------
def _batch_chunks(n: int, per_image: int):
    """(start, stop) ranges over the batch whose temporaries fit in TEMP_BUDGET elements."""
    step = max(1, TEMP_BUDGET // max(int(per_image), 1))
    for start in range(0, n, step):
        yield start, min(n, start + step)


def _window(offset: int, stride: int, count: int) -> slice:
    """The `count` positions offset, offset + stride, ... along one padded axis."""
    return slice(offset, offset + stride * (count - 1) + 1, stride)


def _padded_extent(size: int, pad: int, kernel: int, stride: int, dilation: int, out: int) -> int:
    """Length of the padded axis: both paddings, and more on the far side when a last window
    (ceil_mode) reaches past it."""
    return max(size + 2 * pad, (out - 1) * stride + dilation * (kernel - 1) + 1)


def _pad(x, pads: tuple, extents: tuple, fill=0.0, channels_first: bool = False):
    """x (n, C, H, W) placed at offset `pads` in an array of spatial size `extents`, the rest
    `fill`. channels_first=True returns the (C, n, Hp, Wp) layout the convolution uses. With
    nothing to pad, returns a view of x (no copy)."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    (ph, pw), (hp, wp) = pads, extents
    src = x.transpose(1, 0, 2, 3) if channels_first else x
    if ph == 0 and pw == 0 and hp == h and wp == w:
        return src
    shape = (c, n, hp, wp) if channels_first else (n, c, hp, wp)
    out = xp.full(shape, fill, dtype=x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = src
    return out


def _unpad_into(dst, padded, pads: tuple, channels_first: bool = False) -> None:
    """dst (n, C, H, W) = the interior of a padded array (layout as in `_pad`)."""
    ph, pw = pads
    h, w = dst.shape[2:]
    interior = padded[:, :, ph:ph + h, pw:pw + w]
    dst[...] = interior.transpose(1, 0, 2, 3) if channels_first else interior


def _as_view(a, shape):
    """a reshaped to `shape` as a view, or None when that would need a copy (so writes
    through it would be lost)."""
    return a.reshape(shape) if a.flags.c_contiguous else None


# ---- convolution --------------------------------------------------------------------------------
def _conv_extents(x_shape, w_shape, out_hw, spec) -> tuple:
    """Padded (Hp, Wp) of a convolution's input."""
    (h, w), (kh, kw), (oh, ow) = x_shape[2:], w_shape[2:], out_hw
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    return _padded_extent(h, ph, kh, sh, dh, oh), _padded_extent(w, pw, kw, sw, dw, ow)


def _im2col(x, w_shape, out_hw, spec):
    """x (n, C, H, W) -> columns (groups, C/groups * KH * KW, n * OH * OW), ordered (c, kh, kw)
    down the rows as the weight (O, C/groups, KH, KW) is, so that y = w @ cols per group."""
    xp = get_array_module(x)
    n, c = x.shape[:2]
    _, cg, kh_size, kw_size = w_shape
    oh, ow = out_hw
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    extents = _conv_extents(x.shape, w_shape, out_hw, spec)
    xpad = _pad(x, spec.padding, extents, channels_first=True)      # (C, n, Hp, Wp)
    cols = xp.empty((c, kh_size, kw_size, n, oh, ow), dtype=x.dtype)
    for kh in range(kh_size):
        for kw in range(kw_size):
            cols[:, kh, kw] = xpad[:, :, _window(kh * dh, sh, oh), _window(kw * dw, sw, ow)]
    return cols.reshape(spec.groups, cg * kh_size * kw_size, n * oh * ow)


def conv2d_forward(x, w, b, y, spec, workspace=None, relu: bool = False) -> None:
    """y (N, O, OH, OW) = conv(x (N, C, H, W), w (O, C/groups, KH, KW)) + b (O,) (b may be None).
    workspace: unused here (the GPU's cuDNN plans take one). relu: y = max(conv + b, 0) (b
    required), the bits of the convolution and then the ReLU's pass adding the bias."""
    if relu:
        if b is None:
            raise ValueError("conv2d_forward: relu=True needs the bias b")
        conv2d_forward(x, w, None, y, spec)
        relu_forward(y, y, b)
        return
    xp = get_array_module(x)
    n_total = x.shape[0]
    o, cg, kh, kw = w.shape
    g = spec.groups
    oh, ow = y.shape[2:]
    k = cg * kh * kw
    w3 = w.reshape(g, o // g, k)
    bias = None if b is None else b.reshape(1, o, 1, 1)
    for n0, n1 in _batch_chunks(n_total, g * k * oh * ow + x[0].size):
        n = n1 - n0
        cols = _im2col(x[n0:n1], w.shape, (oh, ow), spec)           # (g, K, n*OH*OW)
        out = xp.matmul(w3, cols)                                    # (g, O/g, n*OH*OW)
        out = out.reshape(o, n, oh, ow).transpose(1, 0, 2, 3)
        if bias is None:
            y[n0:n1] = out
        else:
            xp.add(out, bias, out=y[n0:n1])


def conv2d_backward_data(gy, w, gx, spec, workspace=None) -> None:
    """gx (N, C, H, W) = conv^T(gy (N, O, OH, OW), w); overwrites gx. workspace: unused."""
    xp = get_array_module(gy)
    n_total, c, h, wd = gx.shape
    o, cg, kh_size, kw_size = w.shape
    g = spec.groups
    oh, ow = gy.shape[2:]
    k = cg * kh_size * kw_size
    (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
    extents = _conv_extents(gx.shape, w.shape, (oh, ow), spec)
    w3t = w.reshape(g, o // g, k).transpose(0, 2, 1)                 # (g, K, O/g)
    direct = (ph, pw) == (0, 0) and extents == (h, wd)
    for n0, n1 in _batch_chunks(n_total, g * k * oh * ow + c * extents[0] * extents[1]):
        n = n1 - n0
        gyc = xp.ascontiguousarray(gy[n0:n1].transpose(1, 0, 2, 3)).reshape(g, o // g, n * oh * ow)
        gcols = xp.matmul(w3t, gyc).reshape(c, kh_size, kw_size, n, oh, ow)
        if direct:  # accumulate straight into gx, seen in the (C, n, H, W) layout
            acc = gx[n0:n1].transpose(1, 0, 2, 3)
            acc[...] = 0
        else:
            acc = xp.zeros((c, n) + extents, dtype=gx.dtype)
        for kh in range(kh_size):
            for kw in range(kw_size):
                acc[:, :, _window(kh * dh, sh, oh), _window(kw * dw, sw, ow)] += gcols[:, kh, kw]
        if not direct:
            _unpad_into(gx[n0:n1], acc, (ph, pw), channels_first=True)


def conv2d_backward_filter(x, gy, gw, gb, spec, workspace=None) -> None:
    """gw (O, C/groups, KH, KW) and gb (O,) (gb may be None) from x (N, C, H, W) and
    gy (N, O, OH, OW); both overwritten. workspace: unused."""
    xp = get_array_module(x)
    n_total = x.shape[0]
    o, cg, kh, kw = gw.shape
    g = spec.groups
    oh, ow = gy.shape[2:]
    k = cg * kh * kw
    gw3 = _as_view(gw, (g, o // g, k))
    acc = gw3 if gw3 is not None else xp.empty((g, o // g, k), dtype=gw.dtype)
    first = True
    for n0, n1 in _batch_chunks(n_total, g * k * oh * ow + x[0].size):
        n = n1 - n0
        cols = _im2col(x[n0:n1], gw.shape, (oh, ow), spec)          # (g, K, n*OH*OW)
        gyc = xp.ascontiguousarray(gy[n0:n1].transpose(1, 0, 2, 3)).reshape(g, o // g, n * oh * ow)
        if first:
            xp.matmul(gyc, cols.transpose(0, 2, 1), out=acc)
            first = False
        else:
            acc += xp.matmul(gyc, cols.transpose(0, 2, 1))
    if gw3 is None:
        gw[...] = acc.reshape(gw.shape)
    if gb is not None:
        bias_grad(gy, gb)


def bias_add(y, b) -> None:
    """y (N, C, H, W) += b (C,), in place, summed in float32 (y may hold bf16 maps)."""
    y[...] = y + b.reshape((1, -1) + (1,) * (y.ndim - 2))


def bias_grad(gy, gb) -> None:
    """gb (C,) = sum of gy (N, C, H, W) over N, H and W: a convolution's bias gradient."""
    gy.sum(axis=(0, 2, 3), out=gb)


# ---- pooling ------------------------------------------------------------------------------------
def _pool_extents(x_shape, out_hw, spec) -> tuple:
    """Padded (Hp, Wp) of a pooling input (ceil_mode windows may reach past the padding)."""
    (h, w), (oh, ow) = x_shape[2:], out_hw
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    return _padded_extent(h, ph, kh, sh, 1, oh), _padded_extent(w, pw, kw, sw, 1, ow)


def _pool_windows(spec, out_hw):
    """[(index kh * KW + kw, rows slice, cols slice)] of the window offsets, in argmax order."""
    (kh_size, kw_size), (sh, sw), (oh, ow) = spec.kernel, spec.stride, out_hw
    return [(kh * kw_size + kw, _window(kh, sh, oh), _window(kw, sw, ow))
            for kh in range(kh_size) for kw in range(kw_size)]


def _relu_mask_fits(name: str, spec) -> None:
    """A max pool that applies a ReLU's mask keeps the mark in bit 7 of its argmax."""
    if not relu_mask_fits(spec.kernel):
        kh, kw = spec.kernel
        raise ConfigError(f"{name}: a {kh}x{kw} window has more than {RELU_MASK_POSITIONS} "
                          f"positions, which leaves the argmax no bit for a ReLU's mask")


def maxpool2d_forward(x, y, argmax, spec, relu: bool = False, rectify=None) -> None:
    """y (N, C, OH, OW) = window maxima of x (N, C, H, W); argmax (uint8, shape of y) =
    kh * KW + kw of each window's first maximum. Padding never wins. relu: argmax also has
    RELU_MASK_BIT set where the winner's value is > 0 (the pool applies the mask of the ReLU
    before it): where y > 0, except in a window holding NaN, whose y is NaN and whose
    winner the last offset.

    rectify: None, or (bias, stored) when the pool applies the ReLU before it in its forward
    too (minidnn/fusion.py, pool_relu_forward): x is that ReLU's input, and the windows hold
    what the ReLU would have stored, relu_forward(x, ., bias) (bias (C,) or None) rounded to
    `stored` (None: x's dtype; bf16 when x is a widened copy of a bf16 map)."""
    if relu:
        _relu_mask_fits("maxpool2d_forward", spec)
    xp = get_array_module(x)
    if rectify is not None:           # the ReLU's own kernel, on a copy: the same bits
        bias, stored = rectify
        values = xp.empty_like(x)
        relu_forward(x, values, bias)
        if stored is not None and xp.dtype(stored) != values.dtype:
            values[...] = values.astype(stored)
        x = values
    n_total, c = x.shape[:2]
    out_hw = y.shape[2:]
    extents = _pool_extents(x.shape, out_hw, spec)
    windows = _pool_windows(spec, out_hw)
    for n0, n1 in _batch_chunks(n_total, c * extents[0] * extents[1]):
        xpad = _pad(x[n0:n1], spec.padding, extents, fill=-np.inf)
        yc, ac = y[n0:n1], argmax[n0:n1]
        # First the maxima, then the winner: the smallest offset whose value equals the
        # maximum (ties -> first). Masked writes (copyto with where=) cost far more than
        # plain arithmetic, so each offset's claim is a code, index where equal and 255
        # elsewhere, and the argmax is the running minimum of the codes.
        _, rows, cols = windows[0]
        yc[...] = xpad[:, :, rows, cols]
        for _, rows, cols in windows[1:]:
            xp.maximum(yc, xpad[:, :, rows, cols], out=yc)
        ac[...] = 255
        hit = xp.empty(yc.shape, dtype=bool)
        code = xp.empty(yc.shape, dtype=np.uint8)
        for index, rows, cols in windows:
            xp.equal(xpad[:, :, rows, cols], yc, out=hit)
            xp.multiply(hit.view(np.uint8), np.uint8(255 - index), out=code)
            xp.subtract(np.uint8(255), code, out=code)
            xp.minimum(ac, code, out=ac)
        # A window whose maximum is NaN matches nowhere; keep its argmax a valid offset.
        xp.minimum(ac, np.uint8(len(windows) - 1), out=ac)
        if relu:    # the winner's value > 0: y's, but where a NaN made y NaN
            marked = xp.zeros(yc.shape, dtype=bool)
            for index, rows, cols in windows:
                marked |= (ac == index) & (xpad[:, :, rows, cols] > 0)
            xp.bitwise_or(ac, marked.view(np.uint8) * np.uint8(RELU_MASK_BIT), out=ac)


def maxpool2d_backward(gy, argmax, gx, spec, relu: bool = False, gb=None) -> None:
    """gx (N, C, H, W) = gy (N, C, OH, OW) routed to each window's winner; overwrites gx.

    relu: argmax marked by maxpool2d_forward(relu=True), and gx is then what relu_backward
    makes of the routed gradient, bit for bit: the routed gradient times (y > 0), y the
    ReLU's output (the pool's input). Where a window's winner lies, its mark says y > 0, the
    same for every window it wins; where no window's winner lies, the routed gradient is +0
    (or NaN), which the product leaves as it is.

    gb (C,), when given: also bias_grad(gx, gb), the gradient of the bias that ReLU added
    (minidnn/fusion.py, pool_bias)."""
    if gb is not None:
        maxpool2d_backward(gy, argmax, gx, spec, relu)
        bias_grad(gx, gb)
        return
    if not relu:
        _maxpool_route(gy, argmax, gx, spec)
        return
    _relu_mask_fits("maxpool2d_backward", spec)
    xp = get_array_module(gy)
    offsets = argmax & np.uint8(RELU_MASK_BIT - 1)
    _maxpool_route(gy, offsets, gx, spec)
    marks = xp.empty_like(gx)
    _maxpool_route((argmax >= RELU_MASK_BIT).astype(gx.dtype), offsets, marks, spec)
    xp.multiply(gx, marks > 0, out=gx)


def _maxpool_route(gy, argmax, gx, spec) -> None:
    """gx (N, C, H, W) = gy (N, C, OH, OW) routed to the winners argmax names (offsets only)."""
    xp = get_array_module(gy)
    n_total, c, h, w = gx.shape
    out_hw = gy.shape[2:]
    extents = _pool_extents(gx.shape, out_hw, spec)
    direct = tuple(spec.padding) == (0, 0) and extents == (h, w)
    for n0, n1 in _batch_chunks(n_total, c * extents[0] * extents[1]):
        gyc, ac = gy[n0:n1], argmax[n0:n1]
        acc = gx[n0:n1] if direct else xp.empty((n1 - n0, c) + extents, dtype=gx.dtype)
        acc[...] = 0
        won = xp.empty(gyc.shape, dtype=bool)
        routed = xp.empty_like(gyc)
        for index, rows, cols in _pool_windows(spec, out_hw):
            xp.equal(ac, np.uint8(index), out=won)
            xp.multiply(gyc, won, out=routed)
            acc[:, :, rows, cols] += routed
        if not direct:
            _unpad_into(gx[n0:n1], acc, spec.padding)


def _avg_divisor_1d(size: int, kernel: int, stride: int, pad: int, out: int,
                    count_include_pad: bool) -> np.ndarray:
    """How many values each window along one axis averages (PyTorch's rule: padding counts
    when count_include_pad, the part of a ceil_mode window past the padding never does)."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_divisor(xp, x_shape, out_hw, spec, dtype):
    """(OH, OW) array of window sizes to divide by, on x's device, in x's dtype."""
    (h, w), (oh, ow) = x_shape[2:], out_hw
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    rows = _avg_divisor_1d(h, kh, sh, ph, oh, spec.count_include_pad)
    cols = _avg_divisor_1d(w, kw, sw, pw, ow, spec.count_include_pad)
    return xp.asarray(np.outer(rows, cols).astype(dtype))


def avgpool2d_forward(x, y, spec) -> None:
    """y (N, C, OH, OW) = window means of x (N, C, H, W) (zero padding; divisor per spec)."""
    xp = get_array_module(x)
    n_total, c = x.shape[:2]
    out_hw = y.shape[2:]
    extents = _pool_extents(x.shape, out_hw, spec)
    windows = _pool_windows(spec, out_hw)
    divisor = _avg_divisor(xp, x.shape, out_hw, spec, y.dtype)
    for n0, n1 in _batch_chunks(n_total, c * extents[0] * extents[1]):
        xpad = _pad(x[n0:n1], spec.padding, extents)
        yc = y[n0:n1]
        _, rows, cols = windows[0]
        yc[...] = xpad[:, :, rows, cols]
        for _, rows, cols in windows[1:]:
            yc += xpad[:, :, rows, cols]
        yc /= divisor


def avgpool2d_backward(gy, gx, spec) -> None:
    """gx (N, C, H, W) = each gy (N, C, OH, OW) / divisor spread over its window; overwrites gx."""
    xp = get_array_module(gy)
    n_total, c, h, w = gx.shape
    out_hw = gy.shape[2:]
    extents = _pool_extents(gx.shape, out_hw, spec)
    direct = tuple(spec.padding) == (0, 0) and extents == (h, w)
    divisor = _avg_divisor(xp, gx.shape, out_hw, spec, gy.dtype)
    for n0, n1 in _batch_chunks(n_total, c * extents[0] * extents[1]):
        share = gy[n0:n1] / divisor
        acc = gx[n0:n1] if direct else xp.empty((n1 - n0, c) + extents, dtype=gx.dtype)
        acc[...] = 0
        for _, rows, cols in _pool_windows(spec, out_hw):
            acc[:, :, rows, cols] += share
        if not direct:
            _unpad_into(gx[n0:n1], acc, spec.padding)


# ---- local response normalization ---------------------------------------------------------------
def _lrn_reach(size: int) -> tuple:
    """Channels (before, after) a window centred on c covers: c - before .. c + after
    (PyTorch pads size // 2 in front and (size - 1) // 2 behind, so even sizes lean forward)."""
    return size // 2, (size - 1) // 2


def _channel_window_sum(src, dst, before: int, after: int) -> None:
    """dst[:, c] = sum of src[:, c - before .. c + after] (zero outside); src, dst (n, C, ...)
    distinct arrays. One whole-array add per offset."""
    c = src.shape[1]
    dst[...] = src
    for off in range(1, min(before, c - 1) + 1):
        dst[:, off:] += src[:, :-off]
    for off in range(1, min(after, c - 1) + 1):
        dst[:, :-off] += src[:, off:]


def _negative_power(s, beta: float, out) -> None:
    """out = s ** -beta for s > 0. AlexNet's beta = 0.75 (and 0.5, 1) take square roots and a
    division instead of `power`, which costs several times more per value."""
    xp = get_array_module(s)
    if beta == 0.75:
        xp.sqrt(s, out=out)
        out *= xp.sqrt(out)          # s ** 0.75
        xp.reciprocal(out, out=out)
    elif beta == 0.5:
        xp.sqrt(s, out=out)
        xp.reciprocal(out, out=out)
    elif beta == 1.0:
        xp.reciprocal(s, out=out)
    else:
        xp.power(s, s.dtype.type(-beta), out=out)


def lrn_forward(x, y, scale, spec) -> None:
    """x, y, scale: (N, C, H, W). scale = k + alpha / size * sum over the channel window of
    x**2; y = x * scale**-beta."""
    xp = get_array_module(x)
    before, after = _lrn_reach(spec.size)
    dt = x.dtype.type
    for n0, n1 in _batch_chunks(x.shape[0], x[0].size):
        xc, yc, sc = x[n0:n1], y[n0:n1], scale[n0:n1]
        xp.multiply(xc, xc, out=yc)                  # y holds x**2 until the end
        _channel_window_sum(yc, sc, before, after)
        sc *= dt(spec.alpha / spec.size)
        sc += dt(spec.k)
        _negative_power(sc, spec.beta, yc)
        yc *= xc


def lrn_backward(x, y, scale, gy, gx, spec) -> None:
    """gx (N, C, H, W) from x, scale and gy; overwrites gx. y may be None: it is not read,
    since y / scale = x * scale**(-beta - 1) comes from x and scale alone.

        gx_j = gy_j * s_j**-beta - 2 alpha beta / size * x_j * sum_{c: j in window(c)} gy_c x_c s_c**(-beta-1)

    The windows containing channel j are the mirror image of j's own window."""
    xp = get_array_module(x)
    before, after = _lrn_reach(spec.size)
    dt = x.dtype.type
    for n0, n1 in _batch_chunks(x.shape[0], 2 * x[0].size):
        xc, sc, gyc, gxc = x[n0:n1], scale[n0:n1], gy[n0:n1], gx[n0:n1]
        _negative_power(sc, spec.beta, gxc)          # s**-beta
        term = gxc * xc
        term /= sc
        term *= gyc                                  # gy * x * s**(-beta-1)
        total = xp.empty_like(term)
        _channel_window_sum(term, total, after, before)   # mirrored window
        total *= xc
        total *= dt(2.0 * spec.alpha * spec.beta / spec.size)
        gxc *= gyc
        gxc -= total


# ---- concatenation ------------------------------------------------------------------------------
def _concat_slices(y, sizes, axis: int):
    """y's consecutive slices along axis, sizes[k] wide."""
    axis = axis + y.ndim if axis < 0 else axis
    lead = (slice(None),) * axis
    start = 0
    for size in sizes:
        yield y[lead + (slice(start, start + size),)]
        start += size


def concat_forward(xs, y, axis: int = 1) -> None:
    """y = the xs joined along axis, bit for bit (bf16 maps as their 16-bit patterns)."""
    for x, part in zip(xs, _concat_slices(y, [x.shape[axis] for x in xs], axis)):
        mapformat.copy_values(part, x)


def concat_backward(gy, gxs, sizes, axis: int = 1) -> None:
    """gxs[k] = gy's slice k along axis (sizes[k] wide), bit for bit; None entries skipped."""
    for gx, part in zip(gxs, _concat_slices(gy, sizes, axis)):
        if gx is not None:
            mapformat.copy_values(gx, part)


# ---- sums ---------------------------------------------------------------------------------------
def add(a, b, out) -> None:
    """out = a + b, value by value (a residual add, a gradient sum at a fork); out may be a
    or b. One shape; any layout."""
    get_array_module(a).add(a, b, out=out)


def add_relu(a, b, out) -> None:
    """out = max(a + b, 0), value by value (a residual add with the ReLU after it folded in:
    minidnn/fusion.py); out may be a or b. The sum rounded in out's dtype, then the max: the
    bits of add and relu_forward one after the other."""
    xp = get_array_module(a)
    xp.add(a, b, out=out)
    xp.maximum(out, 0, out=out)


def relu_mask_copy(y, gy, gx0, gx1) -> None:
    """gx0 = gx1 = gy where y > 0, else 0 (the backward of an add with the ReLU after it
    folded in: y is that ReLU's output); gx0 may be gy itself, gx1 None (not wanted). The
    bits of relu_backward and the add's copy; any layouts (pointwise views)."""
    xp = get_array_module(y)
    xp.multiply(gy, y > 0, out=gx0)
    if gx1 is not None:
        mapformat.copy_values(*pointwise_views(gx1, gx0))


def relu_mask_sum_copy(y, gy, g2, gx0, gx1) -> None:
    """gx0 = gx1 = (gy + g2) where y > 0, else 0: relu_mask_copy of the sum gy + g2 (a
    gradient sum the add takes over: minidnn/fusion.py), the sum rounded in gx0's dtype, as
    add rounds it; gx0 may be gy, gx1 None. The bits of add then relu_mask_copy."""
    relu_mask_sum(y, gy, g2, gx0)
    if gx1 is not None:
        mapformat.copy_values(*pointwise_views(gx1, gx0))


def relu_mask_sum(y, gy, g2, gx) -> None:
    """gx = (gy + g2) where y > 0, else 0: relu_mask_sum_copy with one output (the add's
    gradient that a batch norm reads on: minidnn/fusion.py, bn_grad); gx may be gy. Its
    bits: add, then relu_backward's product."""
    add(gy, g2, gx)
    get_array_module(y).multiply(gx, y > 0, out=gx)


# ---- fully connected ---------------------------------------------------------------------------
def linear_forward(x, w, b, y, y32=None) -> None:
    """y (N, out) = x (N, in) @ w (out, in)^T + b (out,) (b may be None). y32, the float32
    buffer a bf16 y is computed in on the GPU, is not needed here (no bf16 op on the CPU)."""
    get_array_module(x).matmul(x, w.T, out=y)
    if b is not None:
        y += b


def linear_backward(x, gy, w, gw, gb, gx, add: bool = False) -> None:
    """gw (out, in) = gy^T @ x, gb (out,) = gy summed over N, gx (N, in) = gy @ w; gw, gb and
    gx may be None (a gradient computed elsewhere, no bias, no input gradient). All three are
    overwritten, but gw under `add`: gw += gy^T @ x (the product, then one add: the bits of
    the product written to a temporary and added by `add`, as the executor adds a
    micro-batch's gradients)."""
    xp = get_array_module(x)
    if gw is not None and add:
        xp.add(gw, xp.matmul(gy.T, x), out=gw)
    elif gw is not None:
        xp.matmul(gy.T, x, out=gw)
    if gb is not None:
        gy.sum(axis=0, out=gb)
    if gx is not None:
        xp.matmul(gy, w, out=gx)


def scale_by_mask(x, mask, y, scale) -> None:
    """y = (x * mask) * scale, value by value (inverted dropout: mask bool or uint8 of x's
    shape, scale = 1 / (1 - p)); y may be x. Two NumPy products, each rounded in the maps'
    dtype (float32 or float64; scale rounded to it): the bits cuda_pointwise's kernel
    reproduces. Any layout; flat views where the three share one dense layout."""
    if np.dtype(y.dtype) not in (np.float32, np.float64):
        raise TypeError(f"scale_by_mask: takes float32 or float64 maps, got {y.dtype}")
    x, mask, y = pointwise_views(x, mask, y)
    get_array_module(x).multiply(x, mask, out=y)
    y *= y.dtype.type(scale)


# ---- ReLU -------------------------------------------------------------------------------------
def _with_bias(x, y, bias):
    """x + bias (C,) along axis 1, into y (the map the ReLU then runs over); x without one."""
    if bias is None:
        return x
    get_array_module(x).add(x, bias.reshape((1, -1) + (1,) * (x.ndim - 2)), out=y)
    return y


def relu_forward(x, y, bias=None) -> None:
    """y = max(x + bias, 0), bias (C,) along axis 1 when given (a convolution's bias moved
    here: minidnn/fusion.py); y may be x itself (in place)."""
    get_array_module(x).maximum(_with_bias(x, y, bias), 0, out=y)


def relu_backward(y, gy, gx, gb=None) -> None:
    """gx = gy where y > 0, else 0; gx may be gy itself. Reads only the output (y > 0 <=> x > 0).
    gb (C,), when given: also the gradient of the bias this ReLU added (minidnn/fusion.py),
    bias_grad(gx, gb), which the convolution would otherwise compute."""
    xp = get_array_module(y)
    xp.multiply(gy, y > 0, out=gx)
    if gb is not None:
        bias_grad(gx, gb)


def relu_forward_bits(x, y, mask, bias=None) -> None:
    """y = max(x + bias, 0) as relu_forward, and mask (uint8, relu_mask_bytes(x.size)) = the
    bits of y > 0, element i at bit i % 8 of byte i // 8 (little-endian bit order, so 32-bit
    words read the same)."""
    xp = get_array_module(x)
    xp.maximum(_with_bias(x, y, bias), 0, out=y)
    bits = xp.packbits((y > 0).ravel(), bitorder="little")
    mask[:bits.size] = bits
    mask[bits.size:] = 0


def relu_backward_bits(mask, gy, gx, gb=None) -> None:
    """gx = gy where the mask's bit is set, else 0; gx may be gy itself. gb: as relu_backward."""
    xp = get_array_module(gy)
    keep = xp.unpackbits(mask, count=gy.size, bitorder="little").reshape(gy.shape)
    xp.multiply(gy, keep, out=gx)
    if gb is not None:
        bias_grad(gx, gb)


def float_to_bf16(src, dst) -> None:
    """dst (bfloat16, ml_dtypes) = src (float32) rounded to nearest even."""
    dst[...] = src


def bf16_to_float(src, dst) -> None:
    """dst (float32) = src (bfloat16), exactly."""
    dst[...] = src


# ---- SGD update -------------------------------------------------------------------------------
#: The key, in sgd_update's cache, of the GPU version's learning rate in device memory
#: (cuda_sgd.DeviceRate: `write(lr)`, `alone`); absent on the CPU.
SGD_RATE = "sgd learning rate"


def sgd_update(params, lr: float, momentum: float, weight_decay: float, cache=None) -> None:
    """One SGD step over parameters in place, PyTorch's formulas (minidnn/optim.py):

        g = grad + weight_decay * w          (when weight_decay != 0)
        v = momentum * v + g                 (when momentum != 0)
        w = w - lr * v                       (or lr * g without momentum)

    params: [(w, g, v)]: a parameter, its gradient and its momentum buffer, any one shape and
    dtype per triple (the three alike); v is updated in place and ignored (may be None) when
    momentum is 0. The first step of momentum (no buffer yet, v = g) is the optimizer's.
    lr, momentum, weight_decay: Python floats, rounded to each parameter's dtype.
    cache: a dict the caller keeps between steps for the GPU version's launch tables and
    its learning rate in device memory (SGD_RATE); unused here.

    Each operation is one NumPy ufunc, rounded on its own in the parameter's dtype, with one
    parameter-sized temporary (w * weight_decay + g, then lr * v): these are the bits that
    the fused CUDA kernel (cuda_sgd.py) reproduces.
    """
    for w, g, v in params:
        scalar = w.dtype.type
        tmp = None
        if weight_decay:
            tmp = w * scalar(weight_decay)
            tmp += g
            g = tmp
        if momentum:
            if v is None:
                raise ValueError("sgd_update: momentum needs a buffer for every parameter; "
                                 "got None")
            v *= scalar(momentum)
            v += g
            g = v
        if tmp is None:
            tmp = g * scalar(lr)
        else:
            get_array_module(w).multiply(g, scalar(lr), out=tmp)
        w -= tmp
