"""How feature maps are stored: their layout in memory (NCHW or NHWC) and their precision.

A MapFormat is decided before the executor is built and handed to the liveness plan and the
memory manager, which size and view every feature-map buffer by it.

Precision
* 'fp32' (default): every feature map in the network's dtype.
* 'bf16' (mixed precision): the feature maps (the input batch and every layer's output but
  the loss) and their gradients are stored in bfloat16 (ml_dtypes.bfloat16: 8 exponent
  bits, 8 significand bits, round to nearest even), half the bytes of float32 to keep,
  offload, prefetch and plan for. Everything else stays float32: parameters (the master
  weights), their gradients, the optimizer's state, the loss and its softmax, the aux
  buffers (LRN's scale; argmax, masks and ReLU bits are integers anyway). Layers compute in
  float32 (layers/precision.py widens their bf16 inputs and rounds their outputs once), so
  convolutions and matrix products accumulate in float32.

Layout

Every layer and kernel sees a 4-D feature map with the *logical* shape (N, C, H, W), as in
PyTorch. Only the strides say where the values lie:

* 'nchw': C-contiguous, strides (C*H*W, H*W, W, 1): a channel's plane is contiguous;
* 'nhwc': the (N, H, W, C) array seen through transpose(0, 3, 1, 2), strides
  (H*W*C, 1, W*C, C): a pixel's channels are contiguous (PyTorch's channels_last).

cuDNN's tensor-core convolutions work in NHWC; given NCHW tensors they transpose around every
call. With NHWC maps from end to end the convolutions run on the maps as they are, and the
other kernels (pooling, LRN, ReLU, the bias add) have a channels-last twin.

Parameters keep PyTorch's logical shapes (conv weights (O, I, KH, KW), linear weights
(out, in)); on the device a convolution's weights and their gradients are stored in the maps'
layout too (Assembly._place_parameters), so that cuDNN sees one layout. Vectors (N, F) and
other shapes are C-contiguous in both layouts. The CPU uses 'nchw' unless told otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

LAYOUTS = ("nchw", "nhwc")
PRECISIONS = ("fp32", "bf16")

#: The kernel ops that take bf16 feature maps as they are, per device kind (the kernel
#: modules' BF16_OPS: cpu.py's and cuda.py's are these sets). Written here, where no CuPy is
#: needed, so that a plan made on a CPU for a GPU counts the float32 temporaries the GPU's
#: step makes (layers/precision.py: temporary_bytes) and no others.
BF16_OPS = {
    "cpu": frozenset(),
    "gpu": frozenset({"conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter",
                      "linear_forward", "linear_backward", "relu_forward", "relu_backward",
                      "relu_forward_bits", "relu_backward_bits", "maxpool2d_forward",
                      "maxpool2d_backward", "avgpool2d_forward", "avgpool2d_backward",
                      "scale_by_mask", "batchnorm_training_forward", "batchnorm_forward",
                      "batchnorm_backward", "lrn_forward", "lrn_backward", "add", "add_relu",
                      "relu_mask_copy", "relu_mask_sum_copy", "relu_mask_sum"}),
}

#: Ops among BF16_OPS that compute their bf16 output in a float32 buffer of its shape and
#: round it once: the GPU's matrix product adds its bias there, before the rounding
#: (kernels/cuda_linear.py). The caller hands the buffer (`out32`), carved from the call's
#: scratch block, and the plan counts it as a temporary of the forward call
#: (layers/precision.py: temporary_bytes).
ROUND_FROM_FLOAT32 = frozenset({"linear_forward"})


def bfloat16() -> np.dtype:
    """NumPy's dtype for bfloat16 (from ml_dtypes, which CuPy 14 also takes); ConfigError
    when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ConfigError(f"precision 'bf16' needs the ml_dtypes package (pip install "
                          f"ml_dtypes): {exc}") from exc
    return np.dtype(ml_dtypes.bfloat16)


_IS_BFLOAT16: dict = {}   # dtype -> answer: the question is asked of every map of every call


