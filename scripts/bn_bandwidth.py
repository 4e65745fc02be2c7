"""How close the batch-norm GPU kernels come to memory speed, on ResNet-50's shapes.

    python3 scripts/bn_bandwidth.py [--model resnet50] [--batch 256] [--precision bf16]
                                    [--layout nhwc] [--repeats 20] [--timing graph]

For every batch-norm shape of the network (bf16 channels-last maps by default: the fast
step's) each pass of kernels/cuda_batchnorm.py is timed with CUDA events over back-to-back
calls captured in a CUDA graph (`--timing graph`, the default: no host time in the figures,
which the small shapes need; `--timing events` issues the calls from Python), and its bytes (each map it reads and writes, once) give the bandwidth it reached and
its fraction of the H200's 4.8 TB/s:

    stats          forward per-channel sums (stage one and two)          reads x
    affine         y = x * scale + shift                                 reads x, writes y
    affine+relu    the same with the ReLU after it (minidnn/fusion.py)   reads x, writes y
    grad sums      backward per-channel sums (stage one and two)         reads x, gy
    grad sums+relu the same through the ReLU's mask, recomputed from x   reads x, gy
    grad           gx = gy * a + (x - mean) * b + d                      reads x, gy, writes gx
    grad+relu      the same through the ReLU's mask                      reads x, gy, writes gx

The table lists each pass per shape (with how many batch norms of the network have it) and
the whole network's totals (each shape's time times its count). Needs a GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import HBM_BYTES_PER_S, CachedEmpty, event_seconds, graph_seconds  # noqa: E402



def passes(cp, bn, x, gy, gx, y, w, b, mean, invstd):
    """{pass name: (a callable running it, the maps it moves (reads + writes))}."""
    geometry = bn._geometry(x, gy, gx)
    c = x.shape[1]
    coef = bn._forward_coefficients(mean, invstd, w, b)
    grad_coef = cp.zeros((6, c), coef.dtype)
    grad_coef[4:] = coef

    def sums(mode):
        def run():
            channel = (mean, invstd, w, b)
            bn._channel_partials(mode, geometry, x, None if mode == 0 else gy,
                                 None if mode == 0 else channel)
        return run

    return {
        "stats": (sums(0), 1),
        "affine": (lambda: bn._affine(geometry, x, y, coef), 2),
        "affine+relu": (lambda: bn._affine(geometry, x, y, coef, relu=True), 2),
        "grad sums": (sums(1), 2),
        "grad sums+relu": (sums(2), 2),
        "grad": (lambda: bn._per_value("bn_grad_last",
                                       ("bn_grad_planes", "0"), geometry, (x, gy, gx),
                                       grad_coef), 3),
        "grad+relu": (lambda: bn._per_value("bn_grad_relu_last", ("bn_grad_planes", "1"),
                                            geometry, (x, gy, gx), grad_coef), 3),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--timing", choices=("graph", "events"), default="graph",
                        help="graph: calls captured in a CUDA graph (no host time); events: "
                             "calls issued from Python between two events")
    args = parser.parse_args(argv)

    import numpy as np
    from minidnn import models
    from minidnn.backend import gpu_available, gpu_unavailable_reason
    from minidnn.errors import ConfigError
    from minidnn.kernels import mapformat
    if not gpu_available():
        print(f"minidnn: error: bn_bandwidth.py needs a GPU ({gpu_unavailable_reason()})",
              file=sys.stderr)
        return 2
    import cupy as cp
    from minidnn.kernels import cuda_batchnorm as bn
    if args.timing == "graph":
        bn.cp = CachedEmpty(cp)          # the partial sums' scratch: no allocation captured
    timer = graph_seconds if args.timing == "graph" else event_seconds
    try:
        net = models.build(args.model)
    except ConfigError as exc:
        print(f"minidnn: error: {exc}", file=sys.stderr)
        return 2
    shapes = Counter(tuple(n.layer.in_shapes[0][1:]) for n in net.nodes
                     if n.layer.kind == "batchnorm")
    if not shapes:
        print(f"minidnn: error: {args.model} has no batch norm", file=sys.stderr)
        return 2
    map_dtype = mapformat.MapFormat(args.layout, args.precision).map_dtype(np.float32)
    print(f"{args.model} b{args.batch}, {args.precision} {args.layout}: {sum(shapes.values())} "
          f"batch norms, {len(shapes)} shapes; GB/s and fraction of "
          f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s ({args.timing} timing)")
    names = None
    totals = Counter()
    total_bytes = Counter()
    for (c, h, w), count in sorted(shapes.items(), key=lambda kv: -kv[0][1]):
        shape = (args.batch, c, h, w)
        rng = np.random.default_rng(0)

        def device_map():
            host = rng.standard_normal(shape).astype(np.float32).astype(map_dtype)
            flat = cp.asarray(mapformat.arrange(host, args.layout).reshape(-1).view(np.uint8))
            return mapformat.shaped(flat, shape, map_dtype, args.layout)

        x, gy, gx, y = device_map(), device_map(), device_map(), device_map()
        w_ = cp.asarray(1 + 0.1 * rng.standard_normal(c), dtype=np.float32)
        b_ = cp.asarray(0.1 * rng.standard_normal(c), dtype=np.float32)
        mean, invstd = cp.zeros(c, np.float32), cp.ones(c, np.float32)
        table = passes(cp, bn, x, gy, gx, y, w_, b_, mean, invstd)
        if names is None:
            names = list(table)
            print(f"{'shape (C, H, W) x count':<26}" + "".join(f"{n:>22}" for n in names))
        row = f"{f'{(c, h, w)} x {count}':<26}"
        for name, (run, maps) in table.items():
            seconds = timer(cp, run, args.repeats)
            nbytes = maps * x.nbytes
            totals[name] += seconds * count
            total_bytes[name] += nbytes * count
            rate = nbytes / seconds
            row += f"{rate / 1e9:>12.0f} ({rate / HBM_BYTES_PER_S:4.0%})"[-22:].rjust(22)
        print(row)
        del x, gy, gx, y
    line = f"{'network (ms, GB/s, frac)':<26}"
    for name in names:
        rate = total_bytes[name] / totals[name]
        line += f"{totals[name] * 1e3:>7.2f} {rate / 1e9:>6.0f} ({rate / HBM_BYTES_PER_S:4.0%})"\
            .rjust(22)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
