"""Memory speed of the GPU's concatenation, LRN and 3x3 stride-1 max-pool kernels on a
network's own shapes.

    python3 scripts/concat_lrn_bandwidth.py [--model googlenet] [--batch 256]
                                            [--layout nhwc] [--precision fp32] [--repeat 20]

For every Concat and LRN layer of the model at the batch, times the kernel's forward and
backward (CUDA events around `--repeat` back-to-back calls, after a warm-up call) on maps of
the layout and precision given, and prints the bytes each call must move at the least, the
achieved GB/s and its fraction of the H200's 4.8 TB/s:

* concat forward reads every input and writes the output; backward reads the output gradient
  and writes every input gradient: twice the output's bytes each way.
* LRN forward reads x and writes y and the scale (float32 beside bf16 maps); backward reads x,
  the scale and the output gradient and writes the input gradient.
* 3x3 stride-1 max pooling (inception's pool branch) forward reads x and writes y and the
  argmax (a byte per value); backward reads the output gradient and the argmax and writes the
  input gradient.

Beside each concatenation stands the time of CuPy's strided copies (one per input, the
layer's previous path), and beside each pool that of the kernels covering one pixel per
thread (cuda_pool.RUN3_POOLS off, on channels-last maps), so the gain is measured on the same
run.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import HBM_BYTES_PER_S, event_seconds  # noqa: E402



def device_map(cp, host, layout: str):
    """Host array `host` (any dtype, bf16 included) on the GPU in `layout`, through its bytes."""
    from minidnn.kernels import mapformat
    flat = cp.asarray(mapformat.arrange(host, layout).reshape(-1).view(np.uint8))
    return mapformat.shaped(flat, host.shape, host.dtype, layout)


def random_map(cp, shape, dtype, layout: str, rng):
    """A map of `shape` and `dtype` with normal values, stored in `layout`."""
    return device_map(cp, rng.standard_normal(shape, dtype=np.float32).astype(dtype), layout)


def empty_map(cp, shape, dtype, layout: str):
    """An uninitialised map of `shape` and `dtype` stored in `layout`."""
    from minidnn.kernels import mapformat
    flat = cp.empty(math.prod(shape) * np.dtype(dtype).itemsize, np.uint8)
    return mapformat.shaped(flat, shape, dtype, layout)


def report(name: str, kind: str, seconds: float, nbytes: int, before: float | None = None,
           before_name: str = "CuPy copies") -> str:
    """One kernel's line: time, bytes, GB/s, fraction of HBM; `before`: the time of the path
    it replaced (`before_name`) and the speed-up."""
    rate = nbytes / seconds
    line = (f"  {name:<24} {kind:<8} {seconds * 1e3:8.3f} ms  {nbytes / 1e6:9.1f} MB  "
            f"{rate / 1e9:7.0f} GB/s  {rate / HBM_BYTES_PER_S:6.1%} of 4.8 TB/s")
    if before is not None:
        line += f"  ({before_name} {before * 1e3:.3f} ms, {before / seconds:.1f}x)"
    return line


def main(argv=None) -> int:
    from minidnn.kernels.mapformat import LAYOUTS, PRECISIONS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="googlenet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layout", default="nhwc", choices=LAYOUTS)
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)

    from minidnn import models
    from minidnn import backend
    from minidnn.errors import ConfigError
    from minidnn.kernels import cpu, mapformat
    from minidnn.layers.lrn import LRN
    from minidnn.layers.merge import Concat
    from minidnn.layers.pool import MaxPool2d

    if not backend.gpu_available():
        raise ConfigError("concat_lrn_bandwidth.py times GPU kernels: no CUDA GPU here")
    import cupy as cp
    from minidnn.kernels import cuda, cuda_pool

    net = models.build(args.model)
    net.infer_shapes(args.batch)
    dtype = mapformat.MapFormat(args.layout, args.precision).map_dtype(np.float32)
    item = np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    print(f"{net.name} b{args.batch}, {args.layout.upper()}, {args.precision} maps, "
          f"{args.repeat} calls each")
    totals = {"concat": [0.0, 0], "lrn": [0.0, 0], "3x3 stride-1 max pool": [0.0, 0]}
    for node in net.nodes:
        layer = node.layer
        if isinstance(layer, Concat):
            xs = [random_map(cp, s, dtype, args.layout, rng) for s in layer.in_shapes]
            y = empty_map(cp, layer.out_shape, dtype, args.layout)
            gy = random_map(cp, layer.out_shape, dtype, args.layout, rng)
            gxs = [empty_map(cp, s, dtype, args.layout) for s in layer.in_shapes]
            nbytes = 2 * math.prod(layer.out_shape) * item
            axis = layer._axis
            calls = {"forward": (lambda: cuda.concat_forward(xs, y, axis),
                                 lambda: cpu.concat_forward(xs, y, axis)),
                     "backward": (lambda: cuda.concat_backward(gy, gxs, layer.sizes, axis),
                                  lambda: cpu.concat_backward(gy, gxs, layer.sizes, axis))}
            for kind, (fast, slow) in calls.items():
                seconds = event_seconds(cp, fast, args.repeat)
                totals["concat"][0] += seconds
                totals["concat"][1] += nbytes
                before = event_seconds(cp, slow, args.repeat)
                print(report(node.name, kind, seconds, nbytes, before))
        elif isinstance(layer, LRN):
            shape = layer.in_shapes[0]
            values = math.prod(shape)
            x = random_map(cp, shape, dtype, args.layout, rng)
            gy = random_map(cp, shape, dtype, args.layout, rng)
            y, gx = (empty_map(cp, shape, dtype, args.layout) for _ in range(2))
            scale = empty_map(cp, shape, np.float32 if args.precision == "bf16" else dtype,
                              args.layout)
            scale_item = scale.dtype.itemsize
            for kind, call, nbytes in (
                    ("forward", lambda: cuda.lrn_forward(x, y, scale, layer.spec),
                     values * (2 * item + scale_item)),
                    ("backward", lambda: cuda.lrn_backward(x, None, scale, gy, gx, layer.spec),
                     values * (3 * item + scale_item))):
                seconds = event_seconds(cp, call, args.repeat)
                totals["lrn"][0] += seconds
                totals["lrn"][1] += nbytes
                print(report(node.name, kind, seconds, nbytes))
        elif (isinstance(layer, MaxPool2d) and tuple(layer.spec.kernel) == (3, 3)
              and tuple(layer.spec.stride) == (1, 1)):
            spec = layer.spec
            x = random_map(cp, layer.in_shapes[0], dtype, args.layout, rng)
            gy = random_map(cp, layer.out_shape, dtype, args.layout, rng)
            y, gx = (empty_map(cp, s, dtype, args.layout)
                     for s in (layer.out_shape, layer.in_shapes[0]))
            argmax = empty_map(cp, layer.out_shape, np.uint8, args.layout)
            values_in, values_out = math.prod(layer.in_shapes[0]), math.prod(layer.out_shape)
            for kind, call, nbytes in (
                    ("forward", lambda: cuda.maxpool2d_forward(x, y, argmax, spec),
                     values_in * item + values_out * (item + 1)),
                    ("backward", lambda: cuda.maxpool2d_backward(gy, argmax, gx, spec),
                     values_out * (item + 1) + values_in * item)):
                seconds = event_seconds(cp, call, args.repeat)
                cuda_pool.RUN3_POOLS = False
                try:
                    before = event_seconds(cp, call, args.repeat)
                finally:
                    cuda_pool.RUN3_POOLS = True
                totals["3x3 stride-1 max pool"][0] += seconds
                totals["3x3 stride-1 max pool"][1] += nbytes
                print(report(node.name, kind, seconds, nbytes, before, "a pixel a thread"))
    for kind, (seconds, nbytes) in totals.items():
        if seconds:
            print(f"{kind}: {seconds * 1e3:.2f} ms forward + backward, "
                  f"{nbytes / seconds / HBM_BYTES_PER_S:.1%} of 4.8 TB/s")
    return 0


if __name__ == "__main__":
    from minidnn.errors import MinidnnError
    try:
        sys.exit(main())
    except MinidnnError as e:
        print(f"concat_lrn_bandwidth: error: {e}", file=sys.stderr)
        sys.exit(2)
