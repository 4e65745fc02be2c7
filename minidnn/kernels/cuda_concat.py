"""Concatenation along one axis on the GPU, forward and backward, as one CuPy raw kernel.

A concatenation only moves bytes, so memory bandwidth alone bounds it. In memory order, a
dense output of shape S concatenated along axis a is `rows` = prod(S[:a]) rows, and row r is
the k inputs' row r side by side: input k's row is prod(its shape[a:]) values wide. For the
channel axis of channels-last maps (NHWC, kernels/mapformat.py) a row is a pixel and input
k's part of it is its C_k channels; for NCHW maps a row is an image and input k's part its
C_k * H * W values. One kernel serves both, and any axis of C-contiguous arrays.

The kernel copies words, not values: any dtype (bfloat16 included) is moved as its bytes, so
a copy changes no bit. A word is the widest of 16, 8, 4, 2 or 1 bytes that divides every
input's row width in bytes and every array's address; on GoogLeNet's maps (channel counts
multiples of 16) that is a 16-byte vector per load and store.

One launch moves up to PARTS inputs: thread t copies word t % span of output row t / span
(`span`: the words of a row those inputs fill; one division by a launch constant,
cuda_divide.py) and finds its input by comparing its column with the inputs' column ends
(PARTS comparisons, no division). The inputs' addresses and ends are kernel arguments, not a
device table, so a launch allocates nothing, copies nothing from the host and can be captured
in a CUDA graph. Backward is the same copy the other way (the output gradient's columns out
to the input gradients); an input whose gradient is not wanted (None) is skipped. Index math
is 32-bit: a launch covers fewer than 2**31 words of the output and larger maps run as
several launches of whole rows. The kernel never synchronizes with the host and runs on
CuPy's current stream.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .cuda_divide import DIVIDE_SOURCE, INDEX_LIMIT, divider
from .mapformat import copy_values, is_channels_last

#: Inputs one launch moves; a concatenation of more runs as one launch per PARTS inputs.
PARTS = 8

_PART_ARGS = ", ".join(f"unsigned long long p{k}, unsigned int e{k}" for k in range(PARTS))
_PICK = "\n".join(f"    if (col >= e{k - 1}) {{ part = p{k}; start = e{k - 1}; end = e{k}; }}"
                  for k in range(1, PARTS))

_SOURCE = DIVIDE_SOURCE + r"""
// W: the word moved by one load and store (uint4: 16 bytes, ... unsigned char: 1 byte).
// y: the output's rows (`width` words each), from column `first` on; part k fills the row's
// columns [e_{k-1}, e_k) of the launch's span (e_{-1} = 0), its own rows being e_k - e_{k-1}
// words wide, and starts at address p_k (0: an input to skip). Unused parts have e_k = span.
// INTO_Y: forward (parts -> y); otherwise backward (y, the output gradient, -> parts).
template<typename W, bool INTO_Y>
__global__ void concat_rows(unsigned long long y_address, unsigned int width,
                            unsigned int first, unsigned int span, unsigned int span_mul,
                            unsigned int span_shift, unsigned int count,
                            """ + _PART_ARGS + r""") {
    const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    const unsigned int row = divide(t, span_mul, span_shift);
    const unsigned int col = t - row * span;
    unsigned long long part = p0;
    unsigned int start = 0, end = e0;
""" + _PICK + r"""
    if (part == 0ull) return;
    W* own = reinterpret_cast<W*>(part) + row * (end - start) + (col - start);
    W* out = reinterpret_cast<W*>(y_address) + row * width + first + col;
    if (INTO_Y) *out = *own; else *own = *out;
}
"""

#: Word types by size in bytes.
_WORDS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}
_module = cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=[
    f"concat_rows<{w}, {d}>" for w in _WORDS.values() for d in ("true", "false")])
_THREADS = 256


def _memory_axis(name: str, arrays, axis: int):
    """(shapes in memory order, the axis in them) of arrays of one dense layout: C-contiguous
    arrays as they are, channels-last 4-D maps as (N, H, W, C). None where the arrays mix
    layouts or are not dense (the caller copies through CuPy then)."""
    if all(a.flags.c_contiguous for a in arrays):
        return [a.shape for a in arrays], axis
    if all(is_channels_last(a) for a in arrays):      # 4-D maps, channels last
        return [(a.shape[0], a.shape[2], a.shape[3], a.shape[1]) for a in arrays], \
            {1: 3, 2: 1, 3: 2}[axis]
    return None


def _word_bytes(widths, arrays) -> int:
    """The widest word dividing every row width (bytes) and every array's address."""
    for size in sorted(_WORDS, reverse=True):
        if all(w % size == 0 for w in widths) and all(a.data.ptr % size == 0 for a in arrays):
            return size
    return 1


