#!/usr/bin/env python3
"""Memory benchmarks of the memory manager, as markdown tables.

Dry mode (any machine, seconds): walks one training step of each paper network through the
memory manager without computing (Executor(..., compute=False).simulate_step()) and prints the
network-wide allocation, what liveness alone achieves, and, per policy, the peak and average
bytes of feature maps (+ aux + gradient maps) on the device:

    python3 scripts/bench_memory.py --dry
    python3 scripts/bench_memory.py --dry --configs vgg416:224:32 --policies none,all

Real mode (GPU): trains a model for N steps after warm-up under each policy, and prints
ms/step, images/s, peak device bytes, bytes offloaded and prefetched per step, and the arena's
bytes in use after warm-up and after the last step (they must be equal: no leak); writes a
trace, a memory plot and a measured stream timeline (compute, offload, prefetch, stalls) of
one step per policy:

    python3 scripts/bench_memory.py --model vgg16 --batch 256 --policies none,all \\
        --memory-budget 12GiB --steps 200 --trace-dir runs/bench
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from minidnn import SGD, models  # noqa: E402
from minidnn.backend import select_device  # noqa: E402
from minidnn.errors import MemoryBudgetError, MinidnnError, fmt_bytes, parse_bytes  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.planner.timeline import draw_timeline  # noqa: E402

# The paper's networks and batches (vDNN, Rhu et al. 2016): (model, image size, batch).
PAPER_CONFIGS = "alexnet:227:128,overfeat:231:128,vgg16:224:64,vgg16:224:128,vgg16:224:256"
# Average-memory reductions vDNN_all reports against network-wide allocation (arXiv version).
PAPER_REDUCTION = {"alexnet": "-61%", "overfeat": "-83%"}


def parse_configs(text: str) -> list[tuple[str, int, int]]:
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise SystemExit(f"bench_memory: --configs entries are model:image_size:batch, "
                             f"got {item!r}")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out



# ---- dry mode -----------------------------------------------------------------------------------
def dry(configs, policies, lookahead: int, budget, relu_bits: bool = False) -> None:
    print("| model | batch | image | network-wide | liveness peak | policy | peak feature maps "
          "| avg feature maps | avg vs network-wide | offloaded / step | peak device "
          "(+ params, grads) | fits budget |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for name, size, batch in configs:
        t0 = time.perf_counter()
        net = models.build(name, num_classes=1000, image_size=size)
        for policy in policies:
            ex = build_executor(net, batch, device="cpu", policy=policy, compute=False,
                                prefetch_lookahead=lookahead, relu_bits=relu_bits)
            st = ex.simulate_step()
            nw = st["network_wide_bytes"]
            fits = "-" if budget is None else ("yes" if st["peak_device_bytes"] <= budget else "no")
            print(f"| {name} | {batch} | {size} | {fmt_bytes(nw)} | {fmt_bytes(st['liveness_peak_bytes'])} "
                  f"| {policy} | {fmt_bytes(st['peak_feature_map_bytes'])} "
                  f"| {fmt_bytes(st['avg_feature_map_bytes'])} "
                  f"| {st['avg_feature_map_bytes'] / nw - 1:+.1%} "
                  f"| {fmt_bytes(st['offloaded_bytes'])} | {fmt_bytes(st['peak_device_bytes'])} | {fits} |")
        print(f"<!-- {name} b{batch}: {time.perf_counter() - t0:.2f} s -->", file=sys.stderr)
    print()
    print("network-wide: every feature map, aux and gradient buffer allocated for the whole "
          "step (the 2016 frameworks' allocation, vDNN's baseline); liveness peak: each buffer "
          "lives from its first write to its last read. Feature maps include aux buffers "
          "(pooling argmax, dropout masks) and gradient maps; averages are over the layer calls "
          "of one step, forward and backward. Peak device adds parameters and their gradients "
          "(not layer temporaries or optimizer state).")
    print("vDNN (arXiv 1602.08124) reports average-memory reductions under vDNN_all of " +
          ", ".join(f"{k} {v}" for k, v in PAPER_REDUCTION.items()) + ".")


# ---- real mode ----------------------------------------------------------------------------------
def real(args, policies, budget) -> None:
    device = select_device(args.device)
    net_name, batch, size = args.model, args.batch, args.image_size
    os.makedirs(args.trace_dir, exist_ok=True) if args.trace_dir else None
    print(f"model {net_name}, batch {batch}, image {size or 'native'}, device {device.name}, "
          f"budget {fmt_bytes(budget)}, {args.warmup} warm-up + {args.steps} timed steps, "
          f"prefetch lookahead {args.lookahead}")
    print()
    print("| policy | ms/step | images/s | peak device (steady) | offloaded / step | prefetched / step "
          "| on-demand fetches | host peak | in use after warm-up | in use after last step "
          "| in use min..max (unsettled) | leak |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for policy in policies:
        net = models.build(net_name, num_classes=args.num_classes, image_size=size)
        try:
            row = run_policy(net, device, batch, policy, budget, args)
        except MemoryBudgetError as e:
            print(f"| {policy} | does not fit: {e} |||||||||||")
            continue
        print(row, flush=True)


def run_policy(net, device, batch, policy, budget, args) -> str:
    with build_executor(net, batch, device=device, seed=0, memory_budget=budget, policy=policy,
                        prefetch_lookahead=args.lookahead, math=args.math,
                        deterministic=args.deterministic or None,
                        relu_bits=args.relu_bits) as ex:
        opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4,
                  allocator=ex.allocator)
        rng = np.random.default_rng(0)
        shape = (batch,) + net.input_shape
        with device.compute:  # one batch, resident on the device (no host copy per step)
            x = device.asarray(rng.standard_normal(shape, dtype=np.float32))
            y = device.asarray(rng.integers(0, args.num_classes, batch))
        for _ in range(args.warmup):
            ex.train_step(x, y, opt)
        settled_start = ex.settled_in_use()
        levels, step_peaks = [], []  # steady state: not the first step's plan measurements
        device.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = ex.train_step(x, y, opt)
            levels.append(ex.allocator.in_use)
            step_peaks.append(ex.memory_stats()["steady_peak_device_bytes"])
        device.synchronize()
        elapsed = time.perf_counter() - t0
        loss_value = float(loss)
        del loss  # the last loss is a device array too; the level is compared without it
        settled_end = ex.settled_in_use()
        st = ex.memory_stats()
        if args.trace_dir:
            tracer = ex.enable_trace()
            ex.train_step(x, y, opt)
            stem = Path(args.trace_dir) / f"{net.name}_b{batch}_{policy}"
            tracer.write_chrome_trace(f"{stem}.json")
            try:
                tracer.plot_memory(f"{stem}.png")
                draw_timeline([{"title": f"{net.name} b{batch}, {policy}, measured on "
                                         f"{device.name}", "timeline": tracer.timeline()}],
                              f"{stem}_timeline.png")
            except ImportError:
                pass
            ex.enable_trace(False)
        if not np.isfinite(loss_value):
            raise SystemExit(f"bench_memory: loss became {loss_value} under policy {policy}")
        ms = elapsed / max(args.steps, 1) * 1e3
        leak = "none" if settled_end == settled_start else \
            f"{fmt_bytes(settled_end - settled_start)}"
        del opt
        return (f"| {policy} | {ms:.1f} | {batch / (ms / 1e3):.0f} | {fmt_bytes(max(step_peaks or [0]))} "
                f"| {fmt_bytes(st['offloaded_bytes'])} | {fmt_bytes(st['prefetched_bytes'])} "
                f"| {st['on_demand_fetches']} | {fmt_bytes(st['host_peak_bytes'])} "
                f"| {fmt_bytes(settled_start)} | {fmt_bytes(settled_end)} "
                f"| {fmt_bytes(min(levels or [0]))}..{fmt_bytes(max(levels or [0]))} | {leak} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry", action="store_true", help="memory figures without compute (CPU)")
    p.add_argument("--configs", default=PAPER_CONFIGS,
                   help="dry mode: model:image_size:batch,... (default: the paper's networks)")
    p.add_argument("--policies", default="none,all,conv", help="comma-separated policy names")
    p.add_argument("--memory-budget", default=None, help="e.g. 12GiB (default: none)")
    p.add_argument("--lookahead", type=int, default=1, help="prefetch lookahead in layers")
    p.add_argument("--relu-bits", action="store_true",
                   help="ReLUs whose output no other layer keeps keep one bit per value")
    p.add_argument("--model", default="vgg16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--math", default=None, choices=[None, "tf32", "fp32"])
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--trace-dir", default=None, help="write a trace and plot of one step here")
    args = p.parse_args(argv)
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    try:
        budget = parse_bytes(args.memory_budget) if args.memory_budget else None
        if args.dry:
            dry(parse_configs(args.configs), policies, args.lookahead, budget, args.relu_bits)
        else:
            real(args, policies, budget)
    except MinidnnError as e:
        print(f"bench_memory: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
