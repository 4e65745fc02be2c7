"""Where a training step's device time goes: every layer's forward and backward, measured.

    python3 scripts/layer_times.py --model resnet50 --batch 256 [--math tf32] [--top 15]
                                   [--json FILE]

Measures the network layer by layer on the device, as the planner's profiling pass does
(planner/profile.py: CUDA events around back-to-back calls, each convolution on its fastest
plan), and prints the time per layer kind (forward, backward, share of the total) and the
costliest layers. The sum is the step's device time without the memory manager's copies, the
loss and the optimizer: a lower bound on the step, and the place to look first when a step
is slow. On the CPU it runs too (wall-clock time per call).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--math", default="tf32", choices=("tf32", "fp32"))
    ap.add_argument("--layout", default=None, choices=("nchw", "nhwc"))
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
    maps = MapFormat(map_layout(device, args.layout))
    costs = measure_layers(net, args.batch, device, maps=maps)
    rows = [(name, net.node(name).layer.kind, c.time("forward"), c.time("backward"))
            for name, c in costs.items()]
    total = sum(f + b for _, _, f, b in rows)
    by_kind = defaultdict(lambda: [0, 0.0, 0.0])
    for _, kind, f, b in rows:
        by_kind[kind][0] += 1
        by_kind[kind][1] += f
        by_kind[kind][2] += b
    math = args.math if device.is_gpu else "fp32"
    print(f"{net.name} b{args.batch} on {device.name} ({math}, {maps.layout.upper()}): layers "
          f"{total * 1e3:.1f} ms (forward + backward, fastest plans)")
    print(f"{'kind':<12} {'layers':>6} {'forward ms':>11} {'backward ms':>12} {'share':>7}")
    for kind, (n, f, b) in sorted(by_kind.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"{kind:<12} {n:>6} {f * 1e3:>11.2f} {b * 1e3:>12.2f} {(f + b) / total:>7.1%}")
    print(f"\ncostliest {args.top} layers")
    for name, kind, f, b in sorted(rows, key=lambda r: -(r[2] + r[3]))[:args.top]:
        print(f"  {name:<24} {kind:<10} forward {f * 1e3:8.3f} ms  backward {b * 1e3:8.3f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "batch": args.batch, "device": device.name,
                       "math": math, "layout": maps.layout, "layers": [
                           {"name": n, "kind": k, "forward_s": f, "backward_s": b}
                           for n, k, f, b in rows]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    from minidnn.errors import MinidnnError
    try:
        sys.exit(main())
    except MinidnnError as e:   # an unknown model, an image too small: one line
        print(f"layer_times: error: {e}", file=sys.stderr)
        sys.exit(2)
