"""Where a captured minidnn step leaves the GPU idle: the step's device activity (kernels,
copies, sets) as PyTorch's profiler (CUPTI) sees it, its busy time against its span, and
the longest idle stretches with the activity on either side.

    python3 benchmarks/runs/wave21/gaps.py vgg16 bf16 [steps]

Runs from the repository root with the cuDNN frontend on PYTHONPATH; b256, the step as
scripts/bench_vs_pytorch.py runs it (its warm-up captures the step as CUDA graphs)."""
import sys

import cupy as cp
import torch
from torch.profiler import ProfilerActivity, profile

from minidnn import SGD, models
from minidnn.decide import build_executor

name, math = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
size = 224 if name != "overfeat" else 231
batch = 256
net = models.build(name, num_classes=1000, image_size=size)
ex = build_executor(net, batch, device="gpu", seed=0, math="tf32", deterministic=False,
                    precision="bf16" if math == "bf16" else "fp32")
opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
with ex.device.compute:
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=cp.float32)
    labels = rng.integers(0, 1000, batch).astype(cp.int64)
for _ in range(5):
    ex.train_step(x, labels, opt)
ex.device.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(steps):
        ex.train_step(x, labels, opt)
    torch.cuda.synchronize()
events = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e[0])
span = events[-1][1] - events[0][0]
busy, gaps, reach, before = 0.0, [], events[0][0], events[0][2]
for start, end, what in events:
    if start > reach:
        gaps.append((start - reach, before, what))
    busy += max(0.0, end - max(start, reach))
    if end > reach:
        reach, before = end, what
print(f"{name} {math}: {steps} steps, {len(events)} device activities, span {span / 1e3:.2f} ms, "
      f"busy {busy / 1e3:.2f} ms, idle {(span - busy) / 1e3:.2f} ms in {len(gaps)} gaps "
      f"({sum(g[0] for g in gaps if g[0] < 5) / 1e3:.2f} ms in gaps under 5 us)")
for gap, after, what in sorted(gaps, reverse=True)[:20]:
    print(f"  {gap:9.1f} us  after {after[:70]}\n               before {what[:70]}")
