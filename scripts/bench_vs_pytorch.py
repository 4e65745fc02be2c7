"""minidnn against PyTorch on the same GPU: whole training steps, or single kernels.

Training (default): the same network (minidnn's definition, translated layer by layer into
torch.nn; for a ResNet, torchvision's own resnetN, which loads minidnn's state dict as it
is), the same initial weights, batch and precision, synthetic data made on the device, SGD
with momentum. Each (framework, network) runs in its own process so that the two allocators
never share the card. Reports ms/iter, images/s and peak device memory (minidnn:
the arena's peak, which counts everything it hands out; PyTorch: max_memory_allocated), both
measured over the timed steps only (the first steps, which pick convolution algorithms, are
excluded from both).

    python3 scripts/bench_vs_pytorch.py                          # the default runs
    python3 scripts/bench_vs_pytorch.py --runs vgg16:64:tf32 --steps 5
    python3 scripts/bench_vs_pytorch.py --kernels --batch 32      # per-layer kernel table

--kernels: for every distinct convolution of VGG-16 and AlexNet, minidnn's cuDNN plan table
(fastest plan, least-workspace plan) against PyTorch's conv2d with cudnn.benchmark, in TF32 and
strict FP32; and the pooling / LRN kernels against PyTorch's.

Precision: 'tf32' allows TF32 in convolutions and matrix products in both frameworks
(torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32); 'fp32' forbids it
in both; 'bf16' runs minidnn with bf16 feature maps (precision='bf16') and PyTorch under bf16
autocast, TF32 in both where float32 computes. PyTorch is imported only here, and only on the machine that runs the benchmark.

Configurations (--frameworks), each run in a process of its own:
  minidnn          minidnn as it runs by default (kernels/mapformat.py: GPU_DEFAULT_LAYOUT)
  minidnn-nchw     minidnn with NCHW feature maps (layout='nchw')
  minidnn-nhwc     minidnn with channels-last feature maps (layout='nhwc')
  minidnn-unfused  minidnn as it runs by default, but every convolution adds its own bias
                   (decide(..., fuse=False); minidnn/fusion.py): the step before that fusion
  minidnn-nographs minidnn as it runs by default, but every step issued by the host layer by
                   layer, none replayed from a CUDA graph (graphs=False; minidnn/step_graph.py)
  minidnn-relubits minidnn with --relu-bits (relu_bits=True): a ReLU whose output only its own
                   backward and a convolution's read keeps one bit a value for its backward,
                   which then reads the bits instead of the map (memory/policy.py)
  pytorch          PyTorch as it runs by default (NCHW)
  pytorch-cl       PyTorch with the model and the batch in channels_last
  pytorch-cl-bf16  PyTorch channels_last under bf16 autocast (TF32 allowed where fp32 stays)
  pytorch-cl-compiled, pytorch-cl-bf16-compiled
                   the same under torch.compile (default mode): the first warm-up step
                   compiles; its time is reported as compile_s and is in no timed step
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import emit, kernel_class, run_worker, warm_up  # noqa: E402

DEFAULT_RUNS = ("vgg16:256:tf32", "alexnet:256:tf32", "vgg16:256:fp32", "resnet50:256:tf32")
GiB = 1024 ** 3


# ---- the network in PyTorch -------------------------------------------------------------------
class GraphStep(NamedTuple):
    """One node of a network in the order it runs: its name, its inputs' names, its layer,
    and the names of the values no later step reads (freed once it has run)."""
    name: str
    inputs: tuple
    layer: object
    frees: tuple


def graph_steps(net) -> list:
    """The layers of a minidnn Network, the loss left out, as GraphSteps in the network's
    topological order: any DAG (Concat and Add joins included), not only chains. The input
    batch is named network.DATA."""
    from minidnn.network import DATA
    steps = [(n.name, tuple(n.inputs), n.layer) for n in net.nodes if n.layer.kind != "loss"]
    last_use = {DATA: -1}
    for k, (_, inputs, _) in enumerate(steps):
        for i in inputs:
            last_use[i] = k
    output = steps[-1][0]
    frees = [[] for _ in steps]
    for value, k in last_use.items():
        if k >= 0 and value != output:
            frees[k].append(value)
    return [GraphStep(name, inputs, layer, tuple(frees[k]))
            for k, (name, inputs, layer) in enumerate(steps)]


def overwritable(steps) -> set:
    """Names of the steps that may overwrite their one input in place (a ReLU's twin with
    inplace=True): no other step reads that input, and it is not the input batch."""
    from minidnn.network import DATA
    readers: dict = {}
    for step in steps:
        for i in step.inputs:
            readers[i] = readers.get(i, 0) + 1
    return {step.name for step in steps
            if len(step.inputs) == 1 and step.inputs[0] != DATA and readers[step.inputs[0]] == 1}


def torch_module(layer, in_place: bool):
    """The torch.nn twin of one minidnn layer (None for the joins, Concat and Add, which
    the graph runs itself); in_place: a ReLU may overwrite its input (no other reader)."""
    import torch.nn as nn
    from minidnn.layers import Flatten, Linear, ReLU
    from minidnn.layers.batchnorm import BatchNorm2d
    from minidnn.layers.conv import Conv2d
    from minidnn.layers.dropout import Dropout
    from minidnn.layers.lrn import LRN
    from minidnn.layers.merge import Add, Concat
    from minidnn.layers.pool import AvgPool2d, MaxPool2d
    if isinstance(layer, (Add, Concat)):
        return None
    if isinstance(layer, Conv2d):
        return nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                         layer.padding, layer.dilation, layer.groups, layer.bias)
    if isinstance(layer, ReLU):
        return nn.ReLU(inplace=in_place)
    if isinstance(layer, BatchNorm2d):
        return nn.BatchNorm2d(layer.in_shapes[0][1], eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, LRN):
        s = layer.spec
        return nn.LocalResponseNorm(s.size, s.alpha, s.beta, s.k)
    if isinstance(layer, MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding,
                            ceil_mode=layer.ceil_mode)
    if isinstance(layer, AvgPool2d):
        return nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding,
                            ceil_mode=layer.ceil_mode, count_include_pad=layer.count_include_pad)
    if isinstance(layer, Flatten):
        return nn.Flatten()
    if isinstance(layer, Linear):
        return nn.Linear(layer.in_features, layer.out_features, layer.bias)
    if isinstance(layer, Dropout):
        return nn.Dropout(layer.p)
    raise SystemExit(f"bench_vs_pytorch: no PyTorch twin for {type(layer).__name__} "
                     f"({layer.name})")


def torch_model(net):
    """A torch.nn.Module equivalent of a minidnn Network (loss excluded): nn.Sequential for a
    chain, else a module that runs graph_steps; and the list of (minidnn parameter or buffer
    name, torch tensor) pairs for copying weights."""
    import torch
    import torch.nn as nn
    from minidnn.layers.merge import Add
    from minidnn.network import DATA
    steps = graph_steps(net)
    in_place = overwritable(steps)
    modules, pairs = {}, []
    for step in steps:
        m = torch_module(step.layer, in_place=step.name in in_place)
        if m is None:
            continue
        for pname, p in list(m.named_parameters()) + list(m.named_buffers()):
            pairs.append((f"{step.name}.{pname}", p))
        modules[step.name] = m
    chain = all(len(s.inputs) == 1 and s.name in modules for s in steps) and \
        all(s.inputs[0] == (steps[k - 1].name if k else DATA) for k, s in enumerate(steps))
    if chain:
        return nn.Sequential(*modules.values()), pairs

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            # ModuleDict keys may not hold dots; minidnn's node names may.
            self.layers = nn.ModuleDict({k.replace(".", "__"): m for k, m in modules.items()})

        def forward(self, x):
            values = {DATA: x}
            for step in steps:
                xs = [values[i] for i in step.inputs]
                if step.name in modules:
                    y = self.layers[step.name.replace(".", "__")](xs[0])
                elif isinstance(step.layer, Add):
                    y = xs[0] + xs[1]
                    for more in xs[2:]:
                        y = y + more
                else:                                   # Concat
                    y = torch.cat(xs, dim=step.layer.axis)
                values[step.name] = y
                for value in step.frees:
                    del values[value]
            return values[steps[-1].name]

    return Graph(), pairs


def torch_reference(name, net):
    """The PyTorch model of a minidnn network, with its weights: torchvision's own ResNet for
    resnetN (the same state dict keys and layouts, running statistics included), any other
    network translated by torch_model."""
    import torch
    if name.startswith("resnet"):
        import torchvision
        model = getattr(torchvision.models, name)(num_classes=net.num_classes)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
        return model
    return torch_copy(net)


def torch_copy(net):
    """torch_model(net) holding `net`'s parameters and buffers (its state dict's values)."""
    import torch
    weights = net.state_dict()
    model, pairs = torch_model(net)
    with torch.no_grad():
        for key, p in pairs:
            p.copy_(torch.from_numpy(weights[key]))
    return model


def image_size(name: str) -> int:
    from minidnn import models
    return models.native_image_size(name)


# ---- one run (a child process) -----------------------------------------------------------------
def layer_profile(ex, x, labels, opt, top=12) -> dict:
    """Compute time of one traced step by (phase, layer kind), and the slowest layer calls."""
    tracer = ex.enable_trace(True)
    ex.train_step(x, labels, opt)
    spans = [s for s in tracer.resolved_spans() if s.track == "compute"]
    ex.enable_trace(False)
    kinds = {node.name: node.layer.kind for node in ex.net.nodes}
    by_kind: dict = {}
    for s in spans:
        layer = s.name.split(" ", 1)[-1]          # spans are named '<phase> <layer>'
        key = f"{s.category} {kinds.get(layer, '?')}"
        by_kind[key] = by_kind.get(key, 0.0) + s.dur_us / 1e3
    slowest = sorted(spans, key=lambda s: -s.dur_us)[:top]
    return {"ms_by_kind": {k: round(v, 2) for k, v in sorted(by_kind.items(),
                                                             key=lambda kv: -kv[1])},
            "total_ms": round(sum(s.dur_us for s in spans) / 1e3, 2),
            "slowest": [(s.name, round(s.dur_us / 1e3, 2)) for s in slowest]}


FRAMEWORKS = ("minidnn", "minidnn-nchw", "minidnn-nhwc", "minidnn-unfused", "minidnn-nographs",
              "minidnn-relubits", "pytorch", "pytorch-cl", "pytorch-cl-bf16", "pytorch-cl-compiled",
              "pytorch-cl-bf16-compiled")
DEFAULT_FRAMEWORKS = ("minidnn", "pytorch", "pytorch-cl", "pytorch-cl-bf16",
                      "pytorch-cl-compiled", "pytorch-cl-bf16-compiled")


def run_minidnn(name, batch, math, steps, warmup, profile=False, layout=None, fuse=True,
                graphs=True, relu_bits=False):
    import cupy as cp
    from minidnn import SGD, models
    from minidnn.decide import build_executor
    size = image_size(name)
    net = models.build(name, num_classes=1000, image_size=size)
    # 'bf16': mixed precision (bf16 feature maps), TF32 where float32 computes.
    ex = build_executor(net, batch, device="gpu", seed=0,
                        math="tf32" if math == "bf16" else math, deterministic=False,
                        layout=layout, precision="bf16" if math == "bf16" else "fp32",
                        fuse=fuse, graphs=graphs, relu_bits=relu_bits)
    opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
    with ex.device.compute:
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((batch, 3, size, size), dtype=cp.float32)
        labels = rng.integers(0, 1000, batch).astype(cp.int64)
    t0 = time.perf_counter()
    losses = []
    for k in range(warmup):
        losses.append(ex.train_step(x, labels, opt))
        ex.device.synchronize()
        cache = ex.kernels.conv_cache_stats() if hasattr(ex.kernels, "conv_cache_stats") else {}
        print(f"warm-up step {k}: {time.perf_counter() - t0:.1f} s, conv plans "
              f"{json.dumps(cache)}", file=sys.stderr, flush=True)
    warm_s = time.perf_counter() - t0
    # peak_device_bytes counts the warm-up's plan measurements; steady_peak_device_bytes is
    # the peak of the last step alone, so take its largest over the timed steps.
    step_peaks = []
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(ex.train_step(x, labels, opt))
        step_peaks.append(ex.memory_stats()["steady_peak_device_bytes"])
    ex.device.synchronize()
    dt = (time.perf_counter() - t0) / steps
    cache = ex.kernels.conv_cache_stats() if hasattr(ex.kernels, "conv_cache_stats") else {}
    extra = {}
    if profile:
        extra["profile"] = layer_profile(ex, x, labels, opt)
        extra["kernels"] = torch_kernel_profile(lambda: ex.train_step(x, labels, opt))
    return {**extra, "framework": "minidnn", "layout": ex.maps.layout,
            "ms_per_iter": dt * 1e3, "images_per_s": batch / dt,
            "peak_bytes": int(max(step_peaks)), "warmup_s": warm_s,
            "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
            "conv_graphs": cache.get("graphs_built"), "conv_build_s": cache.get("build_s"),
            "conv_measure_s": cache.get("measure_s")}


def torch_training(name, batch, image, math, lr, momentum, weight_decay=0.0,
                   channels_last=False):
    """(model, optimizer, x, labels) of a PyTorch run set up as minidnn's: the network of
    torch_reference with minidnn's initial weights (seed 0), on the GPU in training
    mode, SGD, one synthetic batch made on the device, cuDNN benchmark mode and TF32 as `math`
    says ('tf32' or 'fp32'); channels_last: model and batch in torch.channels_last."""
    import torch
    from minidnn import models
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
    net = models.build(name, num_classes=1000, image_size=image)
    net.init_params(0)
    model = torch_reference(name, net).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, image, image, device="cuda", generator=gen)
    labels = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, opt, x, labels


def torch_kernel_profile(step, top=16) -> dict:
    """GPU time of one step, `step()`, of either framework, in total, by kernel class
    (kernel_class) and for its slowest kernels by name, as PyTorch's profiler (CUPTI) sees
    every kernel of the process."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms, count = kernels.get(e.name, (0.0, 0))
            kernels[e.name] = (ms + e.device_time_total / 1e3, count + 1)
    slowest = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    by_class: dict = {}
    for name, (ms, _) in kernels.items():
        cls = kernel_class(name)
        by_class[cls] = by_class.get(cls, 0.0) + ms
    return {"total_ms": round(sum(ms for ms, _ in kernels.values()), 2),
            "by_class": {c: round(ms, 2) for c, ms in sorted(by_class.items(),
                                                            key=lambda kv: -kv[1])},
            "slowest": [(name[:90], round(ms, 2), count) for name, (ms, count) in slowest]}


