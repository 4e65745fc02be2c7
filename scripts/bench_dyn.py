#!/usr/bin/env python3
"""vDNN_dyn's benchmark in one run: every policy, planned and measured, and PyTorch beside it.

For each network and batch (default: VGG-16 at 256, 128 and 64, AlexNet and OverFeat at 128)
under one memory budget (default 12 GiB, the paper's K40):

1. profile the network on this GPU (planner/profile.py; the profiles are written to the
   output folder, so `minidnn plan --profile FILE` can plan from them anywhere);
2. plan every policy: none, vDNN_conv and vDNN_all with the fastest and with the
   memory-optimal convolution plans (prefetch lookahead 1, the executor's default), and dyn
   (the planner's decision, its prefetch lookahead included, as `--policy dyn`; when it
   recomputes maps, also its plan with offload only, to measure what recomputing gains); a
   configuration whose planned need exceeds the budget is skipped (it would fail), and so
   recorded;
3. train each remaining configuration for --warmup + --steps steps on synthetic data, in an
   arena of the budget, and measure the steady-state peak of the arena, the average bytes of
   feature maps on the device, images/s, and bytes moved per step;
4. set measured step time beside the model's prediction and beside the physical bound
   max(compute time, bytes moved / measured bandwidth).

Then VGG-16 at batch 256 with PyTorch (each run in its own process, PyTorch only there):
without offload (no cap), and under torch.autograd.graph.save_on_cpu(pin_memory=True) capped
at the budget (and, if that runs out of memory, again without the cap to show what it needs).

Writes bench_dyn.md (tables), bench_dyn.json (everything) and bench_dyn.png (memory and speed
per policy per network) into --out. Kept short: few steps, and a time limit (--time-limit)
after which the remaining configurations are skipped (and listed as skipped).

    python3 scripts/bench_dyn.py --out runs/bench_dyn
    python3 scripts/bench_dyn.py --configs vgg16:256 --policies all,dyn --budget 12GiB
    python3 scripts/bench_dyn.py --device cpu --configs tiny_cnn:8 --image-size 32 \\
        --budget 64MiB --no-torch --steps 1 --warmup 1          # a smoke run on a laptop
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minidnn import SGD, models  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchlib, beside it
from benchlib import emit, run_worker  # noqa: E402
from minidnn.backend import select_device  # noqa: E402
from minidnn.errors import fmt_bytes, parse_bytes  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.memory.policy import MemoryDecision, relu_bits_for  # noqa: E402
from minidnn.planner.dyn import FixedDecision  # noqa: E402
from minidnn.kernels.math_mode import MATH_MODES  # noqa: E402

DEFAULT_CONFIGS = "vgg16:256,vgg16:128,vgg16:64,alexnet:128,overfeat:128"
PLAN_LABELS = {"fastest": "fastest", "min_workspace": "memory-optimal", "planned": "planned",
               "offload only": "planned, offload only"}


# ---- one minidnn run ----------------------------------------------------------------------------
def measure_run(net, batch: int, device, decision: MemoryDecision, budget: int | None,
                math: str, warmup: int, steps: int, input_batches: int = 2,
                relu_bits: bool = False) -> dict:
    """Train `steps` timed steps after `warmup`; steady-state memory and speed."""
    from minidnn.data import SyntheticImages
    ex = build_executor(net, batch, device=device, seed=0, policy=FixedDecision(decision),
                        memory_budget=budget, math=math if device.is_gpu else None,
                        relu_bits=relu_bits)
    # Convolutions whose planned workspace did not fit at run time ran a leaner plan instead;
    # each configuration starts from the planned choices.
    if hasattr(ex.kernels, "reset_workspace_fallbacks"):
        ex.kernels.reset_workspace_fallbacks()
    fallbacks = getattr(ex.kernels, "workspace_fallbacks", {})
    try:
        opt = SGD(ex.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4,
                  allocator=ex.allocator)
        data = SyntheticImages(1000 if net.num_classes is None else net.num_classes,
                               net.input_shape, seed=0)
        batches = data.device_batches(batch, ex.device, count=input_batches)
        t0 = time.perf_counter()
        loss = None
        for k in range(warmup):
            loss = ex.train_step(*batches[k % len(batches)], opt)
        ex.device.synchronize()
        warm_s = time.perf_counter() - t0
        step_peaks = []                  # steady state: plan measurement and pinning excluded
        t0 = time.perf_counter()
        for k in range(steps):
            loss = ex.train_step(*batches[k % len(batches)], opt)
            step_peaks.append(ex.memory_stats()["steady_peak_device_bytes"])
        ex.device.synchronize()
        step_s = (time.perf_counter() - t0) / steps
        stats = ex.memory_stats()
        final_loss = float(loss)
        del batches, opt
    finally:
        ex.close()
        gc.collect()
    return {"step_time_s": step_s, "images_per_s": batch / step_s, "warmup_s": warm_s,
            "peak_device_bytes": int(max(step_peaks)),
            "avg_feature_map_bytes": float(stats["avg_feature_map_bytes"]),
            "peak_feature_map_bytes": int(stats["peak_feature_map_bytes"]),
            "offloaded_bytes": int(stats["offloaded_bytes"]),
            "prefetched_bytes": int(stats["prefetched_bytes"]),
            "on_demand_fetches": int(stats["on_demand_fetches"]),
            "layout_bytes": stats.get("layout_bytes"),
            "workspace_fallbacks": [
                {"layer": layer, "op": op, "planned_workspace": f.chosen_workspace,
                 "ran_workspace": f.ran_workspace, "reason": f.reason}
                for (layer, op), f in fallbacks.items()],
            "fragmentation": float(stats["fragmentation"]), "loss": final_loss}


def bench_config(name: str, batch: int, args, device, out: Path, deadline: float) -> list:
    """Plan and run every policy of one (network, batch); returns one row per configuration."""
    from minidnn import kernels
    from minidnn.planner.profile import get_profile
    from minidnn.planner.search import InfeasibleBudgetError, Planner, plan_lookaheads
    net = models.build(name, num_classes=1000, image_size=args.image_size)
    relu_bits = relu_bits_for(net) if args.relu_bits else frozenset()
    mod = kernels.for_device(device)
    if hasattr(mod, "configure"):
        mod.configure(math=args.math, deterministic=False)
    t0 = time.perf_counter()
    prof = get_profile(net, batch, device, directory=out / "profiles",
                       log=lambda msg: print(msg, flush=True), relu_bits=relu_bits)
    print(f"{name} b{batch}: profile ready in {time.perf_counter() - t0:.1f} s", flush=True)
    profile_s = time.perf_counter() - t0
    # The synthetic source keeps its batches on a GPU (in the arena); on the CPU they are
    # host arrays outside it.
    inputs = 2 if device.is_gpu else 0
    # vDNN's policies at the executor's default prefetch lookahead (one layer); dyn as
    # `--policy dyn` runs it, choosing the lookahead too.
    planner = Planner(net, batch, prof, budget=args.budget, input_batches=inputs,
                      relu_bits=relu_bits)
    def plan_dyn(recompute: bool):
        """(PlanResult, lookahead) of dyn, or None when nothing fits."""
        try:
            return plan_lookaheads(net, batch, prof, args.budget, input_batches=inputs,
                                   recompute=recompute, relu_bits=relu_bits)
        except InfeasibleBudgetError as e:
            print(f"{name} b{batch}: no decision fits: {e}", flush=True)
            return None

    # dyn's plan; when it recomputes maps, also the plan with offload only (vDNN's own means),
    # so that the run measures what recomputation gains.
    dyn_plans = {"planned": plan_dyn(True)}
    if dyn_plans["planned"] and dyn_plans["planned"][0].best.recompute:
        dyn_plans["offload only"] = plan_dyn(False)
    rows = []
    for policy in args.policies:
        algos = list(dyn_plans) if policy == "dyn" else args.algos
        for algo in algos:
            row = {"network": name, "batch": batch, "image_size": net.input_shape[-1],
                   "policy": policy, "conv_plans": PLAN_LABELS[algo],
                   "budget_bytes": args.budget, "profile_s": profile_s}
            rows.append(row)
            if policy == "dyn":
                if dyn_plans[algo] is None:
                    least = fmt_bytes(planner.minimum_budget())
                    row["skipped"] = f"nothing fits (least budget {least})"
                    continue
                planned, lookahead = dyn_plans[algo]
                ev = planned.best
                decision = dataclasses.replace(ev.decision, prefetch_lookahead=lookahead)
                row["conv_plans"] = f"{PLAN_LABELS[algo]} (prefetch lookahead {lookahead})"
            else:
                ev = planner.baseline(policy, algo)
                decision = ev.decision
            row.update(planned_required_bytes=ev.required_bytes,
                       planned_region_bytes=ev.region_bytes,
                       planned_peak_bytes=ev.peak_bytes, planned_step_time_s=ev.step_time_s,
                       planned_compute_s=ev.compute_s,
                       planned_offloaded_bytes=ev.offloaded_bytes,
                       offload=planner.plan.tensor_names(ev.offload),
                       recompute=planner.plan.tensor_names(ev.recompute),
                       conv_algo=dict(ev.conv_algo))
            if not ev.fits:
                row["skipped"] = f"needs {fmt_bytes(ev.required_bytes)}, over the budget"
                continue
            if time.time() > deadline:
                row["skipped"] = "time limit"
                continue
            try:
                m = measure_run(net, batch, device, decision, args.budget, args.math,
                                args.warmup, args.steps, input_batches=max(inputs, 1),
                                relu_bits=args.relu_bits)
            except Exception as e:  # a failed configuration is a result; the others still run
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"{name} b{batch} {policy}/{algo}: FAILED {row['error']}", flush=True)
                continue
            row.update(m)
            # The planned compute with the bytes the run moved (on-demand fetches included).
            moved = dataclasses.replace(ev, offloaded_bytes=m["offloaded_bytes"],
                                        prefetched_bytes=m["prefetched_bytes"])
            row["bound_s"] = planner.model.lower_bound_s(moved)
            row["peak_error"] = ev.peak_bytes / m["peak_device_bytes"] - 1
            row["step_error"] = ev.step_time_s / m["step_time_s"] - 1
            print(f"{name} b{batch} {policy}/{algo}: {m['step_time_s'] * 1e3:.1f} ms "
                  f"(planned {ev.step_time_s * 1e3:.1f}), peak {fmt_bytes(m['peak_device_bytes'])}"
                  f" (planned {fmt_bytes(ev.peak_bytes)}), {m['images_per_s']:.0f} img/s"
                  + (f"; {len(m['workspace_fallbacks'])} convolutions ran a leaner plan than "
                     f"planned" if m["workspace_fallbacks"] else ""), flush=True)
            for f in m["workspace_fallbacks"]:
                print(f"    {f['layer']} {f['op']}: workspace {fmt_bytes(f['planned_workspace'])}"
                      f" -> {fmt_bytes(f['ran_workspace'])}: {f['reason']}", flush=True)
    return rows


# ---- PyTorch, in its own process ----------------------------------------------------------------
def torch_worker(argv: list) -> None:
    """--torch-worker NAME BATCH IMAGE MODE BUDGET WARMUP STEPS MATH: prints 'RESULT {json}'."""
    name, batch, image, mode, budget, warmup, steps, math = argv
    batch, image, warmup, steps = int(batch), int(image), int(warmup), int(steps)
    budget = None if budget == "none" else int(budget)
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_vs_pytorch import torch_training
    if budget is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(budget / total, 1.0))
    model, opt, x, labels = torch_training(name, batch, image, math, lr=1e-3, momentum=0.9,
                                           weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=False)
        if mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = F.cross_entropy(model(x), labels)
        else:
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    result = {"framework": "pytorch", "mode": mode, "budget_bytes": budget}
    try:
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / steps
        result.update(step_time_s=dt, images_per_s=batch / dt,
                      peak_device_bytes=int(torch.cuda.max_memory_allocated()),
                      peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                      loss=float(loss))
    except torch.cuda.OutOfMemoryError as e:
        result["error"] = f"out of memory{' under ' + fmt_bytes(budget) if budget else ''}: " \
                          f"{str(e).splitlines()[0]}"
    emit(result)


def run_torch(name: str, batch: int, image: int, mode: str, budget, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", name, str(batch),
           str(image), mode, "none" if budget is None else str(budget), str(args.warmup),
           str(args.steps), args.math]
    result, why = run_worker(cmd, args.torch_timeout)
    if result is None:
        return {"framework": "pytorch", "mode": mode, "budget_bytes": budget, "error": why}
    return result


def torch_rows(name: str, batch: int, image: int, args, deadline: float) -> list:
    rows = []
    for mode, cap in (("plain", None), ("save_on_cpu", args.budget), ("save_on_cpu", None)):
        if cap is None and mode == "save_on_cpu" and \
                "out of memory" not in rows[-1].get("error", ""):
            continue            # uncapped save_on_cpu only to show what a capped run lacked
        if time.time() + args.torch_timeout > deadline:
            rows.append({"framework": "pytorch", "mode": mode, "budget_bytes": cap,
                         "error": "skipped: time limit"})
            continue
        rows.append(run_torch(name, batch, image, mode, cap, args))
    for r in rows:
        r.update(network=name, batch=batch, image_size=image)
        cap = f" capped at {fmt_bytes(r['budget_bytes'])}" if r.get("budget_bytes") else ""
        what = f"pytorch {r['mode']}{cap}"
        if "error" in r:
            print(f"{what}: {r['error']}", flush=True)
        else:
            print(f"{what}: {r['step_time_s'] * 1e3:.1f} ms, peak "
                  f"{fmt_bytes(r['peak_device_bytes'])}", flush=True)
    return rows


# ---- output -------------------------------------------------------------------------------------
def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def markdown(results: dict) -> str:
    b = results["budget_bytes"]
    lines = [f"# vDNN_dyn benchmark on {results['device_name']}",
             "", f"Budget {fmt_bytes(b) if b else 'none'} for every minidnn run; "
             f"{results['warmup']} warm-up + {results['steps']} timed steps; math "
             f"{results['math']}; steady-state arena peak (after warm-up). 'planned' is the "
             f"model's prediction from the measured profile; error = planned / measured - 1; "
             f"bound = max(compute, bytes moved / measured bandwidth).", "",
             "| network | batch | policy | conv plans | needs (planned) | peak planned | "
             "peak measured | error | avg feature maps | step planned | step measured | error "
             "| images/s | bound | measured / bound | moved per step |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["minidnn"]:
        head = f"| {r['network']} | {r['batch']} | {r['policy']} | {r['conv_plans']} | "
        need = fmt_bytes(r["planned_required_bytes"]) if "planned_required_bytes" in r else "-"
        if "skipped" in r or "error" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
            lines.append(head + f"{need} | | | | | | | | | | | {why} |")
            continue
        moved = r["offloaded_bytes"] + r["prefetched_bytes"]
        lines.append(
            head + f"{need} | {fmt_bytes(r['planned_peak_bytes'])} | "
            f"{fmt_bytes(r['peak_device_bytes'])} | {_pct(r['peak_error'])} | "
            f"{fmt_bytes(r['avg_feature_map_bytes'])} | {r['planned_step_time_s'] * 1e3:.1f} ms | "
            f"{r['step_time_s'] * 1e3:.1f} ms | {_pct(r['step_error'])} | "
            f"{r['images_per_s']:.0f} | {r['bound_s'] * 1e3:.1f} ms | "
            f"{r['step_time_s'] / r['bound_s']:.2f} | {fmt_bytes(moved)} |")
    if results.get("pytorch"):
        lines += ["", "## Against PyTorch", "",
                  "| framework | configuration | step | images/s | peak |",
                  "|---|---|---:|---:|---:|"]
        for r in results["minidnn"]:
            if r["network"] == results["torch_network"] and r["batch"] == results["torch_batch"] \
                    and "step_time_s" in r:
                lines.append(f"| minidnn | {r['policy']}, {r['conv_plans']} plans, budget "
                             f"{fmt_bytes(r['budget_bytes'])} | {r['step_time_s'] * 1e3:.1f} ms | "
                             f"{r['images_per_s']:.0f} | {fmt_bytes(r['peak_device_bytes'])} |")
        for r in results["pytorch"]:
            cap = f", capped at {fmt_bytes(r['budget_bytes'])}" if r.get("budget_bytes") else ""
            if "error" in r:
                lines.append(f"| pytorch | {r['mode']}{cap} | {r['error']} | | |")
            else:
                lines.append(f"| pytorch | {r['mode']}{cap} | {r['step_time_s'] * 1e3:.1f} ms | "
                             f"{r['images_per_s']:.0f} | {fmt_bytes(r['peak_device_bytes'])} |")
    return "\n".join(lines) + "\n"


def figure(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = []
    for r in results["minidnn"]:
        key = f"{r['network']} b{r['batch']}"
        if key not in groups:
            groups.append(key)
    fig, axes = plt.subplots(2, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 7.5),
                             squeeze=False)
    for col, key in enumerate(groups):
        rows = [r for r in results["minidnn"] if f"{r['network']} b{r['batch']}" == key]
        short = {"fastest": "fast", "memory-optimal": "mem-opt",
                 "planned, offload only": "offload only"}
        plans = [r["conv_plans"].split(" (")[0] for r in rows]
        labels = [f"{r['policy']}\n{short.get(p, p)}" for r, p in zip(rows, plans)]
        x = range(len(rows))
        gib = 2**30
        ax = axes[0][col]
        ax.bar([i - 0.2 for i in x], [r.get("peak_device_bytes", 0) / gib for r in rows], 0.4,
               label="peak (arena)")
        ax.bar([i + 0.2 for i in x], [r.get("avg_feature_map_bytes", 0) / gib for r in rows],
               0.4, label="average feature maps")
        ax.scatter(list(x), [r.get("planned_required_bytes", 0) / gib for r in rows],
                   marker="_", s=300, color="k", label="planned need", zorder=3)
        ax.set_title(key)
        ax.set_ylabel("GiB")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax = axes[1][col]
        ax.bar(list(x), [r.get("images_per_s", 0) for r in rows], 0.6, color="tab:green",
               label="measured")
        ax.scatter(list(x), [r["batch"] / r["planned_step_time_s"]
                             if r.get("planned_step_time_s") else 0 for r in rows],
                   marker="_", s=300, color="k", label="planned", zorder=3)
        ax.set_ylabel("images/s")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        for i, r in enumerate(rows):
            if "skipped" in r or "error" in r:
                axes[0][col].text(i, 0, "skipped" if "skipped" in r else "failed",
                                  rotation=90, ha="center", va="bottom", fontsize=7)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    b = results["budget_bytes"]
    fig.suptitle(f"minidnn memory policies on {results['device_name']}"
                 f"{', budget ' + fmt_bytes(b) if b else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench_dyn", help="output folder")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="model:batch,... ")
    p.add_argument("--policies", default="none,conv,all,dyn")
    p.add_argument("--algos", default="fastest,min_workspace",
                   help="conv plans for none/conv/all (dyn chooses its own)")
    p.add_argument("--budget", default="12GiB", help="memory budget of every minidnn run "
                   "('none': the whole device)")
    p.add_argument("--image-size", type=int, default=None, help="default: each model's own")
    p.add_argument("--math", choices=MATH_MODES, default="tf32")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--time-limit", type=float, default=500.0,
                   help="seconds after which remaining configurations are skipped")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--relu-bits", action="store_true",
                   help="ReLUs whose output no other layer keeps keep one bit per value")
    p.add_argument("--torch-config", default="vgg16:256", help="model:batch run in PyTorch")
    p.add_argument("--torch-timeout", type=int, default=120)
    args = p.parse_args(argv)
    args.budget = None if args.budget == "none" else parse_bytes(args.budget)
    args.policies = [s for s in args.policies.split(",") if s]
    args.algos = [s for s in args.algos.split(",") if s]
    args.configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",") if c]
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--torch-worker":
        torch_worker(argv[1:])
        return 0
    args = parse_args(argv)
    started = time.time()
    deadline = started + args.time_limit
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = select_device(args.device)
    results = {"device_name": device.name, "device": device.kind, "budget_bytes": args.budget,
               "math": args.math, "warmup": args.warmup, "steps": args.steps,
               "minidnn": [], "pytorch": []}
    t_name, t_batch = args.torch_config.split(":")
    results["torch_network"], results["torch_batch"] = t_name, int(t_batch)
    torch_done = args.no_torch or not device.is_gpu
    for name, batch in args.configs:
        if time.time() > deadline:
            results["minidnn"].append({"network": name, "batch": batch, "policy": "-",
                                       "conv_plans": "-", "skipped": "time limit"})
            continue
        results["minidnn"] += bench_config(name, batch, args, device, out, deadline)
        if not torch_done and (name, batch) == (t_name, int(t_batch)):
            image = args.image_size or models.native_image_size(name)
            results["pytorch"] = torch_rows(name, batch, image, args, deadline + 60)
            torch_done = True
        (out / "bench_dyn.json").write_text(json.dumps(results, indent=1))
    results["wall_s"] = time.time() - started
    (out / "bench_dyn.json").write_text(json.dumps(results, indent=1))
    (out / "bench_dyn.md").write_text(markdown(results))
    figure(results, out / "bench_dyn.png")
    print(markdown(results))
    print(f"wrote {out / 'bench_dyn.md'}, {out / 'bench_dyn.json'}, {out / 'bench_dyn.png'} "
          f"in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
