"""Where a training step's device time goes: every layer's forward and backward, measured.

    python3 scripts/layer_times.py --model resnet50 --batch 256 [--math tf32] [--top 15]
                                   [--precision bf16] [--json FILE]

Measures the network layer by layer on the device, as the planner's profiling pass does
(planner/profile.py: CUDA events around back-to-back calls, each convolution on its fastest
plan), and prints the time per layer kind (forward, backward, share of the total) and the
costliest layers. The sum is the step's device time without the memory manager's copies, the
loss and the optimizer: a lower bound on the step, and the place to look first when a step
is slow. On the CPU it runs too (wall-clock time per call).

Beside each time stands the layer's floor on an H200, max(FLOPs / dense peak, bytes / HBM
bandwidth), from the datasheet peaks below: forward reads each input and the weights once and
writes the output once; backward reads the output gradient, the inputs and the weights, and
writes the input and weight gradients (twice the forward FLOPs). "x floor" says how far a
layer is from what the hardware allows: a convolution near 1-3x is compute-bound and well
served; a pointwise layer at 5x moves its maps several times, the place a fused kernel wins.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import HBM_BYTES_PER_S  # noqa: E402


# H200 SXM datasheet: dense tensor-core peaks (the bandwidth: benchlib). Float32 math under 'fp32'
# runs on the CUDA cores (67 TFLOP/s); 'tf32' on the tensor cores.
PEAK_FLOPS = {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12}


def layer_bytes(layer, map_bytes: int) -> tuple[int, int]:
    """(forward, backward) bytes a layer must move at the least: maps of `map_bytes` per
    value, parameters in float32 (see the module docstring)."""
    inputs = sum(math.prod(s) for s in layer.in_shapes) * map_bytes
    output = math.prod(layer.out_shape) * map_bytes
    weights = sum(math.prod(p.shape) for p in layer.params.values()) * 4
    return inputs + output + weights, output + 2 * inputs + 2 * weights


def floors(layer, peak: float, map_bytes: int) -> tuple[float, float]:
    """(forward, backward) floor seconds of one layer: max(FLOPs / peak, bytes / HBM)."""
    fwd_bytes, bwd_bytes = layer_bytes(layer, map_bytes)
    flops = float(layer.flops())
    return (max(flops / peak, fwd_bytes / HBM_BYTES_PER_S),
            max(2 * flops / peak, bwd_bytes / HBM_BYTES_PER_S))


def main(argv=None) -> int:
    from minidnn.kernels.mapformat import LAYOUTS, PRECISIONS
    from minidnn.kernels.math_mode import MATH_MODES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--math", default="tf32", choices=MATH_MODES)
    ap.add_argument("--layout", default=None, choices=LAYOUTS)
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="feature maps in float32, or bf16 (mixed precision)")
    ap.add_argument("--top", type=int, default=15, help="costliest layers to list")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every layer's times")
    args = ap.parse_args(argv)

    from minidnn import kernels, models
    from minidnn.backend import select_device
    from minidnn.kernels.mapformat import MapFormat, map_layout
    from minidnn.planner.profile import measure_layers

    device = select_device(args.device)
    net = models.build(args.model, image_size=args.image_size)
    if device.is_gpu:
        kernels.for_device(device).configure(math=args.math)
    maps = MapFormat(map_layout(device, args.layout), args.precision)
    costs = measure_layers(net, args.batch, device, maps=maps)
    mode = args.math if device.is_gpu else "fp32"
    peak = PEAK_FLOPS["bf16" if args.precision == "bf16" else mode]
    map_bytes = 2 if args.precision == "bf16" else 4
    rows = []
    for name, c in costs.items():
        layer = net.node(name).layer
        rows.append((name, layer.kind, c.time("forward"), c.time("backward"),
                     sum(floors(layer, peak, map_bytes))))
    total = sum(f + b for _, _, f, b, _ in rows)
    floor = sum(r[4] for r in rows)
    by_kind = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for _, kind, f, b, least in rows:
        by_kind[kind][0] += 1
        by_kind[kind][1] += f
        by_kind[kind][2] += b
        by_kind[kind][3] += least
    gpu = device.is_gpu     # the floors are an H200's: beside a CPU's times they say nothing
    print(f"{net.name} b{args.batch} on {device.name} ({mode}, {args.precision} maps, "
          f"{maps.layout.upper()}): layers {total * 1e3:.1f} ms (forward + backward, fastest "
          f"plans)" + (f"; H200 floor {floor * 1e3:.1f} ms ({total / floor:.1f}x)" if gpu else ""))
    print(f"{'kind':<12} {'layers':>6} {'forward ms':>11} {'backward ms':>12} {'share':>7}" +
          (f" {'floor ms':>9} {'x floor':>8}" if gpu else ""))
    for kind, (n, f, b, least) in sorted(by_kind.items(),
                                         key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"{kind:<12} {n:>6} {f * 1e3:>11.2f} {b * 1e3:>12.2f} {(f + b) / total:>7.1%}" +
              (f" {least * 1e3:>9.2f} {(f + b) / least:>8.1f}" if gpu else ""))
    print(f"\ncostliest {args.top} layers")
    for name, kind, f, b, least in sorted(rows, key=lambda r: -(r[2] + r[3]))[:args.top]:
        print(f"  {name:<24} {kind:<10} forward {f * 1e3:8.3f} ms  backward {b * 1e3:8.3f} ms" +
              (f"  {(f + b) / least:5.1f}x floor" if gpu else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "batch": args.batch, "device": device.name,
                       "math": mode, "precision": args.precision, "layout": maps.layout,
                       "layers": [{"name": n, "kind": k, "forward_s": f, "backward_s": b,
                                   "floor_s": least} for n, k, f, b, least in rows]},
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    from minidnn.errors import MinidnnError
    try:
        sys.exit(main())
    except MinidnnError as e:   # an unknown model, an image too small: one line
        print(f"layer_times: error: {e}", file=sys.stderr)
        sys.exit(2)