def run_torch(name, batch, math, steps, warmup, profile=False, channels_last=False,
              bf16=False, compiled=False):
    import contextlib
    import torch
    import torch.nn.functional as F
    model, opt, x, labels = torch_training(name, batch, image_size(name),
                                           "tf32" if bf16 else math, lr=0.01, momentum=0.9,
                                           channels_last=channels_last)
    if compiled:
        model = torch.compile(model)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=False)
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    t0 = time.perf_counter()
    losses, compile_s = warm_up(step, warmup, compiled, torch.cuda.synchronize)
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    losses += [step() for _ in range(steps)]
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    extra = {"kernels": torch_kernel_profile(step)} if profile else {}
    return {**extra, "framework": "pytorch", "ms_per_iter": dt * 1e3, "images_per_s": batch / dt,
            "compile_s": compile_s,
            "peak_bytes": int(torch.cuda.max_memory_allocated()), "warmup_s": warm_s,
            "loss_first": float(losses[0]), "loss_last": float(losses[-1])}


def child(args) -> None:
    fw, name, batch, math = args.one[0], args.one[1], int(args.one[2]), args.one[3]
    if fw.startswith("minidnn"):
        variant = fw.split("-")[1] if "-" in fw else None
        res = run_minidnn(name, batch, math, args.steps, args.warmup, profile=args.profile,
                          layout=variant if variant in ("nchw", "nhwc") else None,
                          fuse=variant != "unfused", graphs=variant != "nographs",
                          relu_bits=variant == "relubits")
    else:
        res = run_torch(name, batch, math, args.steps, args.warmup, profile=args.profile,
                        channels_last=fw != "pytorch",
                        bf16=fw.startswith("pytorch-cl-bf16") or math == "bf16",
                        compiled=fw.endswith("-compiled"))
    res.update(network=name, batch=batch, math=math, framework=fw)
    emit(res)


