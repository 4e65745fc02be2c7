"""A residual add's backward and the first pass of the batch norm before it, on ResNet-50's
block outputs at batch 256 in channels last: the add's pass (cuda_pointwise.relu_mask_sum,
with the second gradient part it adds) then the batch norm's sums of the gradient it wrote,
against handed_sums, which takes those sums in the add's pass (minidnn/fusion.py, bn_sums).
Each way timed with CUDA events over `--repeats` calls after a warm-up, the bits of the two
compared; the bytes each moves and the speed that gives.

    python3 benchmarks/runs/wave25/handed_sums_clock.py [--repeats 20]
"""
import argparse
import os
import sys

import cupy as cp
import numpy as np

from minidnn.kernels import cuda_batchnorm as bn
from minidnn.kernels import cuda_pointwise as pw
from minidnn.kernels.mapformat import bfloat16, empty, in_memory_order

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
from benchlib import median_event_seconds  # noqa: E402

# (C, H = W, blocks): ResNet-50's four stages; every block's add hands its batch norm a map.
STAGES = ((256, 56, 3), (512, 28, 4), (1024, 14, 6), (2048, 7, 3))


def clock(fn, repeats: int) -> float:
    """Milliseconds a call of fn takes on the device, the median of `repeats`."""
    return median_event_seconds(cp, fn, repeats) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    print("| dtype | map (N, C, H, W) | blocks | add then sums ms | handed_sums ms | saved ms "
          "| GB/s then | GB/s handed | same bits |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, dtype in (("fp32", np.dtype(np.float32)), ("bf16", bfloat16())):
        total = [0.0, 0.0]
        for c, hw, blocks in STAGES:
            shape = (args.batch, c, hw, hw)
            rng = cp.random.default_rng(0)

            def fill():      # random values, channels last, rounded once for bf16
                values = rng.standard_normal((shape[0], hw, hw, c), dtype=cp.float32)
                values = values.transpose(0, 3, 1, 2)
                if dtype == np.float32:
                    return values
                out = empty(cp, shape, dtype, "nhwc")
                pw.float_to_bf16(values, out)
                return out
            y, gy, g2, x = fill(), fill(), fill(), fill()
            g_plain, g_handed = empty(cp, shape, dtype, "nhwc"), empty(cp, shape, dtype, "nhwc")
            mean = cp.zeros(c, cp.float32)
            geometry = bn._geometry(x, g_plain)

            def plain():
                pw.relu_mask_sum(y, gy, g2, g_plain)
                return bn._channel_partials(1, geometry, x, g_plain, (mean,) * 4)

            def handed():
                return bn.handed_sums(y, gy, g2, g_handed, x, mean)
            same = plain()[0].get().tobytes() == handed()[0].get().tobytes() and \
                cp.asnumpy(in_memory_order(g_plain).view(np.uint8)).tobytes() == \
                cp.asnumpy(in_memory_order(g_handed).view(np.uint8)).tobytes()
            t_plain, t_handed = clock(plain, args.repeats), clock(handed, args.repeats)
            values = int(np.prod(shape))
            size = dtype.itemsize
            # then: the add reads y, gy, g2 and writes g; the sums read g and x (6 maps)
            # handed: reads y, gy, g2, x and writes g (5 maps)
            print(f"| {name} | {shape} | {blocks} | {t_plain:.3f} | {t_handed:.3f} | "
                  f"{t_plain - t_handed:.3f} | {6 * values * size / t_plain / 1e6:.0f} | "
                  f"{5 * values * size / t_handed / 1e6:.0f} | {same} |")
            total[0] += blocks * t_plain
            total[1] += blocks * t_handed
        print(f"| {name} | ResNet-50's 16 blocks | 16 | {total[0]:.2f} | {total[1]:.2f} | "
              f"{total[0] - total[1]:.2f} | | | |")


if __name__ == "__main__":
    main()
