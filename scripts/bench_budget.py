#!/usr/bin/env python3
"""Training under a memory cap: minidnn's plan against what a PyTorch user would try.

For one network and batch and one or more caps (default VGG-16 at 256 under 12 GiB and 4 GiB),
in one call on one GPU, each configuration in its own process (so none inherits another's
cached memory):

* minidnn: `--policy dyn` with the cap as its memory budget (the planner chooses micro-batches,
  offload, recomputation, convolution plans and lookahead; --relu-bits by default), its chosen
  decision and its predicted step beside the measured one;
* PyTorch, capped with torch.cuda.set_per_process_memory_fraction(cap / total memory):
  - plain steps, NCHW and channels_last;
  - gradient accumulation, k micro-batches of batch/k (k in --accumulate, default 2, 4, 8, 16),
    NCHW and channels_last, each micro-batch's loss divided by k (the batch's mean);
  - torch.utils.checkpoint.checkpoint_sequential at each segment count of --segments
    (non-reentrant), alone and with accumulation, channels_last;
  - torch.autograd.graph.save_on_cpu(pin_memory=True), NCHW;
  - torch.compile (default mode) of the channels_last plain and accumulation steps (unless
    --no-compile): the first warm-up step compiles, its time is reported as compile_s and no
    timed step includes it.
  A configuration that runs out of memory under the cap is recorded as such.

--math tf32 (default) or fp32 sets how float32 computes in both frameworks. --math bf16 is mixed
precision: minidnn plans and runs bf16 feature maps (precision='bf16'), every PyTorch
configuration runs its forward and loss under torch.autocast("cuda", dtype=torch.bfloat16)
(checkpointed segments and save_on_cpu's saved tensors included), TF32 in both where float32
computes. Each row, the title and the JSON ('precision') say which.

The fastest PyTorch configuration that runs under a cap is that cap's anchor: minidnn's speed
is given as a ratio to it. Prints a markdown table per cap and writes bench_budget.json and
bench_budget.md into --out. PyTorch is imported only inside the PyTorch worker processes.
Each configuration costs its process start, cuDNN's benchmark search and warmup + steps
(about half a minute for VGG-16 at 256); with the defaults, 26 PyTorch configurations and
minidnn per cap. Under --time-limit a configuration gets the time left (at most --timeout);
one started with less than MIN_RUN_S left is skipped (listed as such).

    python3 scripts/bench_budget.py --out runs/bench_budget
    python3 scripts/bench_budget.py --model vgg416 --batch 32 --caps 12GiB --segments 10,20,40
    python3 scripts/bench_budget.py --caps 12GiB --only torch --accumulate 2,4 --segments 4
    python3 scripts/bench_budget.py --math bf16 --caps 6GiB --accumulate 2,4,8 --segments ""
    python3 scripts/bench_budget.py --model tiny_cnn --batch 8 --caps 64MiB --only minidnn \
        --device cpu --math bf16    # a check of the script on the CPU, minidnn alone
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minidnn.chunks import describe as describe_chunks  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import emit, run_worker, warm_up  # noqa: E402
from minidnn.errors import fmt_bytes, parse_bytes  # noqa: E402


# A configuration is not started with less time than this left under --time-limit: a process
# start, the cuDNN plan search and a few steps of a small network take about this long.
MIN_RUN_S = 30


# ---- configurations -------------------------------------------------------------------------------
def torch_configs(accumulate: list[int], segments: list[int],
                  layouts=("nchw", "channels_last"), whole_batch: bool = True,
                  compiled: bool = True) -> list[dict]:
    """The PyTorch configurations tried under every cap, in order. whole_batch=False leaves
    out the steps over the whole batch at once (plain and save_on_cpu), for caps where they are
    known to run out of memory; compiled: also each channels_last plain and accumulation
    step under torch.compile."""
    plain = {"segments": 0, "save_on_cpu": False, "compiled": False}
    configs = []
    for layout in layouts:
        counts = ([1] if whole_batch else []) + list(accumulate)
        configs += [dict(plain, layout=layout, accumulate=k) for k in counts]
        if compiled and layout == "channels_last":
            configs += [dict(plain, layout=layout, accumulate=k, compiled=True) for k in counts]
    for s in segments:
        for k in [1] + accumulate:
            configs.append(dict(plain, layout="channels_last", accumulate=k, segments=s))
    if whole_batch:
        configs.append(dict(plain, layout="nchw", accumulate=1, save_on_cpu=True))
    return configs


def float32_math(config: dict) -> str:
    """How float32 computes ('tf32' or 'fp32'): --math bf16 allows TF32 where float32 stays."""
    return "tf32" if config["math"] == "bf16" else config["math"]


def forced_chunks(spec: dict) -> dict:
    """build_executor's options for a minidnn row with --minidnn-chunks (one pass, the layer
    chunks given) or --minidnn-split (K passes, and the layer chunks after a '/'): dyn plans
    the rest; none for the other rows."""
    from minidnn.argtypes import layer_chunks
    if spec.get("forced_split"):
        count, _, chunks = spec["forced_split"].partition("/")
        return {"micro_batches": int(count), "chunks": layer_chunks(chunks) if chunks else ()}
    if not spec.get("forced_chunks"):
        return {}
    return {"micro_batches": 1, "chunks": layer_chunks(spec["forced_chunks"])}


def _describe_split(forced: str | None) -> str:
    """' --micro-batches 4 --chunks none' and the like, for a --minidnn-split row."""
    if not forced:
        return ""
    count, _, chunks = forced.partition("/")
    return f" --micro-batches {count} --chunks {chunks or 'none'}"


def describe(config: dict) -> str:
    """'channels_last, accumulation 4, checkpoint_sequential 8' and the like."""
    bf16 = config.get("precision") == "bf16"
    if config.get("framework") == "minidnn" and config.get("cap") is None:
        return "minidnn, no budget" + (" --precision bf16" if bf16 else "")
    if config.get("framework") == "minidnn":
        forced = config.get("forced_chunks")
        return "minidnn dyn" + (" --relu-bits" if config.get("relu_bits") else "") + \
            (" --split-batch-statistics" if config.get("split_statistics") else "") + \
            (" --precision bf16" if bf16 else "") + \
            (f" --micro-batches 1 --chunks {forced}" if forced else "") + \
            _describe_split(config.get("forced_split"))
    parts = ["NCHW" if config["layout"] == "nchw" else "channels_last"]
    if config["accumulate"] > 1:
        parts.append(f"accumulation {config['accumulate']}")
    if config["segments"]:
        parts.append(f"checkpoint_sequential {config['segments']}")
    if config["save_on_cpu"]:
        parts.append("save_on_cpu")
    if config.get("compiled"):
        parts.append("torch.compile")
    if bf16:
        parts.append("bf16 autocast")
    return ", ".join(parts)


# ---- the workers (each in its own process) --------------------------------------------------------
def torch_worker(spec: dict) -> dict:
    """One PyTorch configuration under its cap: warmup, then timed steps."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint_sequential
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_vs_pytorch import torch_training

    batch, cap, k = spec["batch"], spec["cap"], spec["accumulate"]
    result = dict(spec, framework="pytorch")
    if batch % k:
        return dict(result, error=f"accumulation {k} does not divide batch {batch}")
    if cap is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0))
    try:
        model, opt, x, labels = torch_training(spec["model"], batch, spec["image_size"],
                                               float32_math(spec), lr=1e-3, momentum=0.9,
                                               weight_decay=5e-4)
        if spec["layout"] == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        if spec.get("compiled"):
            model = torch.compile(model)
        segments = min(spec["segments"], len(model)) if spec["segments"] else 0
        if segments:
            # A segment that starts with an in-place ReLU would overwrite the previous
            # segment's output, which that segment's recomputation saved for its backward.
            for m in model.modules():
                if isinstance(m, torch.nn.ReLU):
                    m.inplace = False
        xs, ys = x.chunk(k), labels.chunk(k)

        def loss_of(xc, yc):
            """The micro-batch's share of the batch's mean loss: forward and loss under bf16
            autocast with --math bf16 (checkpointed segments recompute under it too), the
            tensors saved for backward on the host with save_on_cpu."""
            saving = torch.autograd.graph.save_on_cpu(pin_memory=True) if spec["save_on_cpu"] \
                else contextlib.nullcontext()
            with saving, torch.autocast("cuda", dtype=torch.bfloat16,
                                        enabled=spec["precision"] == "bf16"):
                logits = checkpoint_sequential(model, segments, xc, use_reentrant=False) \
                    if segments else model(xc)
                return F.cross_entropy(logits.float(), yc) / k

        def step():
            opt.zero_grad(set_to_none=False)
            total_loss = 0.0
            for xc, yc in zip(xs, ys):
                loss = loss_of(xc, yc)   # backward outside autocast and save_on_cpu
                loss.backward()
                total_loss = total_loss + loss.detach()
            opt.step()
            return total_loss

        _, compile_s = warm_up(step, spec["warmup"], bool(spec.get("compiled")),
                               torch.cuda.synchronize)
        if compile_s is not None:
            result["compile_s"] = compile_s
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(spec["steps"]):
            loss = step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / spec["steps"]
        result.update(step_time_s=dt, images_per_s=batch / dt, loss=float(loss),
                      peak_device_bytes=int(torch.cuda.max_memory_allocated()),
                      peak_reserved_bytes=int(torch.cuda.max_memory_reserved()))
    except torch.cuda.OutOfMemoryError as e:
        result["error"] = f"out of memory under {fmt_bytes(cap)}: {str(e).splitlines()[0][:120]}" \
            if cap else f"out of memory: {str(e).splitlines()[0][:120]}"
    return result