def train_bench(args) -> list:
    results = []
    for run in args.runs:
        name, batch, math = run.split(":")
        for fw in args.frameworks:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", fw, name, batch, math,
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
            cmd += ["--profile"] if args.profile else []
            t0 = time.time()
            res, why = run_worker(cmd, args.timeout, tail=12)
            if res is None:
                res = {"framework": fw, "network": name, "batch": int(batch), "math": math,
                       "error": why}
                print(f"{fw} {run}: FAILED\n  " + "\n  ".join(why.split(" | ")), flush=True)
            else:
                print(f"{fw} {run}: {res['ms_per_iter']:.1f} ms/iter, "
                      f"{res['images_per_s']:.0f} img/s, peak {res['peak_bytes'] / GiB:.2f} GiB "
                      f"({time.time() - t0:.0f} s with start-up)", flush=True)
                for key in ("profile", "kernels"):
                    if key in res:
                        print(f"  {key}: " + json.dumps(res[key]), flush=True)
            results.append(res)
    print()
    print("| network | batch | precision | framework | ms/iter | images/s | peak memory | "
          "loss first -> last |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['network']} | {r['batch']} | {r['math']} | {r['framework']} | failed | "
                  f"| | |")
            continue
        print(f"| {r['network']} | {r['batch']} | {r['math']} | {r['framework']} | "
              f"{r['ms_per_iter']:.1f} | {r['images_per_s']:.0f} | "
              f"{r['peak_bytes'] / GiB:.2f} GiB | {r['loss_first']:.3f} -> {r['loss_last']:.3f} |")
    return results


