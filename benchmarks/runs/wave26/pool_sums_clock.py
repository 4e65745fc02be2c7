"""A max pool's backward that applies the ReLU's mask, then the bias gradient of the
convolution before that ReLU, on VGG-16's five pool inputs at batch 256 in channels last:
cuda_pool.maxpool2d_backward then cuda_pointwise.bias_grad, against maxpool2d_backward with
the bias gradient handed in (gb), which sums it in the pool's pass (minidnn/fusion.py,
pool_bias), with the column passes' rows in contiguous shares per block and strided over the
map (cuda_pointwise.STRIDED_COLUMNS); then the ReLU's backward with the bias gradient in its
pass (cuda_pointwise.relu_backward with gb) on VGG-16's other eight ReLU maps, both ways.
Each way timed with CUDA events over `--repeats` calls after a warm-up, the bits of the two
compared; the bytes each moves and the speed that gives.

    python3 benchmarks/runs/wave26/pool_sums_clock.py [--repeats 20]
"""
import argparse
import os
import sys

import cupy as cp
import numpy as np

from minidnn.kernels import PoolSpec
from minidnn.kernels import cuda_pointwise as pw
from minidnn.kernels import cuda_pool
from minidnn.kernels.mapformat import bfloat16, empty, in_memory_order

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
from benchlib import median_event_seconds  # noqa: E402

# (C, H = W) of the maps VGG-16's pools read (conv1_2 ... conv5_3, after their ReLUs).
POOLED = ((64, 224), (128, 112), (256, 56), (512, 28), (512, 14))
# (C, H = W) of its ReLUs whose backward masks and sums the bias itself (no pool after them).
RELUS = ((64, 224), (128, 112), (256, 56), (256, 56), (512, 28), (512, 28), (512, 14),
         (512, 14))
SPEC = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))


def clock(fn, repeats: int) -> float:
    """Milliseconds a call of fn takes on the device, the median of `repeats`."""
    return median_event_seconds(cp, fn, repeats) * 1e3


def host_bytes(a) -> bytes:
    return cp.asnumpy(in_memory_order(a).view(np.uint8)).tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    print("| dtype | rows strided | map (N, C, H, W) | pool then sums ms | summed in the pool ms "
          "| saved ms | GB/s then | GB/s fused | same bits |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    dtypes = (("fp32", np.dtype(np.float32)), ("bf16", bfloat16()))
    for (name, dtype), strided in ((d, s) for d in dtypes for s in (False, True)):
        pw.STRIDED_COLUMNS = batch = strided
        total = [0.0, 0.0]
        for c, hw in POOLED:
            shape, out = (args.batch, c, hw, hw), (args.batch, c, hw // 2, hw // 2)
            rng = cp.random.default_rng(0)

            def fill(s):      # random values, channels last, rounded once for bf16
                values = rng.standard_normal((s[0], s[2], s[3], s[1]), dtype=cp.float32)
                values = values.transpose(0, 3, 1, 2)
                if dtype == np.float32:
                    return values
                narrow = empty(cp, s, dtype, "nhwc")
                pw.float_to_bf16(values, narrow)
                return narrow
            x, gy = fill(shape), fill(out)
            y, argmax = empty(cp, out, dtype, "nhwc"), empty(cp, out, np.uint8, "nhwc")
            cuda_pool.maxpool2d_forward(x, y, argmax, SPEC, relu=True)
            g_plain, g_fused = empty(cp, shape, dtype, "nhwc"), empty(cp, shape, dtype, "nhwc")
            b_plain, b_fused = cp.zeros(c, cp.float32), cp.zeros(c, cp.float32)

            def plain():
                cuda_pool.maxpool2d_backward(gy, argmax, g_plain, SPEC, relu=True)
                pw.bias_grad(g_plain, b_plain)

            def fused():
                cuda_pool.maxpool2d_backward(gy, argmax, g_fused, SPEC, relu=True, gb=b_fused)
            plain()
            fused()
            same = host_bytes(g_plain) == host_bytes(g_fused) and \
                b_plain.get().tobytes() == b_fused.get().tobytes()
            t_plain, t_fused = clock(plain, args.repeats), clock(fused, args.repeats)
            values, size = int(np.prod(shape)), dtype.itemsize
            # then: the pool reads gy and argmax (a quarter of the map each, argmax 1 byte a
            # value) and writes gx; the sums read gx. Fused: the pool's bytes alone.
            pool_bytes = values * size * 1.25 + values / 4
            print(f"| {name} | {batch} | {shape} | {t_plain:.3f} | {t_fused:.3f} | "
                  f"{t_plain - t_fused:.3f} | {(pool_bytes + values * size) / t_plain / 1e6:.0f}"
                  f" | {pool_bytes / t_fused / 1e6:.0f} | {same} |")
            total[0] += t_plain
            total[1] += t_fused
        print(f"| {name} | {batch} | VGG-16's five pools | {total[0]:.2f} | {total[1]:.2f} | "
              f"{total[0] - total[1]:.2f} | | | |")
    print()
    print("| dtype | map (N, C, H, W) | ReLU backward and bias sums, contiguous ms | strided ms "
          "| GB/s contiguous | GB/s strided |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, dtype in dtypes:
        total = [0.0, 0.0]
        for c, hw in RELUS:
            shape = (args.batch, c, hw, hw)
            rng = cp.random.default_rng(1)
            values = rng.standard_normal((shape[0], hw, hw, c), dtype=cp.float32)
            y, g = (empty(cp, shape, dtype, "nhwc") for _ in range(2))
            for m in (y, g):
                if dtype == np.float32:
                    m[...] = values.transpose(0, 3, 1, 2)
                else:
                    pw.float_to_bf16(values.transpose(0, 3, 1, 2), m)
            gx, gb = empty(cp, shape, dtype, "nhwc"), cp.zeros(c, cp.float32)
            times = []
            for strided in (False, True):
                pw.STRIDED_COLUMNS = strided
                times.append(clock(lambda: pw.relu_backward(y, g, gx, gb), args.repeats))
            nbytes = 3 * int(np.prod(shape)) * dtype.itemsize      # reads y, gy; writes gx
            print(f"| {name} | {shape} | {times[0]:.3f} | {times[1]:.3f} | "
                  f"{nbytes / times[0] / 1e6:.0f} | {nbytes / times[1] / 1e6:.0f} |")
            total = [total[0] + times[0], total[1] + times[1]]
        print(f"| {name} | VGG-16's eight ReLUs | {total[0]:.2f} | {total[1]:.2f} | | |")


if __name__ == "__main__":
    main()
