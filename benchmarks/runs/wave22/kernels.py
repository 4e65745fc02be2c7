"""A replayed minidnn step under a budget, kernel by kernel, beside the step model's
prediction of it: the step's device activity as PyTorch's profiler (CUPTI) sees it (busy
time, idle time, the kernels grouped by name) and the planner's predicted time per phase and
layer kind, per pass.

    python3 benchmarks/runs/wave22/kernels.py MODEL PRECISION BUDGET_BYTES [split] > out.txt

writes kernels_MODEL_PRECISION.json (every activity, the prediction) into $OUT.

Runs from the repository root with the cuDNN frontend on PYTHONPATH; b256, dyn with ReLU bit
masks as `minidnn train --policy dyn --relu-bits --memory-budget BUDGET` plans it."""
import json
import os
import sys
from collections import defaultdict

import cupy as cp
import torch
from torch.profiler import ProfilerActivity, profile

from minidnn import SGD, models
from minidnn.decide import build_executor
from minidnn.planner.dyn import DynPolicy

name, precision, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
split = len(sys.argv) > 4 and sys.argv[4] == "split"
size = models.native_image_size(name)
batch = 256
net = models.build(name, num_classes=1000, image_size=size)
policy = DynPolicy()
ex = build_executor(net, batch, device="gpu", seed=0, math="tf32", policy=policy,
                    memory_budget=budget, precision=precision, relu_bits=True,
                    split_batch_statistics=split)
best = policy.result.best
k = ex.micro_batches
opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
with ex.device.compute:
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=cp.float32)
    labels = rng.integers(0, 1000, batch).astype(cp.int64)
for _ in range(5):
    ex.train_step(x, labels, opt)
ex.device.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    ex.train_step(x, labels, opt)
    torch.cuda.synchronize()
events = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e[0])
span = events[-1][1] - events[0][0]
busy, reach = 0.0, events[0][0]
by_name = defaultdict(lambda: [0.0, 0])
for start, end, what in events:
    busy += max(0.0, end - max(start, reach))
    reach = max(reach, end)
    by_name[what][0] += end - start
    by_name[what][1] += 1
kinds = {n.name: n.layer.kind for n in ex.net.nodes}
predicted = defaultdict(float)
for (phase, i), (a, b, _) in best.calls.items():
    layer = policy.result.model.nodes[i].name
    predicted[(phase, kinds.get(layer, kinds.get(layer.split("@")[0], "?")))] += b - a
print(f"{name} {precision} b{batch} in {budget} bytes: {k} micro-batches, chunks "
      f"{list(ex.decision.chunks)}; predicted step {best.step_time_s * 1e3:.1f} ms "
      f"(layer calls {k} x {sum(predicted.values()) * 1e3:.2f} ms)")
print(f"replayed step: {len(events)} device activities, span {span / 1e3:.2f} ms, busy "
      f"{busy / 1e3:.2f} ms, idle {(span - busy) / 1e3:.2f} ms; per pass: span "
      f"{span / 1e3 / k:.3f} ms, busy {busy / 1e3 / k:.3f} ms, "
      f"{len(events) / k:.0f} activities\n")
print("predicted per pass (ms):")
for (phase, kind), s in sorted(predicted.items(), key=lambda kv: -kv[1]):
    print(f"  {phase:10s} {kind:10s} {s * 1e3:8.3f}")
print("\nmeasured kernels per pass (ms, count per pass):")
for what, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:40]:
    print(f"  {t / 1e3 / k:8.3f} {n / k:6.1f}  {what[:110]}")
with open(os.path.join(os.environ.get("OUT", "."), f"kernels_{name}_{precision}.json"), "w") as f:
    json.dump({"events": events, "micro_batches": k, "predicted_step_s": best.step_time_s,
               "predicted": {f"{p} {kd}": s for (p, kd), s in predicted.items()}}, f)