# ---- kernels -----------------------------------------------------------------------------------
def _time_torch(fn, reps=5):
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _time_cupy(fn, reps=5):
    import cupy as cp
    fn()
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def distinct_convs(batch):
    """[(model, layer, x_shape, w_shape, ConvSpec)] of VGG-16 and AlexNet, one per shape."""
    from minidnn import models
    from minidnn.layers.conv import Conv2d
    seen, out = set(), []
    for name in ("vgg16", "alexnet"):
        net = models.build(name, num_classes=1000, image_size=image_size(name))
        net.infer_shapes(batch)
        for node in net.nodes:
            layer = node.layer
            if isinstance(layer, Conv2d):
                key = (tuple(layer.in_shapes[0]), layer.params["weight"].shape, layer.spec.stride,
                       layer.spec.padding, layer.spec.groups)
                if key not in seen:
                    seen.add(key)
                    out.append((name, node.name, key[0], key[1], layer.spec))
    return out


def kernel_bench(args) -> list:
    import cupy as cp
    import numpy as np
    import torch
    import torch.nn.functional as F
    from minidnn.kernels import LRNSpec, PoolSpec, cuda, out_size
    torch.backends.cudnn.benchmark = True
    rows = []
    stream = cp.cuda.Stream(non_blocking=True)
    print("| layer | x | w | precision | op | minidnn fastest ms (workspace MB) | "
          "minidnn least-workspace ms (MB) | plans | PyTorch ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    convs = distinct_convs(args.batch)
    for model, lname, xs, ws, spec in convs[:args.convs] if args.convs else convs:
        for math in ("tf32", "fp32"):
            cuda.configure(math)
            torch.backends.cudnn.allow_tf32 = math == "tf32"
            x = torch.randn(xs, device="cuda", requires_grad=True)
            w = torch.randn(ws, device="cuda", requires_grad=True)

            def fwd():
                return F.conv2d(x, w, None, spec.stride, spec.padding, spec.dilation, spec.groups)
            y = fwd()
            gy = torch.randn_like(y)
            t_fwd = _time_torch(fwd)
            t_dgrad = _time_torch(lambda: torch.autograd.grad(fwd(), x, gy)) - t_fwd
            t_wgrad = _time_torch(lambda: torch.autograd.grad(fwd(), w, gy)) - t_fwd
            del x, w, y, gy
            torch.cuda.empty_cache()
            with stream:
                for op, t_torch in (("fprop", t_fwd), ("dgrad", t_dgrad), ("wgrad", t_wgrad)):
                    if op == "dgrad" and xs[1] == 3:
                        continue  # first layer: no input gradient in training
                    table = cuda.conv_plans(op, xs, ws, spec)
                    ran = [t for t in table if np.isfinite(t[2])]
                    fast = min(ran, key=lambda t: t[2])
                    least = min(t[1] for t in ran)
                    lean = min((t for t in ran if t[1] == least), key=lambda t: t[2])
                    row = dict(model=model, layer=lname, x=list(xs), w=list(ws), math=math, op=op,
                               fastest_ms=fast[2], fastest_ws=fast[1], lean_ms=lean[2],
                               lean_ws=lean[1], plans=len(table), torch_ms=t_torch)
                    rows.append(row)
                    print(f"| {model}.{lname} | {list(xs)} | {list(ws)} | {math} | {op} | "
                          f"{fast[2]:.3f} ({fast[1] / 1e6:.0f}) | {lean[2]:.3f} ({lean[1] / 1e6:.0f}) "
                          f"| {len(table)} | {t_torch:.3f} |", flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    print("conv cache:", cuda.conv_cache_stats())

    # pooling and LRN: minidnn kernels against PyTorch's, forward + backward, float32
    cuda.configure("tf32")
    n = args.batch
    cases = [("vgg pool1", (n, 64, 224, 224), "max", PoolSpec((2, 2), (2, 2))),
             ("alexnet pool1", (n, 96, 55, 55), "max", PoolSpec((3, 3), (2, 2), ceil_mode=True)),
             ("avg 3x3 s1 p1", (n, 64, 56, 56), "avg", PoolSpec((3, 3), (1, 1), (1, 1))),
             ("alexnet norm1", (n, 96, 55, 55), "lrn", LRNSpec(5, 1e-4, 0.75, 1.0))]
    print("\n| kernel | x | minidnn fwd ms | minidnn bwd ms | PyTorch fwd ms | PyTorch fwd+bwd ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, xs, kind, spec in cases:
        with stream:
            x = cp.random.standard_normal(xs, dtype=np.float32)
            if kind == "lrn":
                y, scale, gx = cp.empty_like(x), cp.empty_like(x), cp.empty_like(x)
                gy = cp.ones_like(x)
                f = lambda: cuda.lrn_forward(x, y, scale, spec)                     # noqa: E731
                b = lambda: cuda.lrn_backward(x, y, scale, gy, gx, spec)          # noqa: E731
            else:
                oh = out_size(xs[2], spec.kernel[0], spec.stride[0], spec.padding[0], 1,
                              spec.ceil_mode)
                ow = out_size(xs[3], spec.kernel[1], spec.stride[1], spec.padding[1], 1,
                              spec.ceil_mode)
                y = cp.empty(xs[:2] + (oh, ow), np.float32)
                gy, gx = cp.ones_like(y), cp.empty_like(x)
                if kind == "max":
                    arg = cp.empty(y.shape, np.uint8)
                    f = lambda: cuda.maxpool2d_forward(x, y, arg, spec)           # noqa: E731
                    b = lambda: cuda.maxpool2d_backward(gy, arg, gx, spec)        # noqa: E731
                else:
                    f = lambda: cuda.avgpool2d_forward(x, y, spec)                # noqa: E731
                    b = lambda: cuda.avgpool2d_backward(gy, gx, spec)             # noqa: E731
            t_f, t_b = _time_cupy(f), _time_cupy(b)
        tx = torch.randn(xs, device="cuda", requires_grad=True)
        if kind == "lrn":
            tf = lambda: F.local_response_norm(tx, spec.size, spec.alpha, spec.beta, spec.k)  # noqa
        elif kind == "max":
            tf = lambda: F.max_pool2d(tx, spec.kernel, spec.stride, spec.padding,  # noqa: E731
                                      ceil_mode=spec.ceil_mode)
        else:
            tf = lambda: F.avg_pool2d(tx, spec.kernel, spec.stride, spec.padding)  # noqa: E731
        ty = tf()
        tgy = torch.ones_like(ty)
        p_f = _time_torch(tf)
        p_fb = _time_torch(lambda: torch.autograd.grad(tf(), tx, tgy))
        rows.append(dict(kernel=label, x=list(xs), minidnn_fwd_ms=t_f, minidnn_bwd_ms=t_b,
                         torch_fwd_ms=p_f, torch_fwd_bwd_ms=p_fb))
        print(f"| {label} | {list(xs)} | {t_f:.3f} | {t_b:.3f} | {p_f:.3f} | {p_fb:.3f} |",
              flush=True)
        del tx, ty, tgy
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS),
                    help="network:batch:precision (precision tf32, fp32 or bf16: minidnn's "
                         "--precision bf16, PyTorch's bf16 autocast); default: %(default)s")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--frameworks", nargs="+", default=list(DEFAULT_FRAMEWORKS),
                    choices=FRAMEWORKS, help="which configurations to run, each in its own "
                    "process (see above; default: %(default)s)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one step: its slowest GPU kernels (PyTorch's "
                         "profiler), and minidnn's compute time per layer kind")
    ap.add_argument("--kernels", action="store_true", help="per-kernel table instead")
    ap.add_argument("--batch", type=int, default=32, help="batch of the kernel table")
    ap.add_argument("--convs", type=int, default=0,
                    help="kernel table: only the first N distinct convolutions (0: all)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)   # framework network batch math
    args = ap.parse_args(argv)
    if args.one:
        child(args)
        return
    t0 = time.time()
    results = kernel_bench(args) if args.kernels else train_bench(args)
    print(f"\n({time.time() - t0:.0f} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