def _check(name: str, y, parts, sizes, axis: int) -> int:
    """axis as a non-negative int, once the parts (None allowed) are checked against y and
    `sizes`: y's shape but along axis, where they add up to y's extent; one dtype."""
    axis = axis + y.ndim if axis < 0 else axis
    if len(parts) != len(sizes) or sum(sizes) != y.shape[axis]:
        raise ValueError(f"{name}: parts of {list(sizes)} along axis {axis} do not fill "
                         f"{y.shape}")
    for p, size in zip(parts, sizes):
        if p is None:
            continue
        want = y.shape[:axis] + (size,) + y.shape[axis + 1:]
        if tuple(p.shape) != want or p.dtype != y.dtype:
            raise ValueError(f"{name}: expected a part {want} of {y.dtype}, got "
                             f"{tuple(p.shape)} of {p.dtype}")
    return axis


def _move(name: str, y, parts, sizes, axis: int, into_y: bool) -> None:
    """Copy between y and its parts along `axis`: into y when into_y, else out of it.
    parts[k]: sizes[k] along axis, or None (its columns are skipped)."""
    axis = _check(name, y, parts, sizes, axis)
    present = [p for p in parts if p is not None]
    layout = _memory_axis(name, [y] + present, axis)
    if layout is None:                  # strided arrays: CuPy's copies, slice by slice
        _copy_slices(y, parts, sizes, axis, into_y)
        return
    shapes, maxis = layout
    rows = int(np.prod(shapes[0][:maxis], dtype=np.int64))
    # Bytes of one row of a part per unit of its extent along axis.
    unit = int(np.prod(shapes[0][maxis + 1:], dtype=np.int64)) * y.dtype.itemsize
    widths = [size * unit for size in sizes]
    if not rows or not sum(widths) or not present:
        return
    word = _word_bytes(widths, [y] + present)
    width = sum(widths) // word
    kernel = _module.get_function(f"concat_rows<{_WORDS[word]}, {str(into_y).lower()}>")
    rows_per_launch = max((INDEX_LIMIT - 1) // width, 1)
    first = 0
    for k0 in range(0, len(parts), PARTS):
        group = parts[k0:k0 + PARTS]
        words = [w // word for w in widths[k0:k0 + PARTS]]
        span = sum(words)
        if span and any(p is not None for p in group):
            for r0 in range(0, rows, rows_per_launch):
                n = min(rows_per_launch, rows - r0)
                _launch(kernel, y.data.ptr + r0 * width * word, width, first, span, n,
                        [None if p is None else p.data.ptr + r0 * w * word
                         for p, w in zip(group, words)], words)
        first += span


def _launch(kernel, y_address: int, width: int, first: int, span: int, rows: int,
            addresses, words) -> None:
    """One launch over `rows` rows of y (from y_address) for one group of at most PARTS
    parts: their addresses (None: skipped) and row widths, in words."""
    args = []
    end = 0
    for k in range(PARTS):
        if k < len(words):
            end += words[k]
        address = addresses[k] if k < len(addresses) else None
        args += [np.uint64(address or 0), np.uint32(end)]
    count = rows * span
    kernel(((count + _THREADS - 1) // _THREADS,), (_THREADS,),
           (np.uint64(y_address), np.uint32(width), np.uint32(first), np.uint32(span),
            *divider(span), np.uint32(count), *args))


def _copy_slices(y, parts, sizes, axis: int, into_y: bool) -> None:
    """The copies through CuPy's strided assignment (any strides; slower)."""
    start = 0
    lead = (slice(None),) * axis
    for p, size in zip(parts, sizes):
        if p is not None:
            piece = y[lead + (slice(start, start + size),)]
            if into_y:
                copy_values(piece, p)
            else:
                copy_values(p, piece)
        start += size


def concat_forward(xs, y, axis: int = 1) -> None:
    """y = the xs joined along `axis`, bit for bit. xs[k]: y's shape but along axis (any
    dtype, all y's); all C-contiguous, or all channels-last 4-D maps joined along any axis;
    other strides go through CuPy's copies."""
    _move("concat_forward", y, list(xs), [x.shape[axis] for x in xs], axis, into_y=True)


def concat_backward(gy, gxs, sizes, axis: int = 1) -> None:
    """gxs[k] = gy's slice k along `axis` (sizes[k] wide, after the slices before it), bit for
    bit; a gxs[k] of None is skipped. Layouts as concat_forward's."""
    _move("concat_backward", gy, list(gxs), list(sizes), axis, into_y=False)
