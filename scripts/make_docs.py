#!/usr/bin/env python3
"""Every figure and every CPU-reproducible number of docs/memory-virtualization.md, made again
at the current commit, on any machine (about a minute on a laptop CPU; no GPU):

    python3 scripts/make_docs.py                 # writes docs/numbers.json, docs/figures/*.png
                                                 # and docs/plan_vgg16_b256_12GiB.txt

The numbers come from dry runs of the memory manager (Executor(..., compute=False), what
`scripts/bench_memory.py --dry` prints), from the step-time model (planner/step_model.py) on the
analytic GPU models (`--gpu k40|h200`) and on the shipped profile measured on an H200
(benchmarks/profiles/vgg16-b256-h200.json), and from that profile's plan tables. Each is
written into docs/numbers.json as the text the tutorial quotes; tests/test_docs.py checks that
the tutorial quotes each one and that the fast ones still come out the same. Numbers measured
on a GPU (benchmarks/RESULTS.md) are not made here; one figure of the splitting chapter is drawn
from a measured run's committed JSON (budget_figure).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from minidnn import models  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.errors import fmt_bytes, parse_bytes  # noqa: E402
from minidnn.memory.policy import relu_bits_for  # noqa: E402

DOCS = ROOT / "docs"
PROFILE = ROOT / "benchmarks" / "profiles" / "vgg16-b256-h200.json"
COMMAND = "python3 scripts/make_docs.py"
BATCH = 256
BUDGET = "12GiB"


def commit() -> str:
    """The commit the numbers are made at ('+' when the work tree has changes)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = git("status", "--porcelain", "--", "minidnn", "scripts").strip()
    return head + ("+" if dirty else "")


def vgg16():
    return models.build("vgg16", num_classes=1000, image_size=224)


def dry_step(net, policy: str, lookahead: int = 1, relu_bits: bool = False) -> dict:
    """One training step walked through the memory manager without compute (bench_memory
    --dry): its memory_stats, and the executor's manager log."""
    with build_executor(net, BATCH, device="cpu", policy=policy, compute=False,
                        prefetch_lookahead=lookahead, relu_bits=relu_bits) as ex:
        stats = ex.simulate_step()
        stats["fetches"] = prefetch_windows(ex)
    return stats


def prefetch_windows(ex) -> list:
    """[(backward call that issued it, [maps fetched])] of the dry step just walked."""
    plan, out = ex.plan, {}
    for time, what, sid in ex.manager.log:
        if what == "fetch" and time >= plan.num_nodes:
            name = plan.nodes[plan.node_at(time)].name
            out.setdefault(name, []).append(plan.storages[sid].tensors[0])
    return list(out.items())


def gib(n) -> str:
    return f"{n / 2**30:.2f} GiB"


def ms(seconds, digits: int = 2) -> str:
    return f"{seconds * 1e3:.{digits}f} ms"


def mib(n) -> str:
    return f"{n / 2**20:.0f} MiB"


