"""One decision of dyn under a budget, trained twice in one process: as decided (the fully
connected layers' gradients once a step over every pass's rows, minidnn/gathered.py) and with
the same decision's gathered layers removed (each pass adds its own products). Steps replayed
from CUDA graphs, the two in turn, each timed over `--steps` after `--warmup`; the step
model's prediction of each beside it.

    python3 benchmarks/runs/wave29/gathered_clock.py --model vgg16 --batch 256 \
        --budget 4GiB --math tf32
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from minidnn import SGD, models
from minidnn.data import SyntheticImages
from minidnn.decide import decide
from minidnn.executor import Executor
from minidnn.planner.dyn import DynPolicy
from minidnn.spec import StepSpec


def clock(net, spec, decision, device: str, warmup: int, steps: int, rounds: int):
    """(seconds per step of each round after `warmup` steps, the steady peak, the steps
    replayed from CUDA graphs)."""
    with Executor(net, spec, decision, device=device, seed=0) as ex:
        opt = SGD(ex.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4,
                  allocator=ex.allocator, kernels=ex.kernels)
        data = SyntheticImages(1000, net.input_shape, seed=0)
        batches = data.device_batches(spec.batch, ex.device, count=2)
        for s in range(warmup):
            ex.train_step(*batches[s % 2], opt)
        out = []
        for _ in range(rounds):
            ex.device.synchronize()
            t0 = time.perf_counter()
            for s in range(steps):
                ex.train_step(*batches[s % 2], opt)
            ex.device.synchronize()
            out.append((time.perf_counter() - t0) / steps)
        peak = ex.memory_stats()["steady_peak_device_bytes"]
        replayed = (ex.graph_stats() or {}).get("replayed_steps", 0)
        del opt
    return out, peak, replayed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--budget", default="4GiB")
    p.add_argument("--math", default="tf32", choices=["tf32", "bf16"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--device", default="gpu", help="cpu: check the script at small sizes")
    args = p.parse_args()
    net = models.build(args.model, num_classes=1000, image_size=args.image_size)
    bf16 = args.math == "bf16"
    policy = DynPolicy()            # two input batches held, as bench_budget.py's runs
    spec = StepSpec(batch=args.batch, policy=policy, memory_budget=args.budget,
                    relu_bits=True, math="tf32", precision="bf16" if bf16 else "fp32")
    decision = decide(net, spec, device=args.device)
    best = policy.result.best
    print(f"{args.model} b{args.batch} {args.math} in {args.budget}: "
          f"{decision.micro_batches} passes, chunks {list(decision.chunks)}, gathered "
          f"{sorted(decision.gathered)}, ReLU masks kept {len(decision.relu_bits)}; "
          f"predicted {best.step_time_s * 1e3:.1f} ms, peak {best.peak_bytes / 2**30:.2f} GiB")
    apart = dataclasses.replace(decision, gathered=frozenset())
    rows = {}
    for _ in range(2):                     # in turn, twice each
        for name, d in (("gathered", decision), ("each pass", apart)):
            times, peak, replayed = clock(net, spec, d, args.device, args.warmup, args.steps,
                                          args.rounds)
            rows.setdefault(name, []).extend(times)
            print(f"  {name:10s} " + " ".join(f"{t * 1e3:.2f}" for t in times) +
                  f" ms/step; steady peak {peak / 2**30:.3f} GiB; {replayed} steps replayed")
    for name, times in rows.items():
        print(f"{name:10s} best {min(times) * 1e3:.2f} ms, median "
              f"{sorted(times)[len(times) // 2] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
