"""A max pool's backward that applies the ReLU's mask and sums the bias gradient of the
convolution before that ReLU in its pass (cuda_pool.maxpool2d_backward with gb; 2x2 windows
that tile VGG-16's five pool inputs, batch 256, channels last), its threads loading
POOL_SUMS_RUN pixels before adding them, for each run length the kernel is built for,
beside the pool then cuda_pointwise.bias_grad. CUDA events, the median of `--repeats` calls
after one; the bits of every way compared with the pool then the sums; the bytes the fused
pass moves (reads gy and argmax, a quarter of the map each, writes gx) and the speed that
gives.

    python3 benchmarks/runs/wave32/pool_run_clock.py [--repeats 20] [--dtypes bf16]

(Call 3 ran it with the kernel built for runs of 1, 2, 4 and 8; it is now built for 1 and 4.)
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

POOLED = ((64, 224), (128, 112), (256, 56), (512, 28), (512, 14))   # (C, H = W)
SPEC = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))


def clock(fn, repeats: int) -> float:
    """Milliseconds a call of fn takes on the device, the median of `repeats`."""
    return median_event_seconds(cp, fn, repeats) * 1e3


def host_bytes(a) -> bytes:
    return cp.asnumpy(in_memory_order(a).view(np.uint8)).tobytes()


def random_map(rng, shape, dtype):
    """Normal values (N, C, H, W) laid out channels last, rounded once to bf16 for bf16."""
    n, c, h, w = shape
    values = rng.standard_normal((n, h, w, c), dtype=cp.float32).transpose(0, 3, 1, 2)
    if dtype == np.float32:
        return values
    rounded = empty(cp, shape, dtype, "nhwc")
    pw.float_to_bf16(values, rounded)
    return rounded


def pooled(batch: int, c: int, hw: int, dtype) -> tuple:
    """(gy, argmax): a max pool's output gradient and winners over a random ReLU input of
    (batch, c, hw, hw), the pool applying the ReLU (pool_relu_forward)."""
    rng = cp.random.default_rng(0)
    shape, out = (batch, c, hw, hw), (batch, c, hw // 2, hw // 2)
    x, gy = random_map(rng, shape, dtype), random_map(rng, out, dtype)
    y, argmax = empty(cp, out, dtype, "nhwc"), empty(cp, out, np.uint8, "nhwc")
    cuda_pool.maxpool2d_forward(x, y, argmax, SPEC, relu=True)
    return gy, argmax


def backward(gy, argmax, shape, dtype, fused: bool):
    """(a call of the pool's backward writing gx and the bias gradient gb, gx, gb): in one
    pass (fused) or the pool then bias_grad."""
    gx, gb = empty(cp, shape, dtype, "nhwc"), cp.zeros(shape[1], cp.float32)
    if fused:
        return (lambda: cuda_pool.maxpool2d_backward(gy, argmax, gx, SPEC, relu=True, gb=gb),
                gx, gb)

    def pool_then_sums():
        cuda_pool.maxpool2d_backward(gy, argmax, gx, SPEC, relu=True)
        pw.bias_grad(gx, gb)
    return pool_then_sums, gx, gb


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtypes", default="fp32,bf16", help="the rows: fp32, bf16 or both")
    args = ap.parse_args()
    rows = {"fp32": np.dtype(np.float32), "bf16": bfloat16()}
    wanted = args.dtypes.split(",")
    if not set(wanted) <= set(rows):
        ap.error(f"--dtypes: {args.dtypes!r} names none but fp32 and bf16")
    runs = cuda_pool.POOL_SUMS_RUNS
    print("| dtype | map (N, C, H, W) | pool then sums ms | "
          + " | ".join(f"fused, run {r} ms (GB/s)" for r in runs) + " | same bits |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in runs) + " | --- |")
    for name in wanted:
        dtype = rows[name]
        total = np.zeros(len(runs) + 1)
        for c, hw in POOLED:
            shape = (args.batch, c, hw, hw)
            gy, argmax = pooled(args.batch, c, hw, dtype)
            plain, g_plain, b_plain = backward(gy, argmax, shape, dtype, fused=False)
            fused, g_fused, b_fused = backward(gy, argmax, shape, dtype, fused=True)
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