def is_bfloat16(dtype) -> bool:
    """True for ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    try:
        return _IS_BFLOAT16[dtype]
    except KeyError:
        answer = _IS_BFLOAT16[dtype] = np.dtype(dtype).name == "bfloat16"
        return answer


@dataclass(frozen=True)
class MapFormat:
    """How the feature maps of a step are stored.

    layout: 'nchw' or 'nhwc' (4-D maps, their gradients and 4-D aux buffers; see above).
    precision: 'fp32' or 'bf16' (feature maps and their gradients; see above).
    """
    layout: str = "nchw"
    precision: str = "fp32"

    def __post_init__(self):
        check_layout(self.layout)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; "
                              f"got {self.precision!r}")

    def map_dtype(self, dtype) -> np.dtype:
        """The dtype feature maps are stored in, for a network of `dtype`."""
        dtype = np.dtype(dtype)
        if self.precision == "fp32":
            return dtype
        if dtype != np.float32:
            raise ConfigError(f"precision 'bf16' is mixed precision for float32 networks; "
                              f"this network is {dtype}")
        return bfloat16()

    def view(self, flat, shape, dtype):
        """`flat`'s first bytes as an array of logical `shape` in this format (see shaped)."""
        return shaped(flat, shape, dtype, self.layout)


def check_layout(layout: str) -> str:
    """`layout` if it is one of LAYOUTS; ConfigError otherwise."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    return layout


#: The layout a GPU executor takes when none is asked for: channels last, measured faster end
#: to end on the H200 (VGG-16 b256 TF32: 147.4 ms against 166.7 ms in NCHW; RESULTS.md).
GPU_DEFAULT_LAYOUT = "nhwc"


def map_layout(device, layout: str | None) -> str:
    """The layout to use on `device` (a backend.Device): `layout`, or when None the device's
    default (GPU_DEFAULT_LAYOUT on the GPU, 'nchw' on the CPU). The CPU runs 'nhwc' too: its
    reference kernels take any strides (slower), so the tests check channels-last steps
    there against NCHW ones."""
    if layout is None:
        return GPU_DEFAULT_LAYOUT if device.is_gpu else "nchw"
    return check_layout(layout)


def arrange(a, layout: str):
    """The values of logical array `a` (NumPy or CuPy) as a C-contiguous array in the memory
    order of `layout`: (N, H, W, C) for a 4-D array in 'nhwc', `a` itself otherwise."""
    if layout == "nhwc" and a.ndim == 4:
        return a.transpose(0, 2, 3, 1).copy()
    return a if a.flags.c_contiguous else a.copy()


def layout_strides(shape, layout: str = "nchw") -> tuple:
    """The strides, in elements, of an array of logical `shape` laid out as `layout` says (as
    `shaped` lays it out), without making one: (H*W*C, 1, W*C, C) for a 4-D 'nhwc' array,
    C order otherwise (an axis of length 0 counted as 1)."""
    shape = tuple(int(d) for d in shape)
    if layout == "nhwc" and len(shape) == 4:
        _, c, h, w = shape
        return (h * w * c, 1, w * c, c)
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def shaped(flat, shape, dtype, layout: str = "nchw"):
    """A view of the first bytes of `flat` (a 1-D uint8 array, NumPy or CuPy) as an array of
    logical `shape` and `dtype`, laid out as `layout` says when it has 4 dimensions."""
    # Called for every map of every layer call: plain Python arithmetic, no NumPy reductions.
    shape = tuple(int(d) for d in shape)
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    values = flat[:math.prod(shape) * dtype.itemsize].view(dtype)
    if layout == "nhwc" and len(shape) == 4:
        n_, c, h, w = shape
        return values.reshape(n_, h, w, c).transpose(0, 3, 1, 2)
    return values.reshape(shape)


def empty(xp, shape, dtype, layout: str = "nchw"):
    """A new array of logical `shape` laid out as `layout` (for temporaries)."""
    shape = tuple(int(d) for d in shape)
    if layout == "nhwc" and len(shape) == 4:
        n, c, h, w = shape
        return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)
    return xp.empty(shape, dtype=dtype)


def is_channels_last(a) -> bool:
    """True when a 4-D array is the transposed view of a C-contiguous (N, H, W, C) array.

    By its strides, as the array module judges contiguity (axes of length 1 may have any
    stride; an empty array is contiguous): asked of every map of many calls, and a transposed
    view costs a CuPy array on the host."""
    if a.ndim != 4:
        return False
    shape, strides = a.shape, a.strides
    if 0 in shape:
        return True
    step = a.itemsize
    for axis in (1, 3, 2, 0):            # C, W, H, N: innermost first
        if shape[axis] != 1:
            if strides[axis] != step:
                return False
            step *= shape[axis]
    return True


def copy_values(dst, src) -> None:
    """dst[...] = src, bit for bit, in any dtype and layout (NumPy or CuPy). bf16 arrays are
    copied as their 16-bit patterns, so the copy needs no bfloat16 support of the array
    module: a layer that only moves values (Concat, BatchJoin) runs on bf16 maps as they
    are, with no float32 copies. Two maps of one shape in one dense layout are copied as
    their flat views in memory order (pointwise_views): through the strides, CuPy copied a
    layer chunk's pieces of channels-last maps into the whole batch (BatchJoin) at a few
    percent of memory speed (VGG-16 bf16 on the H200: 0.235 ms for a 26 MB piece)."""
    if is_bfloat16(dst.dtype) and is_bfloat16(src.dtype):
        dst, src = dst.view(np.uint16), src.view(np.uint16)
    dst, src = pointwise_views(dst, src)
    dst[...] = src


def pixel_rows(a):
    """A channels-last map (N, C, H, W) as its (N * H * W, C) matrix in memory order (a view):
    one row per pixel, the channels along it."""
    return a.transpose(0, 2, 3, 1).reshape(-1, a.shape[1])


def layout_of(a) -> str:
    """'nchw' for a C-contiguous array, 'nhwc' for a channels-last 4-D one (C-contiguous wins
    where both hold: C == 1 or H == W == 1, when the two orders are the same); ValueError
    for any other strides."""
    if a.flags.c_contiguous:
        return "nchw"
    if is_channels_last(a):
        return "nhwc"
    raise ValueError(f"array of shape {a.shape} with strides {a.strides} is neither NCHW- nor "
                     f"NHWC-contiguous")


def in_memory_order(a):
    """The values of a dense array (NCHW or NHWC) as a flat view, in memory order."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    if is_channels_last(a):
        return a.transpose(0, 2, 3, 1).reshape(-1)
    raise ValueError(f"array of shape {a.shape} with strides {a.strides} is not dense")