# ---- the numbers ---------------------------------------------------------------------------------
def fast_numbers() -> dict:
    """The numbers that take seconds: dry runs, step-model evaluations, profile tables.
    {key: (text as quoted, what it is)}."""
    from minidnn.planner import StepModel, analytic_profile, load_profile
    n = {}
    net = vgg16()
    none, all_, conv = (dry_step(net, p) for p in ("none", "all", "conv"))
    params = sum(int(np.prod(p.shape)) for _, p in net.parameters())
    pbytes = params * 4
    n["network_wide"] = (gib(none["network_wide_bytes"]), "network-wide allocation, b256")
    n["liveness_peak"] = (gib(none["liveness_peak_bytes"]), "liveness peak of feature maps")
    n["params"] = (f"{params / 1e6:.0f} M", "parameters")
    n["param_bytes"] = (gib(pbytes), "parameter bytes")
    n["param_state_bytes"] = (gib(3 * pbytes), "parameters, gradients and momentum")
    n["none_avg"] = (gib(none["avg_feature_map_bytes"]), "average feature maps, none")
    n["all_peak"] = (gib(all_["peak_feature_map_bytes"]), "peak feature maps, all")
    n["all_avg"] = (gib(all_["avg_feature_map_bytes"]), "average feature maps, all")
    n["all_moved"] = (gib(all_["offloaded_bytes"]), "bytes offloaded per step, all")
    n["cpu_ram_all"] = (gib(parse_bytes(BUDGET) + all_["offloaded_bytes"]),
                        f"on the CPU: a {BUDGET} arena and the host slab of all's offloads")
    n["conv_avg"] = (gib(conv["avg_feature_map_bytes"]), "average feature maps, conv")
    n["conv_moved"] = (gib(conv["offloaded_bytes"]), "bytes offloaded per step, conv")
    bits = relu_bits_for(net)
    n["bits_none_peak"] = (gib(dry_step(net, "none", relu_bits=True)["peak_feature_map_bytes"]),
                           "peak feature maps with ReLU bits, none")
    n["bits_all_moved"] = (gib(dry_step(net, "all", relu_bits=True)["offloaded_bytes"]),
                           "bytes offloaded per step with ReLU bits, all")
    windows = {}
    for la in (0, 1, 2):
        st = dry_step(net, "all", lookahead=la)
        windows[la] = dict(st["fetches"])
        n[f"lookahead{la}_peak"] = (gib(st["peak_feature_map_bytes"]),
                                    f"peak feature maps, all, lookahead {la}")
        n[f"lookahead{la}_on_demand"] = (str(st["on_demand_fetches"]),
                                         f"on-demand fetches, all, lookahead {la}")
    n["prefetch_table"] = (window_table(windows), "what backward fetches where, per lookahead")
    # The step-time model: what the step needs without offload, and compute on each GPU.
    h200 = StepModel(net, BATCH, analytic_profile(net, BATCH, "h200")).evaluate(set())
    k40 = StepModel(net, BATCH, analytic_profile(net, BATCH, "k40")).evaluate(set())
    h200_fp32 = StepModel(net, BATCH, analytic_profile(net, BATCH, "h200", math="fp32"))
    h200_bits = StepModel(net, BATCH, analytic_profile(net, BATCH, "h200", relu_bits=bits),
                          relu_bits=bits).evaluate(set())
    n["h200_none_needs"] = (gib(h200.required_bytes), "step without offload, H200 model")
    n["h200_bits_none_needs"] = (gib(h200_bits.required_bytes),
                                 "step without offload with ReLU bits, H200 model")
    n["k40_compute"] = (ms(k40.compute_s, 0), "compute of a step, K40 model")
    n["h200_compute"] = (ms(h200.compute_s, 1), "compute of a step, H200 model (TF32)")
    n["k40_over_h200"] = (f"{k40.compute_s / h200.compute_s:.0f}x", "K40 / H200 compute, TF32")
    n["k40_over_h200_fp32"] = (f"{k40.compute_s / h200_fp32.evaluate(set()).compute_s:.0f}x",
                               "K40 / H200 compute, both FP32")
    k40p, h200p = analytic_profile(net, BATCH, "k40"), analytic_profile(net, BATCH, "h200")
    n["pcie_ratio"] = (f"{h200p.d2h_bw / k40p.d2h_bw:.1f}x", "H200 / K40 copy bandwidth")
    # The shipped profile (measured on an H200, ReLU bits on).
    prof = load_profile(str(PROFILE))
    measured = StepModel(net, BATCH, prof, relu_bits=bits).evaluate(set())
    n["measured_bits_none_needs"] = (gib(measured.required_bytes),
                                     "step without offload, ReLU bits, measured profile")
    c21, c12, c11 = prof.layer("conv2_1"), prof.layer("conv1_2"), prof.layer("conv1_1")
    for key, cost, phase in (("conv2_1_fwd", c21, "forward"), ("conv1_2_bwd", c12, "backward")):
        order = sorted(cost.settings(), key=lambda s: cost.time(phase, s))
        fastest, mem = order[0], "min_workspace"
        middle = min((s for s in order if 0 < cost.workspace(phase, s)
                      < cost.workspace(phase, fastest)), key=lambda s: cost.time(phase, s))
        for tag, s in (("fastest", fastest), ("middle", middle), ("min", mem)):
            n[f"{key}_{tag}_ms"] = (ms(cost.time(phase, s)), f"{key}, {tag} plan time")
            if tag != "min":
                w = cost.workspace(phase, s)
                n[f"{key}_{tag}_ws"] = (gib(w) if w >= 2**30 else mib(w),
                                        f"{key}, {tag} plan workspace")
    from minidnn.memory.plan import LivenessPlan
    out_bytes = LivenessPlan(net, BATCH).storage_of("conv1_1").nbytes
    n["conv1_1_fwd"] = (ms(c11.time("forward")), "conv1_1 forward, measured profile")
    n["conv1_1_out"] = (gib(out_bytes), "conv1_1's output")
    n["conv1_1_copy"] = (ms(out_bytes / prof.d2h_bw, 1), "conv1_1's output copied one way")
    n["all_copy_floor"] = (ms(all_["offloaded_bytes"] / prof.d2h_bw +
                              all_["prefetched_bytes"] / prof.h2d_bw, 0),
                           "all: bytes out and back at the measured bandwidths")
    return n


