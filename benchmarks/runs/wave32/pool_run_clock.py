"""A max pool's backward that applies the ReLU's mask and sums the bias gradient of the
convolution before that ReLU in its pass (cuda_pool.maxpool2d_backward with gb; 2x2 windows
that tile VGG-16's five pool inputs, batch 256, channels last), its threads loading
POOL_SUMS_RUN pixels before adding them, for each run length the kernel is built for,
beside the pool then cuda_pointwise.bias_grad. CUDA events, the median of `--repeats` calls
after one; the bits of every way compared with the pool then the sums; the bytes the fused
pass moves (reads gy and argmax, a quarter of the map each, writes gx) and the speed that
gives.

    python3 benchmarks/runs/wave32/pool_run_clock.py [--repeats 20]

(Call 3 ran it with the kernel built for runs of 1, 2, 4 and 8; it is now built for 1 and 4.)
"""
import argparse

import cupy as cp
import numpy as np

from minidnn.kernels import PoolSpec
from minidnn.kernels import cuda_pointwise as pw
from minidnn.kernels import cuda_pool
from minidnn.kernels.mapformat import bfloat16, empty, in_memory_order

POOLED = ((64, 224), (128, 112), (256, 56), (512, 28), (512, 14))   # (C, H = W)
SPEC = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))


def clock(fn, repeats: int) -> float:
    """Milliseconds a call of fn takes on the device, the median of `repeats`."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def host_bytes(a) -> bytes:
    return cp.asnumpy(in_memory_order(a).view(np.uint8)).tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    runs = cuda_pool.POOL_SUMS_RUNS
    print(f"| dtype | map (N, C, H, W) | pool then sums ms | "
          + " | ".join(f"fused, run {r} ms (GB/s)" for r in runs) + " | same bits |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in runs) + " | --- |")
    for name, dtype in (("fp32", np.dtype(np.float32)), ("bf16", bfloat16())):
        total = np.zeros(len(runs) + 1)
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
            expected = host_bytes(g_plain), b_plain.get().tobytes()
            times, same = [clock(plain, args.repeats)], True
            for run in runs:
                cuda_pool.POOL_SUMS_RUN = run
                fused()
                same &= (host_bytes(g_fused), b_fused.get().tobytes()) == expected
                times.append(clock(fused, args.repeats))
            values = int(np.prod(shape))
            fused_bytes = values * dtype.itemsize * 1.25 + values / 4
            print(f"| {name} | {shape} | {times[0]:.3f} | "
                  + " | ".join(f"{t:.3f} ({fused_bytes / t / 1e6:.0f})" for t in times[1:])
                  + f" | {same} |", flush=True)
            total += times
        print(f"| {name} | VGG-16's five pools | "
              + " | ".join(f"{t:.2f}" for t in total) + " | |")


if __name__ == "__main__":
    main()
