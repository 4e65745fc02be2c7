"""ResNet-50's conv1 backward (weight gradient only: its input is the image) on channels-last
float32 maps, under each plan setting, timed three ways: as the planner's profile times it
(captured as a CUDA graph and replayed), issued behind a hold (the held trace's way), and
issued plainly; beside the plan tables of the problems it ran, as the run's cache holds them
(channels-last strides; `conv1_plans.py` printed the NCHW tables the profile's workspace
ladder reads).

Call 3 found the profile's memory-optimal backward at 2.16 ms at 4 images, where the held
trace of a step had 0.069 ms, and its NCHW table offers a plan of no workspace at 0.097 ms.
Call 4 ran this script with the weights in C order beside a channels-last image: no plan of
that weight gradient could run. The weights are now laid out as a run lays them out.

    python3 benchmarks/runs/wave24/conv1_clock.py [--batches 4,32] [--repeats 20]
"""
import argparse

import cupy as cp
import numpy as np

from minidnn.backend import Device
from minidnn.kernels import cuda
from minidnn.kernels.mapformat import empty
from minidnn.layers.base import StepContext
from minidnn.planner.profile import _Clock
from conv1_plans import conv1_net


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,32")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    device = Device("gpu")
    clock = _Clock(device)
    for batch in (int(b) for b in args.batches.split(",")):
        net = conv1_net()
        net.init_params(0)
        layer = net.node("conv1").layer
        net.infer_shapes(batch)
        for p in layer.params.values():      # laid out as a run lays them out (the maps')
            host = p.data
            p.data = empty(cp, p.shape, np.float32, "nhwc")
            p.data[...] = cp.asarray(host)
            p.grad = empty(cp, p.shape, np.float32, "nhwc")
        x = empty(cp, (batch, 3, 224, 224), np.float32, "nhwc")
        x[...] = 1.0
        gy = empty(cp, (batch, 64, 112, 112), np.float32, "nhwc")
        gy[...] = 0.5
        ctx = StepContext(cp, kernels=cuda, device=device)
        with device.compute:
            for setting in ("fastest", "min_workspace"):
                layer.plan_setting = setting

                def backward():
                    layer.backward([x], None, gy, [None], {}, ctx)
                replayed = clock._time_replayed(backward, args.repeats)
                backward()
                held, _ = clock._time_held(backward, args.repeats, 5e-3)
                start, end = device.timing_event(), device.timing_event()
                start.record(device.compute)
                for _ in range(args.repeats):
                    backward()
                end.record(device.compute)
                end.synchronize()
                plain = cp.cuda.get_elapsed_time(start, end) / args.repeats
                print(f"batch {batch} {setting}: replayed "
                      f"{'-' if replayed is None else round(replayed[0] * 1e3, 4)} ms, held "
                      f"{held / args.repeats * 1e3:.4f} ms, plain {plain:.4f} ms")
        for entry in cuda.conv_cache_entries():
            pr = entry.problem
            rows = sorted(entry.table, key=lambda t: (t.time_ms != t.time_ms, t.time_ms))
            chosen = {k: (v.index, v.workspace_bytes, round(v.time_ms, 4))
                      for k, v in entry.chosen.items()}
            print(f"batch {batch}: {pr.op} x {pr.x} chosen {chosen} plans "
                  f"{[(t.index, t.workspace_bytes, round(t.time_ms, 4)) for t in rows]}")
        cuda.clear_conv_cache()


if __name__ == "__main__":
    main()