# The backward calls of VGG-16's third block, in the order backward runs them.
WINDOW_CALLS = ("conv4_1", "pool3", "relu3_3", "conv3_3", "relu3_2", "conv3_2", "relu3_1",
                "conv3_1", "pool2")


def window_table(windows: dict) -> str:
    """A markdown table: per backward call of the third block, the offloaded maps fetched
    before its kernels, at each lookahead ({lookahead: {call: [maps]}})."""
    looks = sorted(windows)
    lines = ["| backward of | " + " | ".join(f"lookahead {la}" for la in looks) + " |",
             "| --- |" + " --- |" * len(looks)]
    for call in WINDOW_CALLS:
        cells = [", ".join(f"`{m}`" for m in windows[la].get(call, [])) or "-" for la in looks]
        lines.append(f"| {call} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plan(*argv) -> dict:
    """make_plan of `minidnn plan ARGV` (the dict behind its printout)."""
    from minidnn.cli import build_parser
    from minidnn.planner.command import make_plan
    args = build_parser().parse_args(["plan", *argv])
    return make_plan(args)


def plan_numbers(stamp: str) -> dict:
    """The numbers of the step model's plans (seconds each): vDNN_all on the K40 and the H200
    models, and dyn for VGG-16 b256 in 12 GiB on the shipped profile."""
    from minidnn.planner.command import format_plan
    from minidnn.planner.timeline import draw_bytes_chart, draw_timeline, stall_seconds
    n = {}
    base = ["--model", "vgg16", "--batch", str(BATCH), "--policy", "all"]
    k40, h200 = plan(*base, "--gpu", "k40"), plan(*base, "--gpu", "h200")
    for tag, p in (("k40", k40), ("h200", h200)):
        n[f"all_{tag}_step"] = (ms(p["plan"]["step_time_s"], 0), f"all, {tag} model: step")
        n[f"all_{tag}_stall"] = (ms(stall_seconds(p["timeline"]), 0),
                                 f"all, {tag} model: compute stalled")
    cmd = f"minidnn plan {' '.join(base)} --gpu k40|h200 --timeline FILE.png"
    draw_timeline([k40, h200], DOCS / "figures" / "timeline_vgg16_b256_all_k40_h200.png",
                  caption=f"{cmd}; made by {COMMAND} at {stamp}")
    # One pass, no layer chunks: the chapter on reading a plan shows offload, recomputation
    # and convolution plans at work (split into micro-batches or chunks, this step moves far
    # less: the splitting chapter)
    dyn_args = ["--model", "vgg16", "--batch", str(BATCH), "--memory-budget", BUDGET,
                "--relu-bits", "--micro-batches", "1", "--chunks", "none", "--profile",
                str(PROFILE.relative_to(ROOT))]
    dyn = plan(*dyn_args)
    (DOCS / "plan_vgg16_b256_12GiB.txt").write_text(
        f"$ minidnn plan {' '.join(dyn_args)}\n{format_plan(dyn)}\n")
    draw_bytes_chart(dyn, DOCS / "figures" / "bytes_vgg16_b256_dyn_12GiB.png",
                     caption=f"minidnn plan {' '.join(dyn_args)} --bytes-chart FILE.png; made "
                             f"by {COMMAND} at {stamp}")
    p = dyn["plan"]
    n["dyn_step"] = (ms(p["step_time_s"], 1), "dyn plan, 12 GiB, measured profile: step")
    n["dyn_peak"] = (gib(p["peak_device_bytes"]), "dyn plan: peak")
    n["dyn_lookahead"] = (str(dyn["prefetch_lookahead"]), "dyn plan: lookahead chosen")
    n["dyn_minimum"] = (fmt_bytes(dyn["minimum_budget_bytes"]), "dyn plan: least budget")
    return n


# ---- the memory figure ---------------------------------------------------------------------------
def memory_figure(path: Path, stamp: str) -> None:
    """Feature maps (top) and everything on the device (bottom) per layer call of one
    VGG-16 b256 step under none, conv and all, on one x-axis, with the 12 GiB budget."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from minidnn.planner import StepModel, analytic_profile
    net = vgg16()
    # Blocks allocated as calls need them (no static layout), so that the levels move.
    model = StepModel(net, BATCH, analytic_profile(net, BATCH, "h200"), static_layout=False)
    policies = {"none": frozenset(), "conv": None, "all": None}
    for name in ("conv", "all"):
        with build_executor(net, BATCH, device="cpu", policy=name, compute=False) as ex:
            policies[name] = ex.decision.offload
    calls = sorted(model.evaluate(set()).fm_levels,
                   key=lambda k: (k[0] != "forward", -k[1] if k[0] != "forward" else k[1]))
    xs = range(len(calls))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 6.5), sharex=True)
    colours = {"none": "tab:red", "conv": "tab:green", "all": "tab:blue"}
    for name, offload in policies.items():
        ev = model.evaluate(offload)
        moved = f", {gib(ev.offloaded_bytes)} offloaded" if ev.offloaded_bytes else ""
        top.step(xs, [ev.fm_levels[c] / 2**30 for c in calls], where="post",
                 color=colours[name], label=f"{name}: peak {gib(max(ev.fm_levels.values()))}"
                                            f"{moved}")
        bottom.step(xs, [ev.levels[c] / 2**30 for c in calls], where="post",
                    color=colours[name], label=f"{name}: needs {gib(ev.required_bytes)}")
    budget = parse_bytes(BUDGET) / 2**30
    bottom.axhline(budget, color="k", ls="--", lw=1, label=f"budget {BUDGET}")
    params = model.param_grad_bytes + model.extra_bytes
    bottom.axhline(params / 2**30, color="0.5", ls=":", lw=1,
                   label=f"parameters, gradients, momentum, inputs ({gib(params)})")
    top.set_ylabel("feature maps on the device (GiB)")
    bottom.set_ylabel("everything on the device (GiB)")
    for ax in (top, bottom):
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        n_fwd = sum(1 for c in calls if c[0] == "forward")
        ax.axvspan(0, n_fwd, color="tab:blue", alpha=0.05, lw=0)
    named = [k for k, c in enumerate(calls) if net.nodes[c[1]].layer.kind in ("conv", "pool")
             or net.nodes[c[1]].name.startswith("fc")]
    bottom.set_xticks(named)
    bottom.set_xticklabels([f"{'' if calls[k][0] == 'forward' else 'b:'}"
                            f"{net.nodes[calls[k][1]].name}" for k in named],
                           rotation=90, fontsize=6)
    bottom.set_xlabel("layer call (forward, shaded, then backward 'b:'); conv, pool and fc "
                      "layers named")
    top.set_title(f"VGG-16 b{BATCH}: memory per layer call under none, vDNN_conv and vDNN_all "
                  f"(step model, H200 workspaces, blocks allocated at run time)", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.text(0.01, 0.005, f"made by {COMMAND} at {stamp}", fontsize=7, color="0.3")
    fig.savefig(path, dpi=120)
    plt.close(fig)


BUDGET_RUN = ROOT / "benchmarks" / "runs" / "2ce5c86-1d68ad8" / "call4-1d68ad8" / "vgg16_caps.json"


def budget_figure(path: Path, run: Path = BUDGET_RUN) -> None:
    """Images/s of VGG-16 b256 under each cap, minidnn's dyn plan beside PyTorch's
    configurations, from a measured run's JSON (scripts/bench_budget.py --out; a GPU
    measurement committed under benchmarks/runs/, drawn here, not measured here)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = json.loads(run.read_text())
    caps = list(data["caps"])
    fig, axes = plt.subplots(1, len(caps), figsize=(5.2 * len(caps), 2.8), sharex=True)
    for ax, cap in zip(np.atleast_1d(axes), caps):
        labels, rates, colours = [], [], []
        for r in data["caps"][cap]:
            k = r.get("micro_batches") if r["framework"] == "minidnn" else r["accumulate"]
            split = f"{k} x {data['batch'] // k}" if k and k > 1 else "one pass"
            if r["framework"] == "minidnn":
                what = "dyn" if r.get("cap") else "no budget"
                labels.append(f"minidnn {what}: {split}")
                colours.append("tab:blue")
            else:
                how = f"accumulation {split}" if k > 1 else "plain step"
                labels.append(f"PyTorch {r['layout']}, {how}")
                colours.append("tab:orange")
            rates.append(r.get("images_per_s") or 0.0)
        ys = range(len(labels))
        ax.barh(ys, rates, color=colours)
        for y, rate in zip(ys, rates):
            ax.text(rate + 20, y, f"{rate:.0f}" if rate else "out of memory", va="center",
                    fontsize=8)
        ax.set_yticks(list(ys))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"cap {cap}", fontsize=9)
        ax.set_xlabel("images/s")
    fig.suptitle(f"{data['model']} b{data['batch']} {data['math']} on the {data['device_name']},"
                 f" measured ({run.relative_to(ROOT)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


CAPTION = re.compile(r"(`python3 scripts/make_docs.py` at commit )([0-9a-f]+\+?)")


def stamp_captions(path: Path, stamp: str) -> None:
    """Put the commit the figures were made at into their captions in the tutorial."""
    text = path.read_text()
    path.write_text(CAPTION.sub(lambda m: m.group(1) + stamp, text))


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    stamp = commit()
    (DOCS / "figures").mkdir(parents=True, exist_ok=True)
    numbers = fast_numbers()
    numbers.update(plan_numbers(stamp))
    memory_figure(DOCS / "figures" / "memory_vgg16_b256.png", stamp)
    budget_figure(DOCS / "figures" / "split_vgg16_b256_caps_h200.png")
    out = {"commit": stamp, "command": COMMAND,
           "numbers": {k: {"text": t, "what": w} for k, (t, w) in sorted(numbers.items())}}
    (DOCS / "numbers.json").write_text(json.dumps(out, indent=1) + "\n")
    stamp_captions(DOCS / "memory-virtualization.md", stamp)
    print(f"docs/numbers.json: {len(numbers)} numbers at {stamp}; figures in docs/figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
