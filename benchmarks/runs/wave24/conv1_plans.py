"""ResNet-50's conv1 (7x7 stride 2, 3 -> 64 channels, 224 px) measured alone as the planner's
profile measures it (planner/profile.py: measure_layers, replayed from a CUDA graph), at the
batches of a pass, under each plan setting, beside every cuDNN plan of its weight gradient.

Wave 24's held trace of ResNet-50 fp32 at its least budget (64 passes of 4, conv1 on its
memory-optimal plan) timed conv1's backward at 0.069 ms a pass where the profile priced it
7.0 ms: this says which figure the plan setting gives.

    python3 benchmarks/runs/wave24/conv1_plans.py [--batches 4,32,256]
"""
import argparse

from minidnn.backend import Device
from minidnn.builder import NetBuilder
from minidnn.kernels import for_device
from minidnn.kernels.mapformat import MapFormat
from minidnn.planner.profile import _conv_tables, measure_layers


def conv1_net():
    b = NetBuilder("conv1_only", image_size=224, num_classes=10)
    b.conv("conv1", 64, 7, stride=2, padding=3, bias=False)
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,32,256")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    args = ap.parse_args()
    device = Device(args.device)
    kernels = for_device(device)
    for batch in (int(b) for b in args.batches.split(",")):
        net = conv1_net()
        net.init_params(0)
        costs = measure_layers(net, batch, device, progress=False,
                               maps=MapFormat("nhwc", "fp32"))["conv1"]
        print(f"batch {batch}: conv1 forward ms "
              f"{ {k: round(v * 1e3, 4) for k, v in costs.forward_s.items()} }")
        print(f"batch {batch}: conv1 backward ms "
              f"{ {k: round(v * 1e3, 4) for k, v in costs.backward_s.items()} }")
        print(f"batch {batch}: conv1 backward workspace {costs.workspace_backward}")
        node = net.node("conv1")
        for op, table in _conv_tables(kernels, node.layer, node, MapFormat("nhwc", "fp32")).items():
            rows = sorted(table, key=lambda t: (t.time_ms != t.time_ms, t.time_ms))
            print(f"batch {batch}: {op} plans (index, workspace bytes, ms): "
                  f"{[(t.index, t.workspace_bytes, round(t.time_ms, 4)) for t in rows]}")


if __name__ == "__main__":
    main()
