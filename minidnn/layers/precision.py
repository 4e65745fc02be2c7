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
bf16 GPU kernel with float32 accumulation would do; a convolution with a bias rounds twice,
before adding the bias and after (layers/conv.py), as the GPU's bf16 plans do. What stays
between forward and backward, and what is offloaded, is bf16. With float32 maps both
functions are the layer's own calls, nothing added.

The widened copies are temporaries of the call, and they are declared: `temporary_bytes`
says, from the shapes and dtypes of the maps a call reads and writes (the liveness plan's
`call_maps`), how many bytes the widened copies of that call take, and the memory manager
hands the call a scratch block of that size (StepContext.scratch, like the block of random
draws: layers/draws.py), planned in the static layout and walked by the planner's dry run.
`forward` and `backward` carve the copies out of its first bytes (`_Carver`) and hand the
layer the rest. So the plan counts exactly what the run takes, on the GPU and on the CPU
alike (there the block comes out of the arena too), and a call handed too small a block
raises instead of taking memory nobody planned. Called without a block (a layer run outside
an executor), the copies come from the array module.

A layer that computes only with kernel ops (`Layer.kernel_ops`) that all take bf16 maps
themselves (the kernels' `BF16_OPS`, kernels/mapformat.py: the GPU's convolutions, matrix
products, ReLU, pooling, dropout, batch norm, LRN and two-input adds; Concat and BatchJoin
only copy) is called on the bf16 maps as they are: no widened copies, and cuDNN and cuBLAS run
bf16 tensor-core plans. Those kernels keep the same contract (float32 sums, each output
rounded once) with two differences, both as PyTorch's autocast computes: a convolution's
output is rounded before its bias is added (rounded again), and the weights a convolution
reads and the weight gradient it writes are rounded to bf16 (the float32 master weights and
gradients stay float32).

One such kernel still needs a float32 map: the GPU's matrix product computes its bf16
output in a float32 buffer, adds the bias there and rounds once (ROUND_FROM_FLOAT32).
temporary_bytes declares that buffer for the forward call, and the layer hands the kernel
the buffer carved from its block (`output_buffer`).
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..kernels.mapformat import ROUND_FROM_FLOAT32, bfloat16, empty, is_bfloat16, \
    is_channels_last, layout_of, shaped

#: Bytes each widened copy's place in the scratch block is rounded up to (CUDA's own
#: alignment of allocations), so that every copy starts aligned for vector loads.
ALIGN = 256


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


def takes_bf16(layer, kernels) -> bool:
    """True when every kernel op the layer computes with takes bf16 maps as they are."""
    return _takes(layer, kernels.BF16_OPS)


def _takes(layer, ops) -> bool:
    return layer.kernel_ops is not None and ops.issuperset(layer.kernel_ops)


def temporary_bytes(layer, bf16_ops, maps, phase: str) -> int:
    """Bytes of the float32 temporaries one call of `layer` makes (see the module doc).

    Args:
        layer: the layer called.
        bf16_ops: the kernel ops of the device that take bf16 maps as they are (the kernel
            module's BF16_OPS; kernels/mapformat.BF16_OPS by device kind).
        maps: [(shape, dtype)] of the arrays the call reads and writes (the liveness plan's
            call_maps): each bf16 one is widened, or given a float32 buffer to write into.
        phase: 'forward', 'recompute' or 'backward'.
    Returns:
        0 when the call runs on its maps as they are (no bf16 among them, or a layer whose
        kernels take them); the float32 buffer of its output (last among a forward call's
        maps) when its kernels take them but round from float32 (ROUND_FROM_FLOAT32); else
        the sum of the copies' aligned sizes.
    """
    wide = [math.prod(int(d) for d in shape) * 4 for shape, dtype in maps
            if is_bfloat16(dtype)]
    if not wide:
        return 0
    if _takes(layer, bf16_ops):
        rounds = phase != "backward" and not ROUND_FROM_FLOAT32.isdisjoint(layer.kernel_ops)
        return _aligned(wide[-1]) if rounds and is_bfloat16(maps[-1][1]) else 0
    return sum(_aligned(n) for n in wide)


def output_buffer(ctx, y):
    """The float32 buffer a kernel in ROUND_FROM_FLOAT32 computes bf16 `y` in: carved from
    the call's scratch block (of temporary_bytes), in y's layout; None where y is not bf16
    or the call has no block (a layer run outside an executor: the kernel makes its own)."""
    if ctx.scratch is None or not is_bfloat16(y.dtype):
        return None
    return _Carver(ctx.scratch, ctx.xp).like(y, np.dtype(np.float32))