def minidnn_worker(spec: dict) -> dict:
    """minidnn's dyn plan for the cap, trained for warmup + steps on synthetic data; with
    --math bf16 the plan is decided and run for bf16 feature maps."""
    import gc

    from minidnn import SGD, models
    from minidnn.data import SyntheticImages
    from minidnn.decide import build_executor
    from minidnn.errors import MemoryBudgetError
    from minidnn.planner.dyn import DynPolicy

    batch, cap = spec["batch"], spec["cap"]
    result = dict(spec, framework="minidnn")
    net = models.build(spec["model"], num_classes=1000, image_size=spec["image_size"])
    policy = DynPolicy() if cap is not None else "none"   # no cap: the plain step
    t0 = time.perf_counter()
    try:
        ex = build_executor(net, batch, device=spec.get("device", "gpu"), seed=0,
                            policy=policy, memory_budget=cap, math=float32_math(spec),
                            precision=spec["precision"], relu_bits=spec.get("relu_bits", False),
                            split_batch_statistics=spec.get("split_statistics", False),
                            **forced_chunks(spec))
    except MemoryBudgetError as e:
        return dict(result, error=str(e))
    result["planning_s"] = time.perf_counter() - t0
    try:
        if cap is not None:   # what dyn planned
            result.update(_planned(policy))
        result.update(micro_batches=ex.micro_batches, prefetch_lookahead=ex.prefetch_lookahead,
                      chunks=[list(c) for c in ex.decision.chunks],
                      relu_bits_kept=len(ex.decision.relu_bits),   # dyn may leave them off
                      planned_precision=ex.decision.precision)   # the maps dyn planned for
        opt = SGD(ex.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4,
                  allocator=ex.allocator)
        data = SyntheticImages(1000, net.input_shape, seed=0)
        batches = data.device_batches(batch, ex.device, count=2)
        for s in range(spec["warmup"]):
            ex.train_step(*batches[s % 2], opt)
        ex.device.synchronize()
        t0 = time.perf_counter()
        peaks = []
        for s in range(spec["steps"]):
            loss = ex.train_step(*batches[s % 2], opt)
            peaks.append(ex.memory_stats()["steady_peak_device_bytes"])
        ex.device.synchronize()
        dt = (time.perf_counter() - t0) / spec["steps"]
        stats = ex.memory_stats()
        result.update(step_time_s=dt, images_per_s=batch / dt, loss=float(loss),
                      peak_device_bytes=int(max(peaks)),
                      offloaded_bytes=int(stats["offloaded_bytes"]),
                      step_graphs=ex.graph_stats())
    except MemoryBudgetError as e:
        result["error"] = str(e)
    finally:
        ex.close()
        gc.collect()
    return result


