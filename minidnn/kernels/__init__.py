"""Kernels: the heavy operations behind the layers, one module per implementation.

* `cpu.py`  — the reference: written against `xp` (NumPy arrays in, NumPy arrays out; the
  same code also runs on CuPy arrays, which the GPU tests use as a second opinion).
* `cuda.py` — the GPU implementation, every function with the signature of its cpu.py twin:
  convolutions through cuDNN (`cudnn_conv.py`: the frontend's graphs and measured plans),
  pooling, ReLU, the bias add, LRN and concatenation as CuPy raw kernels (`cuda_pool.py`,
  `cuda_pointwise.py`, `cuda_lrn.py`, `cuda_concat.py`, with `cuda_divide.py`'s division by
  launch constants), Linear's products on bf16 maps through cuBLAS (`cuda_linear.py`) and the
  bf16 copies of the weights those products read (`cuda_weights.py`).

Layers never import either module: they call `ctx.kernels.<op>(...)`, and the executor puts
the right module in the StepContext for its device. Every op writes into output arrays it is
given (it never returns a new feature map) and may draw temporaries only from the array module
(on the GPU those come out of the memory manager's arena).

The ops (shapes: x (N, C, H, W), w (O, C // groups, KH, KW), y (N, O, OH, OW)):

    conv2d_forward(x, w, b, y, spec, workspace=None, relu=False)
                                                     y = conv(x, w) + b   (b may be None);
                                                     relu: y = max(that, 0), b given (the
                                                     GPU's float32 maps: in the epilogue)
    conv2d_backward_data(gy, w, gx, spec, workspace=None)      gx = conv^T(gy, w) (overwrites gx)
    conv2d_backward_filter(x, gy, gw, gb, spec, workspace=None)
                                                     gw, gb (gb may be None; both overwritten)
    (workspace: a flat uint8 device block for cuDNN, planned by the memory manager; the
    convolution allocates its own when it is None or too small)
    linear_forward(x, w, b, y)                       y (N, out) = x (N, in) @ w^T + b
    linear_backward(x, gy, w, gw, gb, gx, add=False) gw (added to under add), gb, gx
    maxpool2d_forward(x, y, argmax, spec, relu=False, rectify=None)
                                                     argmax: uint8 (N, C, OH, OW), the winning
                                                     offset kh * KW + kw inside the window;
                                                     relu: | RELU_MASK_BIT where y > 0;
                                                     rectify (bias, stored): x is the input of
                                                     the ReLU before the pool, which the pool
                                                     applies (minidnn/fusion.py)
    maxpool2d_backward(gy, argmax, gx, spec, relu=False, gb=None)
                                                     gx overwritten (zeros where no winner);
                                                     relu: argmax marked so, and gx also
                                                     masked as the backward of a ReLU before
                                                     the pool would (minidnn/fusion.py);
                                                     gb (C,): also bias_grad(gx, gb)
    avgpool2d_forward(x, y, spec)
    avgpool2d_backward(gy, gx, spec)
    lrn_forward(x, y, scale, spec)                   scale = k + alpha/size * sum(x^2 over window)
    lrn_backward(x, y, scale, gy, gx, spec)          y may be None: y / scale = x * scale**(-beta-1)
    concat_forward(xs, y, axis)                      y = the xs joined along axis (copies)
    concat_backward(gy, gxs, sizes, axis)            gxs[k] = gy's slice k (sizes[k] wide);
                                                     None entries skipped
    bias_add(y, b)                                   y += b (O,) per channel, in place: a
                                                     convolution's bias after its product
    bias_grad(gy, gb)                                gb (O,) = sum of gy over N, OH, OW
    add(a, b, out)                                   out = a + b (one shape); out may be a or b
    add_relu(a, b, out)                              out = max(a + b, 0): a residual add with
                                                     the ReLU after it (minidnn/fusion.py)
    relu_mask_copy(y, gy, gx0, gx1)                  gx0 = gx1 = gy * (y > 0), its backward;
                                                     gx0 may be gy, gx1 None
    relu_mask_sum_copy(y, gy, g2, gx0, gx1)          the same of gy + g2 (the sum rounded
                                                     once, as add's): a gradient sum the
                                                     add takes over (minidnn/fusion.py)
    relu_mask_sum(y, gy, g2, gx)                     relu_mask_sum_copy to gx alone (bn_grad);
                                                     gx may be gy
    sgd_update(params, lr, momentum, weight_decay)   SGD's update of [(w, g, v)], in place
                                                     (optim.py; one launch per dtype on a GPU)
    relu_forward(x, y, bias=None)                    y = max(x + bias, 0); y may be x (in
                                                     place); bias (C,): a convolution's
                                                     (minidnn/fusion.py)
    relu_backward(y, gy, gx, gb=None)                gx = gy * (y > 0); gx may be gy; gb (C,):
                                                     also bias_grad(gx, gb), that bias's
    relu_forward_bits(x, y, mask, bias=None)         the same, and the bits of y > 0 into mask:
                                                     uint8 (relu_mask_bytes(x.size),), element
                                                     i at bit i % 8 of byte i // 8
    relu_backward_bits(mask, gy, gx, gb=None)        gx = gy where the bit is set, else 0
    scale_by_mask(x, mask, y, scale)                 y = (x * mask) * scale (dropout: mask bool
                                                     or uint8 of x's shape and layout, scale
                                                     1 / (1 - p)); y may be x
    float_to_bf16(src, dst)                          dst (bfloat16) = src (float32), rounded
                                                     to nearest even; one shape and layout
    bf16_to_float(src, dst)                          dst (float32) = src (bfloat16), exact

Mixed precision (bf16 feature maps, kernels/mapformat.py): `BF16_OPS` names the ops of a module
that take bf16 maps as they are, with float32 parameters, their gradients and per-channel
arrays (on the GPU: convolutions, matrix products, ReLU, pooling, scale_by_mask, add,
add_relu, batch norm, LRN; on the CPU none; mapformat.BF16_OPS lists both without importing
CuPy). A layer computing only with such ops runs on bf16 maps; any other sees them widened to
float32 (layers/precision.py). `shared_weight_copies(lasting)` is a context for the passes of
one batch, in which the bf16 copies the products read of each weight are made once (inside the
allocator's `lasting`: they outlive the call that makes them).
"""
from __future__ import annotations

