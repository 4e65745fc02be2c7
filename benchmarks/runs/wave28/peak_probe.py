#!/usr/bin/env python3
"""What holds the arena when a planned ResNet-50 bf16 step in 6 GiB peaks or runs short: the
run's live blocks by what took them, beside the step model's level at that call.

    python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB [--masks kept|off|asked]
        [--split-batch-statistics]
"""
import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

from minidnn import SGD, argtypes, models  # noqa: E402
from minidnn.data import SyntheticImages  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.errors import MemoryBudgetError  # noqa: E402
from minidnn.memory import arena as arena_module  # noqa: E402
from minidnn.planner import planning  # noqa: E402
from minidnn.planner.dyn import DynPolicy  # noqa: E402

MiB = 2**20
p = argparse.ArgumentParser()
p.add_argument("--budget", type=argtypes.size, required=True)
p.add_argument("--masks", choices=("kept", "off", "asked"), default="asked")
p.add_argument("--split-batch-statistics", action="store_true")
p.add_argument("--model", default="resnet50")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--image-size", type=int, default=None)
p.add_argument("--device", default="gpu")
args = p.parse_args()
if args.masks == "kept":
    planning.RELU_BITS_GAIN = 10.0      # never worth leaving them off

live, step = {}, [0]
peak = {"used": 0, "at": None, "blocks": None}
Arena = arena_module.Arena
take, release = Arena._take, Arena._release


def _take(self, nbytes, where):
    try:
        offset, size = take(self, nbytes, where)
    except MemoryBudgetError:
        dump("the failing request", self, dict(live), (where or self.current_where, nbytes))
        raise
    live[offset] = (f"{where or self.current_where}", size)
    used = self._blocks.used
    if step[0] >= 4 and used > peak["used"]:
        peak.update(used=used, at=(step[0], where or self.current_where), blocks=dict(live))
    return offset, size


def _release(self, offset):
    live.pop(offset, None)
    release(self, offset)


Arena._take, Arena._release = _take, _release


def dump(title, arena, blocks, request=None):
    by = defaultdict(int)
    for label, size in blocks.values():
        key = label if label.startswith(("feature maps", "parameters")) else \
            label.split(" of ")[0] + " of ..." if " of " in label else label
        by[key] += size
    print(f"== {title}: step {step[0]}, in use {arena._blocks.used / MiB:.1f} MiB"
          + (f", asking {request[1] / MiB:.1f} MiB in {request[0]}" if request else ""))
    for key, size in sorted(by.items(), key=lambda kv: -kv[1])[:12]:
        print(f"   {size / MiB:10.1f} MiB  {key}")
    late = sorted(blocks.values(), key=lambda v: -v[1])[:12]
    for label, size in late:
        print(f"   block {size / MiB:8.1f} MiB  {label}")


net = models.build(args.model, num_classes=1000, image_size=args.image_size)
policy = DynPolicy()
ex = build_executor(net, args.batch, device=args.device, seed=0, policy=policy, memory_budget=args.budget,
                    math="tf32", precision="bf16", relu_bits=args.masks != "off",
                    split_batch_statistics=args.split_batch_statistics)
best = policy.result.best
names = [n.name for n in policy.result.model.plan.nodes]
print(f"plan: {ex.micro_batches} passes, masks kept {len(ex.decision.relu_bits)}, offload "
      f"{len(best.offload)}, recompute {len(best.recompute)}; predicted peak "
      f"{best.peak_bytes / MiB:.1f} MiB, held {best.held_bytes / MiB:.1f} (region "
      f"{best.region_bytes / MiB:.1f}), peak point {best.peak_point}")
top = sorted(((v, k) for k, v in best.levels.items() if isinstance(k, tuple)), reverse=True)
for v, k in top[:8]:
    print(f"   model level {v / MiB:10.1f} MiB at {k[0]} of {names[k[1]]}")
opt = SGD(ex.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4, allocator=ex.allocator)
data = SyntheticImages(1000, net.input_shape, seed=0)
batches = data.device_batches(args.batch, ex.device, count=2)
print(f"arena before step one: {ex.allocator.in_use / MiB:.1f} MiB")
try:
    for s in range(8):
        step[0] = s
        ex.train_step(*batches[s % 2], opt)
    ex.device.synchronize()
    print(f"ran 8 steps; steady peak {ex.memory_stats()['steady_peak_device_bytes'] / MiB:.1f} MiB")
    if peak["blocks"]:
        dump(f"the peak after step 4 (at {peak['at']})", ex.allocator, peak["blocks"])
except MemoryBudgetError as e:
    print("FAILED:", e)
finally:
    ex.close()
