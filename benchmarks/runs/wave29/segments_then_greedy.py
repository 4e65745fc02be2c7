"""ResNet-50 b256 TF32 with whole-batch statistics in 8 GiB, on the H200's analytic model: the
checkpointed segments (planner/segments.py) at each size, as they are, and the greedy search
started from each (search.Planner.greedy(start=...)), beside dyn's plan. A lead, not a
measurement: no GPU ran these plans.

    python3 benchmarks/runs/wave29/segments_then_greedy.py
"""
from __future__ import annotations

import time

from minidnn import models
from minidnn.planner import segments
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.search import Planner

GiB = 2**30


def main() -> None:
    net = models.build("resnet50", num_classes=1000)
    planner = Planner(net, 256, analytic_profile(net, 256, "h200"), budget=8 * GiB)
    m, plan = planner.model, planner.model.plan
    t0 = time.perf_counter()
    dyn = planner.run().best
    print(f"dyn's plan: {dyn.step_time_s * 1e3:.1f} ms, needs {dyn.required_bytes / GiB:.2f} "
          f"GiB, {len(dyn.offload)} maps offloaded ({dyn.offloaded_bytes / GiB:.2f} GiB each "
          f"way), {len(dyn.recompute)} recomputed ({time.perf_counter() - t0:.1f} s)")
    runs = segments.runs(planner)
    largest = max(planner._bytes[sid] for run in runs for sid in run)
    for multiple in (1, 2, 4):
        offload, recompute = segments.decision(planner, runs, largest * multiple, False)
        start = m.evaluate(offload, m.algos("fastest"), recompute)
        t0 = time.perf_counter()
        found = planner.greedy(start=start)
        took = time.perf_counter() - t0
        print(f"segments of {multiple} x {largest / 2**20:.0f} MiB: {len(recompute)} maps "
              f"recomputed, needs {start.required_bytes / GiB:.2f} GiB (feature maps "
              f"{max(start.fm_levels.values()) / GiB:.2f}), {start.step_time_s * 1e3:.1f} ms")
        if found is None:
            print(f"  greedy from it: nothing fits ({took:.1f} s)")
            continue
        moved = plan.tensor_names(found.offload - start.offload)
        rebuilt = plan.tensor_names(found.recompute - start.recompute)
        dropped = plan.tensor_names(start.recompute - found.recompute)
        print(f"  greedy from it, pruned: {found.step_time_s * 1e3:.1f} ms, needs "
              f"{found.required_bytes / GiB:.2f} GiB (feature maps "
              f"{max(found.fm_levels.values()) / GiB:.2f}); {len(rebuilt)} more recomputed "
              f"({', '.join(rebuilt[:4])}{', ...' if len(rebuilt) > 4 else ''}), "
              f"{len(dropped)} recomputed no more, {len(moved)} offloaded "
              f"({', '.join(moved[:4])}{', ...' if len(moved) > 4 else ''}: "
              f"{found.offloaded_bytes / 2**20:.2f} MiB each way) ({took:.1f} s)")


if __name__ == "__main__":
    main()
