"""Mixed precision at the layer boundary: bf16 feature maps in, float32 compute, bf16 out.

Under `precision='bf16'` (kernels/mapformat.py) the memory manager hands layers bf16 feature
maps and gradients, while parameters, their gradients and the aux buffers stay float32. A
layer's own code computes in its dtype (float32). `forward` and `backward` here call it:

* every bf16 array the layer reads is widened to float32 (exact: bf16 is float32 with the
  low 16 bits zero), by the kernels' `bf16_to_float` (on the GPU a raw kernel on the 16-bit
  patterns, so nothing depends on CuPy's own bfloat16 arithmetic);
* every bf16 array it writes gets a float32 buffer of the same shape and layout, and the
  result is rounded to bf16 once, to nearest even, when the layer returns
  (`float_to_bf16`);
* arrays already in float32 (parameters, the loss, aux buffers, labels) pass through.

So a convolution or a matrix product sums in float32 and only its result is rounded, as a
bf16 GPU kernel with float32 accumulation would do. The widened copies are temporaries of the
call (on the GPU they come out of the arena and count against the budget); what stays between
forward and backward, and what is offloaded, is bf16. With float32 maps both functions are
the layer's own calls, nothing added.

A layer that computes only with kernel ops (`Layer.kernel_ops`) that all take bf16 maps
themselves (the kernels' `BF16_OPS`: the GPU's convolutions, matrix products, ReLU, pooling,
dropout) is called on the bf16 maps as they are: no widened copies, and cuDNN and cuBLAS run
bf16 tensor-core plans. Those kernels keep the same contract (float32 sums, each output
rounded once) with two differences, both as PyTorch's autocast computes: a convolution's
output is rounded before its bias is added (rounded again), and the weights a convolution
reads and the weight gradient it writes are rounded to bf16 (the float32 master weights and
gradients stay float32).
"""
from __future__ import annotations

from ..kernels.mapformat import is_bfloat16


def _wide(a, ctx, dtype):
    """`a` in `dtype` when it is a bf16 array (a copy, same layout); otherwise `a` itself."""
    if a is None or not is_bfloat16(a.dtype):
        return a
    out = ctx.xp.empty_like(a, dtype=dtype)
    ctx.kernels.bf16_to_float(a, out)
    return out


def _out(a, ctx, dtype):
    """A float32 buffer to compute into in place of bf16 `a` (same shape and layout)."""
    if a is None or not is_bfloat16(a.dtype):
        return a
    return ctx.xp.empty_like(a, dtype=dtype)


def _round_into(dst, src, ctx) -> None:
    """dst (bf16) = src rounded to nearest even; nothing when src is dst itself."""
    if src is not dst and dst is not None:
        ctx.kernels.float_to_bf16(src, dst)


def takes_bf16(layer, kernels) -> bool:
    """True when every kernel op the layer computes with takes bf16 maps as they are."""
    return layer.kernel_ops is not None and kernels.BF16_OPS.issuperset(layer.kernel_ops)


def _as_they_are(layer, ctx, arrays) -> bool:
    """True when the layer's call needs no widening: no bf16 array among `arrays`, or
    kernels that take the layer's bf16 maps themselves."""
    return not any(a is not None and is_bfloat16(a.dtype) for a in arrays) or \
        takes_bf16(layer, ctx.kernels)


def forward(layer, xs, y, aux, ctx) -> None:
    """layer.forward(xs, y, aux, ctx), in float32 when the maps are bf16."""
    if _as_they_are(layer, ctx, [y, *xs]):
        layer.forward(xs, y, aux, ctx)
        return
    dtype = layer.dtype
    y32 = _out(y, ctx, dtype)
    layer.forward([_wide(x, ctx, dtype) for x in xs], y32, aux, ctx)
    _round_into(y, y32, ctx)


def backward(layer, xs, y, gy, gxs, aux, ctx) -> None:
    """layer.backward(xs, y, gy, gxs, aux, ctx), in float32 when the maps are bf16. The
    retained maps and gy are widened before any gradient is written (a gradient may take
    the buffer of gy or of an input)."""
    if _as_they_are(layer, ctx, [gy, y, *xs, *gxs]):
        layer.backward(xs, y, gy, gxs, aux, ctx)
        return
    dtype = layer.dtype
    xs32 = [_wide(x, ctx, dtype) for x in xs]
    y32, gy32 = _wide(y, ctx, dtype), _wide(gy, ctx, dtype)
    gxs32 = [_out(g, ctx, dtype) for g in gxs]
    layer.backward(xs32, y32, gy32, gxs32, aux, ctx)
    for g, g32 in zip(gxs, gxs32):
        _round_into(g, g32, ctx)
