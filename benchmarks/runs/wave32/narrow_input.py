"""Each network's first convolution (3 input channels) at batch 256, channels last, with its
input's channels as they are and padded with zeros to 4 and 8: the fastest cuDNN plan of the
forward and of the weight gradient among the ten the profile measures (kernels/cuda.py,
conv_plans), and the pass that writes the padded copy of the input.

A pixel of 3 float32 values is 12 bytes, of 3 bf16 values 6: no plan can load it in 16-byte
vectors. Padded channels are zeros in the input and the filter, so the sums are those of the
unpadded convolution, in another order.

    python3 benchmarks/runs/wave32/narrow_input.py [--batch 256]
"""
import argparse

import cupy as cp
import numpy as np

from minidnn.kernels import ConvSpec, cuda
from minidnn.kernels.mapformat import bfloat16

FIRST = {   # name: (out channels, kernel, stride, padding, image size)
    "resnet50.conv1": (64, 7, 2, 3, 224),
    "googlenet.conv1": (64, 7, 2, 3, 224),
    "vgg16.conv1_1": (64, 3, 1, 1, 224),
    "alexnet.conv1": (96, 11, 4, 0, 227),
    "overfeat.conv1": (96, 11, 4, 0, 231),
}


def best(op, x_shape, w_shape, spec, dtype) -> tuple:
    table = cuda.conv_plans(op, x_shape, w_shape, spec, dtype, "nhwc")
    ran = [(ms, ws) for _, ws, ms in table if np.isfinite(ms)]
    ms, ws = min(ran)
    return ms, ws


def pad_ms(n, c, hw, to, dtype) -> float:
    """The padded copy written by CuPy's strided assignment (an upper bound on a kernel),
    bf16 as its 16-bit patterns."""
    dtype = np.uint16 if np.dtype(dtype).itemsize == 2 else np.float32
    x = cp.ones((n, hw, hw, c), dtype)
    xp = cp.zeros((n, hw, hw, to), dtype)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    xp[..., :c] = x
    start.record()
    for _ in range(10):
        xp[..., :c] = x
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 10


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    cuda.configure(math="tf32")
    print("| first convolution | dtype | channels | forward ms (workspace MiB) | "
          "weight gradient ms (workspace MiB) | padded copy ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, (o, k, s, p, hw) in FIRST.items():
        spec = ConvSpec(stride=(s, s), padding=(p, p), key=name)
        for dtype, label in ((np.dtype(np.float32), "float32 (TF32)"), (bfloat16(), "bf16")):
            for c in (3, 4, 8):
                x_shape, w_shape = (args.batch, c, hw, hw), (o, c, k, k)
                f_ms, f_ws = best("fprop", x_shape, w_shape, spec, dtype)
                g_ms, g_ws = best("wgrad", x_shape, w_shape, spec, dtype)
                copy = "-" if c == 3 else f"{pad_ms(args.batch, 3, hw, c, dtype):.3f}"
                print(f"| {name} | {label} | {c} | {f_ms:.3f} ({f_ws / 2**20:.0f}) | "
                      f"{g_ms:.3f} ({g_ws / 2**20:.0f}) | {copy} |", flush=True)
            cuda.clear_conv_cache()


if __name__ == "__main__":
    main()