class _Carver:
    """float32 arrays carved one after the other out of the first bytes of `block` (a flat
    uint8 array; None: new arrays from the array module), each laid out as the bf16 array it
    stands for."""

    def __init__(self, block, xp):
        self.block, self.xp, self.used = block, xp, 0

    def like(self, a, dtype):
        if self.block is None:
            return self.xp.empty_like(a, dtype=dtype)
        nbytes = a.size * dtype.itemsize
        if self.used + nbytes > self.block.nbytes:
            raise RuntimeError(f"the call's scratch block of {self.block.nbytes} bytes is too "
                               f"small for its widened float32 maps (memory/plan.py call_maps "
                               f"and layers/precision.py temporary_bytes disagree)")
        layout = "nhwc" if a.ndim == 4 and not a.flags.c_contiguous and \
            is_channels_last(a) else "nchw"
        out = shaped(self.block[self.used:], a.shape, dtype, layout)
        self.used += _aligned(nbytes)
        return out

    def rest(self):
        """What the copies left of the block (for the layer's own draws), or None."""
        if self.block is None or self.used >= self.block.nbytes:
            return None
        return self.block[self.used:]


def _wide(a, carve, ctx, dtype):
    """`a` in `dtype` when it is a bf16 array (a copy, same layout); otherwise `a` itself."""
    if a is None or not is_bfloat16(a.dtype):
        return a
    out = carve.like(a, dtype)
    ctx.kernels.bf16_to_float(a, out)
    return out


def _out(a, carve, dtype):
    """A float32 buffer to compute into in place of bf16 `a` (same shape and layout)."""
    if a is None or not is_bfloat16(a.dtype):
        return a
    return carve.like(a, dtype)


def _round_into(dst, src, ctx) -> None:
    """dst (bf16) = src rounded to nearest even; nothing when src is dst itself."""
    if src is not dst and dst is not None:
        ctx.kernels.float_to_bf16(src, dst)


def _as_they_are(layer, ctx, arrays) -> bool:
    """True when the layer's call needs no widening: no bf16 array among `arrays`, or
    kernels that take the layer's bf16 maps themselves."""
    return not any(a is not None and is_bfloat16(a.dtype) for a in arrays) or \
        takes_bf16(layer, ctx.kernels)


def _call_with_rest(ctx, carve, call) -> None:
    """call() with ctx.scratch set to what the widened copies left of the call's block."""
    block = ctx.scratch
    ctx.scratch = carve.rest()
    try:
        call()
    finally:
        ctx.scratch = block


def forward(layer, xs, y, aux, ctx) -> None:
    """layer.forward(xs, y, aux, ctx), in float32 when the maps are bf16."""
    if _as_they_are(layer, ctx, [y, *xs]):
        layer.forward(xs, y, aux, ctx)
        return
    dtype = layer.dtype
    carve = _Carver(ctx.scratch, ctx.xp)
    y32 = _out(y, carve, dtype)
    xs32 = [_wide(x, carve, ctx, dtype) for x in xs]
    _call_with_rest(ctx, carve, lambda: layer.forward(xs32, y32, aux, ctx))
    _round_into(y, y32, ctx)


def backward(layer, xs, y, gy, gxs, aux, ctx) -> None:
    """layer.backward(xs, y, gy, gxs, aux, ctx), in float32 when the maps are bf16. The
    retained maps and gy are widened before any gradient is written (a gradient may take
    the buffer of gy or of an input)."""
    if _as_they_are(layer, ctx, [gy, y, *xs, *gxs]):
        layer.backward(xs, y, gy, gxs, aux, ctx)
        return
    dtype = layer.dtype
    carve = _Carver(ctx.scratch, ctx.xp)
    xs32 = [_wide(x, carve, ctx, dtype) for x in xs]
    y32, gy32 = _wide(y, carve, ctx, dtype), _wide(gy, carve, ctx, dtype)
    gxs32 = [_out(g, carve, dtype) for g in gxs]
    _call_with_rest(ctx, carve, lambda: layer.backward(xs32, y32, gy32, gxs32, aux, ctx))
    for g, g32 in zip(gxs, gxs32):
        _round_into(g, g32, ctx)


def widened_bf16(ctx, a) -> bool:
    """Whether `a`, a map a layer writes, is the float32 stand-in of a bf16 map: the step's
    maps are bf16 (ctx.maps) and the layer is called on widened copies."""
    return ctx.maps is not None and ctx.maps.precision == "bf16" and not is_bfloat16(a.dtype)


def round_to_bf16(kernels, a) -> None:
    """float32 `a` rounded in place to its nearest bf16 values, ties to even: what storing it
    in a bf16 map and widening it again gives (through the kernels' float_to_bf16 and
    bf16_to_float, on a temporary in a's layout)."""
    narrow = empty(get_array_module(a), a.shape, bfloat16(), layout_of(a))
    kernels.float_to_bf16(a, narrow)
    kernels.bf16_to_float(narrow, a)
