"""A pass's layer calls timed in sequence beside the profile's clock of each call alone.

    python3 benchmarks/runs/wave35/sequence_clock.py --model alexnet --batch 4 \
        --precision fp32 [--repeats 20] [--pairs]

The profile times each call replayed back to back from a CUDA graph (planner/profile.py,
_Clock); a step replays a graph too, but of different calls one after the other. This takes
the pass the profile's measure_call_gap times (profile.pass_calls: each convolution on its
fastest plan, nothing fused, no ReLU masks), times each call alone, then one graph of
`repeats` whole passes, and prints the pass in sequence beside the sum of its calls alone.
With --pairs, each call is also timed after the call before it in the pass (a graph of the
two, repeated), less that call alone: where in the pass the difference lies.

Calls 1 and 3 ran it as it was at b820a92 (the same pass built here, each graph timed as the
best of three replays of its own).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def time_in_sequence(clock, fns, repeats):
    """Device seconds of one round of fns, `repeats` rounds captured as one graph and replayed
    (the profile's clock: planner/profile.py, _Clock)."""
    return clock(lambda: [fn() for fn in fns], repeats)[0]


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
    from minidnn.planner.profile import _Clock, pass_calls

    device = select_device("gpu")
    kernels.for_device(device).configure(math=args.math)
    net = models.build(args.model)
    maps = MapFormat(map_layout(device, None), args.precision)
    clock = _Clock(device)
    with device.compute, kernels.for_device(device).shared_weight_copies():
        calls = pass_calls(net, args.batch, device, maps)
        alone = [clock(fn, args.repeats)[0] for _, fn in calls]
        in_sequence = time_in_sequence(clock, [fn for _, fn in calls], args.repeats)
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
                pair = time_in_sequence(clock, [calls[k - 1][1], fn], args.repeats)
                after = pair - alone[k - 1]
                print(f"| {label} | {alone[k] * 1e6:.1f} | {after * 1e6:.1f} | "
                      f"{(after - alone[k]) * 1e6:+.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
