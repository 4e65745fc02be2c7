#!/usr/bin/env python3
"""A training step as `minidnn train` runs it, kernel by kernel: one step replayed from its
CUDA graph, seen by PyTorch's profiler (CUPTI; PyTorch is only the instrument), its kernels
added up by class (benchlib.kernel_class) and by name, per pass, with the step's busy and
idle time.

    python3 scripts/step_kernels.py --model vgg16 --batch 256 --precision bf16 \\
        --memory-budget 3.44GiB [--split-batch-statistics] [--no-relu-bits] [--top 30] \\
        [--json OUT.json]

The executor is the one `minidnn train --policy dyn [--relu-bits]` builds for that budget
(train.make_executor), fed device batches at fixed addresses (step_graph.DeviceInputs), so
that the step after the warm-up is replayed from its graph, as in a run. Where the held
trace (`minidnn train --trace-held`) says which layer's calls take longer than the step model
prices them, this says which kernels: a copy through strides, a reduction far from memory
speed. The profiler costs time between kernels: compare the kernels' times, not the profiled
span, with a run's step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from benchlib import kernel_class  # noqa: E402

WARMUP = 5   # plain steps, then the captures (step_graph.WARMUP is 2)


def parse_args(argv=None):
    from minidnn import argtypes
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--memory-budget", type=argtypes.size, default=None, metavar="SIZE")
    p.add_argument("--split-batch-statistics", action="store_true")
    p.add_argument("--no-relu-bits", dest="relu_bits", action="store_false")
    p.add_argument("--top", type=int, default=30, help="kernels listed by name")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every kernel")
    return p.parse_args(argv)


def replayed_kernels(args) -> tuple[list, object]:
    """([(start us, end us, kernel name)] of one replayed step, the executor)."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from minidnn import models
    from minidnn.backend import Device
    from minidnn.optim import SGD
    from minidnn.step_graph import DeviceInputs
    from minidnn.train import TrainConfig, make_executor
    cfg = TrainConfig(model=args.model, batch=args.batch, device="gpu", policy="dyn",
                      relu_bits=args.relu_bits, memory_budget=args.memory_budget,
                      precision=args.precision,
                      split_batch_statistics=args.split_batch_statistics)
    size = models.native_image_size(args.model)
    net = models.build(args.model, num_classes=1000, image_size=size)
    inputs = DeviceInputs(Device("gpu"), (args.batch, 3, size, size))   # before the arena
    ex = make_executor(cfg, net)
    opt = SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum,
              weight_decay=cfg.weight_decay, allocator=ex.allocator)
    rng = np.random.default_rng(0)
    x, y = inputs(rng.standard_normal((args.batch, 3, size, size), dtype=np.float32),
                  rng.integers(0, 1000, args.batch).astype(np.int64))
    for _ in range(WARMUP):
        ex.train_step(x, y, opt)
    ex.device.synchronize()
    if not (ex.graph_stats() or {}).get("replayed_steps"):
        print("minidnn: warning: the steps were not replayed from a CUDA graph "
              f"({ex.graph_stats()}): the kernels are a plain step's", file=sys.stderr)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ex.train_step(x, y, opt)
        torch.cuda.synchronize()
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    return events, ex


def summary(events: list, passes: int) -> dict:
    """Span, busy and idle time (us) of `events` [(start, end, name)], and their time per
    pass by class and by name, largest first: {'span_us', 'busy_us', 'by_class':
    {class: us}, 'by_name': [(name, us, count)]}."""
    busy, reach = 0.0, events[0][0] if events else 0.0
    by_name: dict = defaultdict(lambda: [0.0, 0])
    for start, end, name in events:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
        by_name[name][0] += end - start
        by_name[name][1] += 1
    by_class: dict = defaultdict(float)
    for name, (us, _) in by_name.items():
        by_class[kernel_class(name)] += us / passes
    span = events[-1][1] - events[0][0] if events else 0.0
    return {"span_us": span, "busy_us": busy,
            "by_class": dict(sorted(by_class.items(), key=lambda kv: -kv[1])),
            "by_name": [(name, us / passes, n / passes) for name, (us, n) in
                        sorted(by_name.items(), key=lambda kv: -kv[1][0])]}


def main(argv=None) -> int:
    args = parse_args(argv)
    from minidnn.backend import gpu_available
    if not gpu_available():
        print("minidnn: error: step_kernels.py profiles a GPU's kernels; there is no GPU here",
              file=sys.stderr)
        return 2
    events, ex = replayed_kernels(args)
    k = ex.micro_batches
    s = summary(events, k)
    chunks = list(ex.decision.chunks)
    print(f"{args.model} b{args.batch} {args.precision}, budget {args.memory_budget}: {k} "
          f"pass(es){f', chunks {chunks}' if chunks else ''}; one replayed step: "
          f"{len(events)} device activities, span {s['span_us'] / 1e3:.2f} ms, busy "
          f"{s['busy_us'] / 1e3:.2f} ms, idle {(s['span_us'] - s['busy_us']) / 1e3:.2f} ms\n")
    print("| kernel class | ms per pass |\n| --- | ---: |")
    for cls, us in s["by_class"].items():
        print(f"| {cls} | {us / 1e3:.3f} |")
    print("\n| kernel | ms per pass | per pass |\n| --- | ---: | ---: |")
    for name, us, n in s["by_name"][:args.top]:
        print(f"| {name[:100]} | {us / 1e3:.3f} | {n:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "precision": args.precision,
                       "memory_budget": args.memory_budget, "micro_batches": k,
                       "chunks": chunks, "events": events, **s}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