def _planned(policy) -> dict:
    """A DynPolicy's prediction for the step it planned, and its least budget."""
    out = {}
    if policy.result is not None:
        best = policy.result.best
        out.update(predicted_step_time_s=best.step_time_s, predicted_peak_bytes=best.peak_bytes,
                   offloaded_storages=len(best.offload), recomputed_storages=len(best.recompute))
    if policy.split is not None:
        out["minimum_budget_bytes"] = policy.split.minimum_budget
    if policy.remeasured is not None:   # the count chosen, planned again at its pass batch
        out["predicted_from_scaled_profile_s"] = policy.split.chosen.result.best.step_time_s
    return out


def worker(argv: list) -> None:
    """--worker JSON: run one configuration, print 'RESULT {json}'."""
    spec = json.loads(argv[0])
    run = minidnn_worker if spec.get("framework") == "minidnn" else torch_worker
    emit(run(spec))


def launch(spec: dict, timeout: int) -> dict:
    """Run one configuration in its own process; its result, or why there is none."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    result, why = run_worker(cmd, timeout)
    return result if result is not None else dict(spec, error=why)


# ---- output ---------------------------------------------------------------------------------------
def anchor_of(rows: list) -> dict | None:
    """The fastest PyTorch configuration that ran."""
    ran = [r for r in rows if r.get("framework") == "pytorch" and "error" not in r]
    return max(ran, key=lambda r: r["images_per_s"]) if ran else None


def markdown(results: dict) -> str:
    math = "bf16 mixed precision: minidnn's bf16 maps, PyTorch's bf16 autocast, TF32 where " \
        "float32 computes" if results["precision"] == "bf16" else f"{results['math']}, fp32 maps"
    lines = [f"# {results['model']} at batch {results['batch']} under a memory cap "
             f"({math}, {results['device_name']})", ""]
    for cap_text, rows in results["caps"].items():
        anchor = anchor_of(rows)
        lines += [f"## cap {cap_text}", "",
                  "| configuration | img/s | step | peak | vs anchor | note |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {describe(r)} | | | | | {r['error'][:140]} |")
                continue
            ratio = f"{r['images_per_s'] / anchor['images_per_s']:.2f}x" if anchor else "-"
            note = "anchor" if r is anchor else ""
            if r.get("compile_s") is not None:
                note += ("; " if note else "") + f"compiled in {r['compile_s']:.0f} s"
            if r.get("framework") == "minidnn":
                note = (f"{r.get('micro_batches', 1)} micro-batches, lookahead "
                        f"{r.get('prefetch_lookahead')}, offload {r.get('offloaded_storages', 0)}"
                        f", recompute {r.get('recomputed_storages', 0)}")
                if r.get("chunks"):
                    note += f"; layers {describe_chunks(r['chunks'])}"
                if r.get("relu_bits") and r.get("relu_bits_kept") == 0:
                    note += "; ReLU bit masks left off by the plan"
                if r.get("predicted_step_time_s"):
                    note += f"; predicted {r['predicted_step_time_s'] * 1e3:.1f} ms"
                graphs = r.get("step_graphs")
                if graphs:   # how many of all its steps (untimed ones too) were replays
                    note += (f"; {graphs['replayed_steps']} of {r['warmup'] + r['steps']} "
                             f"steps replayed")
            lines.append(f"| {describe(r)} | {r['images_per_s']:.0f} | "
                         f"{r['step_time_s'] * 1e3:.1f} ms | {fmt_bytes(r['peak_device_bytes'])} |"
                         f" {ratio} | {note} |")
        lines += ["", f"anchor: {describe(anchor) if anchor else 'no PyTorch configuration ran'}",
                  ""]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--caps", default="12GiB,4GiB",
                   help="comma-separated memory caps; 'none': no cap, each framework's plain "
                        "step of the whole batch (minidnn's own speed beside its capped runs)")
    p.add_argument("--math", default="tf32", choices=("tf32", "fp32", "bf16"),
                   help="how float32 computes; bf16: mixed precision (minidnn's bf16 feature "
                        "maps, PyTorch's bf16 autocast), TF32 where float32 computes")
    p.add_argument("--accumulate", default="2,4,8,16", help="PyTorch accumulation counts")
    p.add_argument("--segments", default="2,4,8",
                   help="checkpoint_sequential segment counts (VGG-416: 10,20,40)")
    p.add_argument("--layouts", default="nchw,channels_last",
                   help="PyTorch layouts of the plain and accumulation steps")
    p.add_argument("--no-whole-batch", action="store_true",
                   help="leave out PyTorch's plain and save_on_cpu steps of the whole batch "
                        "(they run out of memory under the caps of VGG-16 b256)")
    p.add_argument("--no-relu-bits", action="store_true", help="minidnn without --relu-bits")
    p.add_argument("--no-compile", action="store_true",
                   help="leave out PyTorch's torch.compile configurations")
    p.add_argument("--split-batch-statistics", action="store_true",
                   help="also run minidnn allowed to split the batch of a network with "
                        "BatchNorm (PyTorch's gradient accumulation splits its statistics)")
    p.add_argument("--minidnn-chunks", default="", metavar="FIRST:LAST:PIECES;...",
                   help="also run minidnn in one pass with these layer chunks (as train "
                        "--micro-batches 1 --chunks; ';' between runs of minidnn)")
    p.add_argument("--minidnn-split", default="", metavar="K[/FIRST:LAST:PIECES];...",
                   help="also run minidnn in K passes, with these layer chunks or none (as "
                        "train --micro-batches K --chunks; ';' between runs of minidnn)")
    p.add_argument("--only", choices=("minidnn", "torch"), default=None)
    p.add_argument("--warmup", type=int, default=4,
                   help="untimed steps; minidnn captures a CUDA graph per input batch (two "
                        "batches in turn) after two plain steps, so from 4 on every timed "
                        "step is a replay")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
    p.add_argument("--time-limit", type=float, default=3600,
                   help="seconds for the whole benchmark: a configuration runs in what is left, "
                        "at most --timeout; later ones are skipped")
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"),
                   help="where minidnn runs; cpu (with --only minidnn) checks the script")
    p.add_argument("--out", default="runs/bench_budget")
    args = p.parse_args(argv)
    args.precision = "bf16" if args.math == "bf16" else "fp32"   # of the feature maps
    if args.device == "cpu" and args.only != "minidnn":
        p.error("--device cpu runs minidnn alone: add --only minidnn (PyTorch runs on the GPU)")
    if args.time_limit <= MIN_RUN_S:
        p.error(f"--time-limit {args.time_limit:g} leaves no configuration its {MIN_RUN_S} s to "
                f"start: give more than {MIN_RUN_S}")
    return args


def specs_for(args, cap: int, image: int) -> list[dict]:
    """The configurations run under one cap, in order, each the spec its worker gets."""
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    base = {"model": args.model, "batch": args.batch, "image_size": image, "math": args.math,
            "precision": args.precision, "warmup": args.warmup, "steps": args.steps, "cap": cap}
    specs = []
    if cap is None:   # each framework's own speed: the plain steps of the whole batch
        if args.only != "torch":
            specs.append(dict(base, framework="minidnn", device=args.device))
        if args.only != "minidnn":
            specs += [dict(base, **c) for c in torch_configs([], [], args.layouts.split(","),
                                                             True, not args.no_compile)
                      if c["accumulate"] == 1 and not c["save_on_cpu"]]
        return specs
    if args.only != "torch":
        mini = dict(base, framework="minidnn", device=args.device,
                    relu_bits=not args.no_relu_bits)
        specs.append(mini)
        if args.split_batch_statistics:   # as PyTorch's accumulation splits them
            specs.append(dict(mini, split_statistics=True))
        specs += [dict(mini, forced_chunks=c) for c in args.minidnn_chunks.split(";") if c]
        specs += [dict(mini, forced_split=c) for c in args.minidnn_split.split(";") if c]
    if args.only != "minidnn":
        specs += [dict(base, **c)
                  for c in torch_configs(ints(args.accumulate), ints(args.segments),
                                         args.layouts.split(","), not args.no_whole_batch,
                                         not args.no_compile)]
    return specs


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(argv[1:])
        return 0
    args = parse_args(argv)
    from minidnn import models
    from minidnn.backend import select_device
    device = select_device(args.device)
    image = args.image_size or models.native_image_size(args.model)
    results = {"model": args.model, "batch": args.batch, "image_size": image, "math": args.math,
               "precision": args.precision, "device_name": device.name, "caps": {}}
    deadline = time.time() + args.time_limit
    for cap_text in args.caps.split(","):
        rows = []
        cap = None if cap_text.lower() == "none" else parse_bytes(cap_text)
        for spec in specs_for(args, cap, image):
            left = deadline - time.time()   # a configuration gets what is left, at most --timeout
            if left < MIN_RUN_S:
                rows.append(dict(spec, error="skipped: time limit"))
                continue
            r = launch(spec, min(args.timeout, int(left)))
            rows.append(r)
            what = f"[{cap_text}] {describe(r)}"
            print(f"{what}: {r['error']}" if "error" in r else
                  f"{what}: {r['images_per_s']:.0f} img/s, {r['step_time_s'] * 1e3:.1f} ms, "
                  f"peak {fmt_bytes(r['peak_device_bytes'])}", flush=True)
        results["caps"][cap_text] = rows
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_budget.json").write_text(json.dumps(results, indent=1))
    text = markdown(results)
    (out / "bench_budget.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
