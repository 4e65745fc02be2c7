"""A pass's layer calls timed in sequence beside the profile's clock of each call alone.

    python3 benchmarks/runs/wave35/sequence_clock.py --model alexnet --batch 4 \
        --precision fp32 [--repeats 20] [--pairs]

The profile times each call replayed back to back from a CUDA graph (planner/profile.py,
_Clock); a step replays a graph too, but of different calls one after the other. This builds
every layer's buffers as the profile does (each convolution on its fastest plan, nothing
fused, no ReLU masks), times each call alone, then one graph of `repeats` whole passes (every
forward in order, every backward in reverse), and prints the pass in sequence beside the sum
of its calls alone. With --pairs, each call is also timed after the call before it in the
pass (a graph of the two, repeated), less that call alone: where in the pass the difference
lies.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def build_calls(net, batch, device, maps):
    """[(label, fn)] of one pass: every forward in order, then every backward in reverse."""
    from minidnn import kernels as kernel_modules
    from minidnn.kernels import mapformat
    from minidnn.layers import precision as mixed
    from minidnn.layers.base import StepContext
    from minidnn.memory.plan import LivenessPlan
    from minidnn.planner import profile as P

    kernels = kernel_modules.for_device(device)
    plan = LivenessPlan(net, batch, maps=maps, fuse=False)
    shapes = net.infer_shapes(batch)
    xp = device.xp
    rng = np.random.default_rng(0)
    num_classes = shapes[net.output][-1]
    ctx = StepContext(xp, kernels=kernels, train=True, step=0, seed=0, device=device,
                      relu_bits=plan.relu_bits)
    forwards, backwards = [], []
    for i, node in enumerate(net.nodes):
        layer = node.layer
        for p in layer.params.values():
            p.data = mapformat.empty(xp, p.shape, net.dtype, plan.maps.layout)
            p.data[...] = P._random(xp, p.shape, net.dtype, rng) * net.dtype.type(0.01)
            p.grad = mapformat.empty(xp, p.shape, net.dtype, plan.maps.layout)
        for b in layer.buffers.values():
            b.data = xp.asarray(b.initial_value(net.dtype))
        if layer.kind == "conv":
            layer.plan_setting = "fastest"
        xs, y, aux, gy, gxs = P._layer_buffers(i, node, plan, shapes, xp, rng, num_classes,
                                               kernels)
        bxs = [x if k in layer.retain_inputs else None for k, x in enumerate(xs)]
        by = y if plan.retains_output(i) else None

        def fwd(layer=layer, xs=xs, y=y, aux=aux):
            mixed.forward(layer, xs, y, aux, ctx)

        def bwd(layer=layer, bxs=bxs, by=by, gy=gy, gxs=gxs, aux=aux):
            mixed.backward(layer, bxs, by, gy, gxs, aux, ctx)

        forwards.append((f"{node.name}.forward", fwd))
        backwards.append((f"{node.name}.backward", bwd))
    return forwards + backwards[::-1], kernels


def time_graph(device, fns, repeats):
    """Device seconds of one replay of `repeats` rounds of fns, captured as one graph."""
    import cupy
    stream = device.compute
    for fn in fns:          # warm: plans chosen, blocks in CuPy's pool
        fn()
    device.synchronize()
    with stream:
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        try:
            for _ in range(repeats):
                for fn in fns:
                    fn()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    graph.launch(stream)
    best = float("inf")
    for _ in range(3):
        start, end = device.timing_event(), device.timing_event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--math", default="tf32")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--pairs", action="store_true")
    args = ap.parse_args(argv)

    from minidnn import kernels, models
    from minidnn.backend import select_device
    from minidnn.kernels.mapformat import MapFormat, map_layout
    from minidnn.planner.profile import _Clock

    device = select_device("gpu")
    kernels.for_device(device).configure(math=args.math)
    net = models.build(args.model)
    maps = MapFormat(map_layout(device, None), args.precision)
    calls, kmod = build_calls(net, args.batch, device, maps)
    clock = _Clock(device)
    with device.compute, kmod.shared_weight_copies():
        alone = [clock(fn, args.repeats)[0] for _, fn in calls]
        in_sequence = time_graph(device, [fn for _, fn in calls], args.repeats) / args.repeats
        print(f"{args.model} b{args.batch} {args.precision} {maps.layout}: {len(calls)} calls a "
              f"pass; alone, summed {sum(alone) * 1e3:.3f} ms; in sequence "
              f"{in_sequence * 1e3:.3f} ms; difference "
              f"{(in_sequence - sum(alone)) * 1e6:.1f} us "
              f"({(in_sequence - sum(alone)) / len(calls) * 1e6:.2f} us a call)", flush=True)
        if args.pairs:
            print("| call | alone us | after the call before, less it alone, us | more us |")
            print("| --- | ---: | ---: | ---: |")
            for k, (label, fn) in enumerate(calls):
                if k == 0:
                    continue
                pair = time_graph(device, [calls[k - 1][1], fn], args.repeats) / args.repeats
                after = pair - alone[k - 1]
                print(f"| {label} | {alone[k] * 1e6:.1f} | {after * 1e6:.1f} | "
                      f"{(after - alone[k]) * 1e6:+.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