def pointwise_views(*arrays) -> tuple:
    """Views to run a value-by-value operation on (an add, a copy, a product with a mask) at
    memory speed: arrays of one shape and one dense layout as flat views in memory order,
    where neighbouring values are neighbours in memory; otherwise the arrays themselves.

    Why: CuPy indexes a channels-last array (a transposed view) through its strides, and on
    the H200 its add of two NHWC maps ran at about a tenth of memory speed (ResNet-50 b256:
    92 ms of a 225 ms step in its residual adds and gradient sums); on the flat views the
    same operation reads each array once, in order.
    """
    first = arrays[0]
    if first.ndim != 4 or first.flags.c_contiguous or any(a.shape != first.shape
                                                          for a in arrays):
        return arrays
    try:
        common_layout("pointwise", arrays)
        return tuple(in_memory_order(a) for a in arrays)
    except ValueError:   # not dense, or the layouts differ: the strided operation is right
        return arrays


def common_layout(name: str, arrays) -> str:
    """The one layout of several 4-D arrays (see layout_of); ValueError naming `name` when they
    differ. Arrays where both orders coincide take the layout of the others."""
    layouts = set()
    for a in arrays:
        if a.flags.c_contiguous and is_channels_last(a):
            continue                     # either order: the same bytes
        layouts.add(layout_of(a))
    if len(layouts) > 1:
        raise ValueError(f"{name}: arrays mix NCHW and NHWC layouts "
                         f"({[(tuple(a.shape), tuple(a.strides)) for a in arrays]})")
    return layouts.pop() if layouts else "nchw"