from dataclasses import dataclass


def out_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1,
             ceil_mode: bool = False) -> int:
    """Output length of a conv/pool window along one axis (PyTorch's rule, ceil_mode too:
    with ceil_mode a last window must start inside the input or its left padding)."""
    span = dilation * (kernel - 1) + 1
    num = size + 2 * padding - span
    if ceil_mode:
        out = -(-num // stride) + 1
        if (out - 1) * stride >= size + padding:
            out -= 1
    else:
        out = num // stride + 1
    return out


#: A max pool that applies the mask of the ReLU before it (minidnn/fusion.py) marks with this
#: bit of its argmax the windows whose maximum is > 0; the offset keeps the bits below it, so
#: such a pool's windows have at most RELU_MASK_POSITIONS positions.
RELU_MASK_BIT = 0x80
RELU_MASK_POSITIONS = RELU_MASK_BIT


def relu_mask_fits(kernel) -> bool:
    """Whether a max pool of window `kernel` (KH, KW) leaves its argmax RELU_MASK_BIT free."""
    kh, kw = kernel
    return kh * kw <= RELU_MASK_POSITIONS


def relu_mask_bytes(n: int) -> int:
    """Bytes of a ReLU bit mask of n values: whole 32-bit words, one bit per value."""
    return (int(n) + 31) // 32 * 4


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D convolution's settings.

    algo: 'fastest' (the cuDNN plan measured fastest, any workspace) or 'min_workspace' (the
    fastest plan among those needing the least workspace); workspace_limit: with 'fastest',
    the fastest plan whose workspace is at most this many bytes (None: no limit). The memory
    manager may change both per layer. key: a name for caches (the layer's name).
    """
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    algo: str = "fastest"
    key: str = ""
    workspace_limit: int | None = None


@dataclass(frozen=True)
class PoolSpec:
    """A 2-D pooling window. count_include_pad: avg-pool divides by the full window size."""
    kernel: tuple = (2, 2)
    stride: tuple = (2, 2)
    padding: tuple = (0, 0)
    ceil_mode: bool = False
    count_include_pad: bool = True


@dataclass(frozen=True)
class LRNSpec:
    """Local response normalization across channels (AlexNet): b = a / scale**beta with
    scale = k + alpha / size * sum over `size` neighbouring channels of a**2 (PyTorch's rule)."""
    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 2.0


def for_device(device):
    """The kernel module for a Device: cuda.py on a GPU, cpu.py on the CPU."""
    if device is not None and device.is_gpu:
        try:
            from . import cuda
        except ImportError as e:
            from ..errors import DeviceError
            raise DeviceError(f"the GPU kernels need the cuDNN frontend and CuPy "
                              f"(install the 'gpu' extra): {e}") from e
        return cuda
    from . import cpu
    return cpu
