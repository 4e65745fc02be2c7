#!/usr/bin/env python3
"""A soak test: many training steps in a memory budget, printing the device bytes in use and
the process's resident memory as it goes; both must stay flat.

    python3 scripts/soak.py                     # 10,000 CPU steps of tiny_cnn at 8x8, ~5 min
    python3 scripts/soak.py --steps 500 --every 50
    python3 scripts/soak.py --device gpu --model vgg16 --image-size 224 --batch 64 \
        --policy dyn --memory-budget 3GiB --steps 2000 --every 100 --data synthetic

Device bytes: the executor's allocator (the arena of the budget) once every copy has finished,
after each reported step; RSS: /proc/self/statm. After a warm-up of a tenth of the steps, the
device bytes must not change at all, RSS must not grow by more than --rss-slack, and no step
may fetch a map on demand (a prefetch that came too late), take a block outside the planned
layout, or run a convolution on a leaner plan than planned (a workspace that did not fit);
the exit status is 1 otherwise. Not part of the test suite (too long); the numbers go in
benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minidnn import SGD, models  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.data import BatchLoader, Shapes, SyntheticImages  # noqa: E402
from minidnn.errors import MinidnnError, fmt_bytes, parse_bytes  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _workspace_fallbacks(ex):
    """A function giving how many convolutions run a leaner plan than planned (the GPU
    kernels' record; always 0 on the CPU)."""
    if not ex.device.is_gpu:
        return lambda: 0
    from minidnn.kernels import cuda
    return lambda: len(cuda.workspace_fallbacks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--data", default="shapes", choices=("shapes", "synthetic"),
                   help="shapes: the main job's drawn shapes (10 classes); synthetic: random "
                        "images of 1000 classes")
    p.add_argument("--model", default="tiny_cnn")
    p.add_argument("--image-size", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--every", type=int, default=500, help="report every N steps")
    p.add_argument("--policy", default="all")
    p.add_argument("--memory-budget", default="4MiB")
    p.add_argument("--lookahead", type=int, default=1)
    p.add_argument("--rss-slack", default="8MiB", help="RSS growth allowed after warm-up")
    args = p.parse_args()

    classes = 10 if args.data == "shapes" else 1000
    net = models.build(args.model, num_classes=classes, image_size=args.image_size)
    if args.data == "shapes":
        data = Shapes(10, args.image_size, n=4096, seed=0)
    else:
        data = SyntheticImages(classes, (3, args.image_size, args.image_size), seed=0,
                               n=max(4096, 4 * args.batch))
    ex = build_executor(net, args.batch, device=args.device, seed=0, policy=args.policy,
                        memory_budget=parse_bytes(args.memory_budget),
                        prefetch_lookahead=args.lookahead)
    opt = SGD(ex.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4, allocator=ex.allocator)
    warmup = max(1, args.steps // 10)
    fallbacks = _workspace_fallbacks(ex)
    print(f"soak: {args.model} {args.image_size}px batch {args.batch} on {ex.device.name}, "
          f"policy {args.policy}, budget {args.memory_budget}, {args.steps} steps, report "
          f"every {args.every}")
    print(f"{'step':>7} {'loss':>8} {'device in use':>14} {'device peak':>12} {'RSS':>11} "
          f"{'offloaded/step':>15} {'on demand':>9} {'unplanned':>9} {'fallbacks':>9} "
          f"{'s':>7}")
    t0 = time.perf_counter()
    level = rss_at_warmup = None
    failures = []
    with BatchLoader(data, args.batch, seed=0, shuffle=True, steps=args.steps) as loader:
        for step, (x, y) in enumerate(loader, start=1):
            loss = float(ex.train_step(x, y, opt))
            stats = ex.memory_stats()
            late = (stats["on_demand_fetches"], stats["unplanned_blocks"], fallbacks())
            if step > warmup and any(late):
                failures.append(f"step {step}: on-demand fetches, unplanned blocks, "
                                f"workspace fallbacks = {late}")
            if step % args.every and step not in (warmup, args.steps):
                continue
            in_use = ex.settled_in_use()
            rss = rss_bytes()
            print(f"{step:>7} {loss:>8.4f} {fmt_bytes(in_use):>14} "
                  f"{fmt_bytes(stats['peak_device_bytes']):>12} {fmt_bytes(rss):>11} "
                  f"{fmt_bytes(stats['offloaded_bytes']):>15} {late[0]:>9} {late[1]:>9} "
                  f"{late[2]:>9} {time.perf_counter() - t0:>7.1f}", flush=True)
            if step == warmup:
                level, rss_at_warmup = in_use, rss
            elif level is not None:
                if in_use != level:
                    failures.append(f"step {step}: device bytes {in_use} != {level} at warm-up")
                if rss - rss_at_warmup > parse_bytes(args.rss_slack):
                    failures.append(f"step {step}: RSS grew by "
                                    f"{fmt_bytes(rss - rss_at_warmup)} since warm-up")
    ex.close()
    for failure in failures:
        print(f"soak: FAILED: {failure}")
    print("soak: flat" if not failures else "soak: not flat")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except MinidnnError as e:   # a budget too small, a bad model name: one line, not a traceback
        print(f"soak: error: {e}", file=sys.stderr)
        raise SystemExit(2)
