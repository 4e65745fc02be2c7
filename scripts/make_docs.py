#!/usr/bin/env python3
"""Every number of README.md and docs/*.md that a CPU can make, made again at the current
commit, and written into the pages (a few seconds on a laptop; no GPU):

    python3 scripts/make_docs.py            # the pages' numbers, docs/numbers.json, the figures
    python3 scripts/make_docs.py --check    # only say which quoted numbers differ (exit 1)

A page names each number it quotes with a marker that renders as nothing:

    the step takes <!--n:dyn_step-->241.0 ms<!--/n--> ...

and a longer piece (a table, a printout inside a code fence) between two marker lines:

    <!--block:plan_excerpt-->
    ...
    <!--/block-->

This script computes every key, replaces what stands between the markers with the text it
computes now, writes all of them into docs/numbers.json, and draws the figures.
tests/test_docs.py computes them again and fails, naming this command, when a page quotes a
number the code no longer computes: a change that moves a number cannot pass CI until the
pages are made again.

Where the numbers come from: dry runs of the memory manager (`build_executor(...,
compute=False)`, what `scripts/bench_memory.py --dry` prints); `minidnn plan ... --json` (the
step model on the analytic GPU models `--gpu k40|h200` and on the shipped profile measured on
an H200, benchmarks/profiles/vgg16-b256-h200.json); the shipped profile's plan tables; the
walk-through's network (scripts/walkthrough.py). Numbers measured on a GPU are not made here:
the pages quote them from benchmarks/RESULTS.md and the run records under benchmarks/runs/.
docs/glossary.md defines the terms (needs, peak, least budget, bound, ...).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from minidnn import models  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.errors import fmt_bytes, parse_bytes  # noqa: E402

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
PROFILE = "benchmarks/profiles/vgg16-b256-h200.json"
COMMAND = "python3 scripts/make_docs.py"
BATCH = 256
BUDGET = "12GiB"
# The one-pass plan the tutorial reads (section 6): the whole batch, no layer chunks.
ONE_PASS = ["--model", "vgg16", "--batch", str(BATCH), "--memory-budget", BUDGET,
            "--relu-bits", "--micro-batches", "1", "--chunks", "none", "--profile", PROFILE]
# dyn with every option open (the splitting chapter): micro-batch counts and chunks weighed.
SPLIT = ["--model", "vgg16", "--batch", str(BATCH), "--relu-bits", "--profile", PROFILE]
COUNTS = (1, 2, 4, 8, 16, 32, 64)


def commit() -> str:
    """The commit the numbers are made at ('+' when the work tree has changes)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = git("status", "--porcelain", "--", "minidnn", "scripts").strip()
    return head + ("+" if dirty else "")


def vgg16():
    return models.build("vgg16", num_classes=1000, image_size=224)


def parameter_count(net) -> int:
    """How many values the network's parameters hold."""
    return sum(int(np.prod(p.shape)) for _, p in net.parameters())


def gib(n) -> str:
    return f"{n / 2**30:.2f} GiB"


def ms(seconds, digits: int = 2) -> str:
    return f"{seconds * 1e3:.{digits}f} ms"


def mib(n) -> str:
    return f"{n / 2**20:.0f} MiB"


def gbps(bytes_per_s) -> str:
    return f"{bytes_per_s / 1e9:.0f} GB/s"


# ---- the entry points the numbers come from ------------------------------------------------------
@functools.lru_cache(maxsize=None)
def minidnn(*argv) -> str:
    """What `minidnn ARGV` prints (stdout), run in this process (once per ARGV: the pages ask
    for some plans more than once); RuntimeError with its stderr when it fails."""
    from minidnn.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    if status:
        raise RuntimeError(f"minidnn {' '.join(map(str, argv))}: {err.getvalue().strip()}")
    return out.getvalue()


def plan(*argv) -> dict:
    """`minidnn plan ARGV --json`: the plan as the command prints it."""
    return json.loads(minidnn("plan", *argv, "--json"))


def dry_step(net, policy: str, lookahead: int = 1, relu_bits: bool = False,
             precision: str = "fp32") -> dict:
    """One training step walked through the memory manager without compute (bench_memory
    --dry): its memory_stats, and which maps backward fetched where."""
    with build_executor(net, BATCH, device="cpu", policy=policy, compute=False,
                        prefetch_lookahead=lookahead, relu_bits=relu_bits,
                        precision=precision) as ex:
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


# ---- the numbers ---------------------------------------------------------------------------------
def memory_numbers() -> dict:
    """Dry runs of the memory manager and the shipped profile's tables (seconds).
    {key: (text as quoted, what it is)}."""
    from minidnn.planner import load_profile
    n = {}
    net = vgg16()
    none, all_, conv = (dry_step(net, p) for p in ("none", "all", "conv"))
    params = parameter_count(net)
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
    bf16_none, bf16_all = (dry_step(net, p, precision="bf16") for p in ("none", "all"))
    n["bf16_network_wide"] = (gib(bf16_none["network_wide_bytes"]),
                              "network-wide allocation, bf16 maps")
    n["bf16_liveness_peak"] = (gib(bf16_none["liveness_peak_bytes"]),
                               "liveness peak, bf16 maps")
    n["bf16_all_moved"] = (gib(bf16_all["offloaded_bytes"]), "bytes offloaded per step, all, bf16")
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
    # The shipped profile (measured on an H200): its plan tables, conv1_1's costs.
    prof = load_profile(str(ROOT / PROFILE))
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
    out_bytes = next(r for r in plan(*ONE_PASS)["layers"] if r["layer"] == "conv1_1")["bytes"]
    n["conv1_1_fwd"] = (ms(c11.time("forward")), "conv1_1 forward, measured profile")
    n["conv1_1_out"] = (gib(out_bytes), "conv1_1's output")
    n["conv1_1_copy"] = (ms(out_bytes / prof.d2h_bw, 1), "conv1_1's output copied one way")
    n["all_copy_floor"] = (ms(all_["offloaded_bytes"] / prof.d2h_bw +
                              all_["prefetched_bytes"] / prof.h2d_bw, 0),
                           "all: bytes out, then back, one direction at a time, measured "
                           "bandwidths")
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


def model_numbers() -> dict:
    """The step model through `minidnn plan --json` (a second or two each): vDNN's policies on
    the K40 and H200 models, what the step needs without offload, the bound."""
    n = {}
    base = ["--model", "vgg16", "--batch", str(BATCH)]
    none = {g: plan(*base, "--policy", "none", "--gpu", g) for g in ("k40", "h200")}
    fp32 = plan(*base, "--policy", "none", "--gpu", "h200", "--math", "fp32")
    bits = plan(*base, "--policy", "none", "--gpu", "h200", "--relu-bits")
    measured = plan(*base, "--policy", "none", "--relu-bits", "--profile", PROFILE)
    n["h200_none_needs"] = (gib(none["h200"]["plan"]["required_bytes"]),
                            "needs: step without offload, H200 model")
    n["h200_bits_none_needs"] = (gib(bits["plan"]["required_bytes"]),
                                 "needs: step without offload with ReLU bits, H200 model")
    n["measured_bits_none_needs"] = (gib(measured["plan"]["required_bytes"]),
                                     "needs: step without offload, ReLU bits, measured profile")
    k40_s = none["k40"]["plan"]["compute_time_s"]
    h200_s = none["h200"]["plan"]["compute_time_s"]
    n["k40_compute"] = (ms(k40_s, 0), "compute of a step, K40 model")
    n["h200_compute"] = (ms(h200_s, 1), "compute of a step, H200 model (TF32)")
    n["k40_over_h200"] = (f"{k40_s / h200_s:.0f}x", "K40 / H200 compute, TF32")
    n["k40_over_h200_fp32"] = (f"{k40_s / fp32['plan']['compute_time_s']:.0f}x",
                               "K40 / H200 compute, both FP32")
    bw = {g: p["bandwidth"] for g, p in none.items()}
    n["pcie_ratio"] = (f"{bw['h200']['d2h'] / bw['k40']['d2h']:.1f}x",
                       "H200 / K40 copy bandwidth, one way")
    n["h200_one_way"] = (gbps(bw["h200"]["d2h"]), "H200 model: pinned copies, each way alone")
    n["h200_duplex"] = (gbps(bw["h200"]["duplex"]), "H200 model: both ways at once, in total")
    for gpu in ("k40", "h200"):
        p = plan(*base, "--policy", "all", "--gpu", gpu)
        stall = sum(c["stall"] for c in p["timeline"]["calls"])
        n[f"all_{gpu}_step"] = (ms(p["plan"]["step_time_s"], 0), f"all, {gpu} model: step")
        n[f"all_{gpu}_stall"] = (ms(stall, 0), f"all, {gpu} model: compute stalled")
    n["all_h200_bound"] = (ms(p["plan"]["lower_bound_s"], 1), "all, h200 model: the bound")
    n["all_h200_one_way"] = (ms(p["plan"]["offloaded_bytes"] / bw["h200"]["d2h"], 0),
                             "all, h200 model: the offloads alone at one way's bandwidth")
    bf16 = plan(*base, "--policy", "all", "--gpu", "h200", "--precision", "bf16")
    n["bf16_all_one_way"] = (ms(bf16["plan"]["offloaded_bytes"] / bw["h200"]["d2h"], 0),
                             "all, bf16 maps, H200 model: offloads alone at one way's bandwidth")
    return n


def excerpt(printout: str) -> str:
    """The lines of a plan printout the tutorial quotes: the header, the table's first rows to
    conv2_1 and its last two, the summary and the alternatives (the rest elided as '...')."""
    lines = printout.rstrip("\n").splitlines()
    rule = [k for k, line in enumerate(lines) if line.startswith("-----")]
    table = lines[rule[0] + 1:rule[1]]
    first = next(k for k, line in enumerate(table) if line.startswith("conv2_1 "))
    tail = [line for line in lines[rule[1]:] if not line.startswith(("note: measured in",
                                                                     "note: generator_bytes"))]
    return "\n".join(lines[:rule[0] + 1] + table[:first + 1] + ["..."] + table[-2:] + tail)


def plan_numbers() -> dict:
    """The one-pass plan of VGG-16 b256 in 12 GiB on the shipped profile (the tutorial's
    worked plan, section 6): its printout and what the text says of it."""
    n = {}
    printout = minidnn("plan", *ONE_PASS)
    n["plan_printout"] = (f"$ minidnn plan {' '.join(ONE_PASS)}\n{printout}",
                          "the worked plan, printed")
    n["plan_excerpt"] = (fenced(f"$ minidnn plan {' '.join(ONE_PASS[:-4])} \\\n    "
                                f"{' '.join(ONE_PASS[-4:])}\n{excerpt(printout)}"),
                         "the worked plan, as the tutorial quotes it")
    dyn = plan(*ONE_PASS)
    p = dyn["plan"]
    n["dyn_step"] = (ms(p["step_time_s"], 1), "worked plan: step time")
    n["dyn_compute"] = (ms(p["compute_time_s"], 1), "worked plan: compute alone")
    n["dyn_bound"] = (ms(p["lower_bound_s"], 1), "worked plan: the bound")
    n["dyn_peak"] = (gib(p["peak_device_bytes"]), "worked plan: peak")
    n["dyn_needs"] = (gib(p["required_bytes"]), "worked plan: needs")
    n["dyn_lookahead"] = (str(dyn["prefetch_lookahead"]), "worked plan: lookahead chosen")
    n["dyn_minimum"] = (fmt_bytes(dyn["minimum_budget_bytes"]), "worked plan: least budget")
    rows = dyn["layers"]
    n["dyn_offloaded"] = (names(r["layer"] for r in rows if r["status"].startswith("offload")),
                          "worked plan: the maps offloaded")
    n["dyn_recomputed"] = (names(r["layer"] for r in rows if r["status"] == "recompute"),
                           "worked plan: the maps recomputed")
    waits = [r for r in rows if r["wait_s"] > 5e-6]
    n["dyn_waits"] = (names(f"{r['layer']} ({r['wait_s'] * 1e3:.2f} ms)" for r in waits),
                      "worked plan: where compute waits, and how long")
    return n


def fenced(text: str) -> str:
    """Text as a markdown code block."""
    return f"```text\n{text}\n```"


def names(items) -> str:
    """'`a`, `b` and `c`', or 'none'."""
    items = [f"`{i}`" if " " not in i else f"`{i.split(' ', 1)[0]}` {i.split(' ', 1)[1]}"
             for i in items]
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def split_numbers() -> dict:
    """The splitting chapter: the least budget of each micro-batch count, the step at each
    count forced in 12 GiB, dyn's choice in 12 GiB, 4 GiB and 2.5 GiB, and the profile scaled
    to a half batch against the one measured there."""
    n = {}
    free = plan(*SPLIT, "--memory-budget", BUDGET)
    options = {o["micro_batches"]: o for o in free["micro_batch_options"] if not o["chunks"]}
    rows = ["| micro-batches | least budget | in 12 GiB, this count forced: predicted step |",
            "| ---: | ---: | --- |"]
    for k in COUNTS:
        least = fmt_bytes(options[k]["minimum_budget_bytes"])
        args = ["--memory-budget", BUDGET, "--micro-batches", str(k), "--chunks", "none"]
        forced = plan(*SPLIT, *args)
        step = ms(forced["plan"]["step_time_s"], 1)
        if k == 1:              # the text quotes these two; the table has them all
            n["least_1"] = (least, "least budget, one pass, no chunks")
        if k == COUNTS[-1]:
            n[f"forced_{k}_step"] = (step, f"{k} micro-batches forced in 12 GiB: step")
        moves = forced["decision"].split(";")[0]
        rows.append(f"| {k} x {BATCH // k} | {least} | {step} ({moves}) |")
    n["split_table"] = ("\n".join(rows), "least budget and forced step per count")
    n["least_any"] = (fmt_bytes(free["minimum_budget_bytes"]), "least budget, any count")
    best = min(COUNTS, key=lambda k: options[k]["minimum_budget_bytes"])
    n["least_any_count"] = (f"{best} micro-batches of {BATCH // best}",
                            "the count of the least budget")
    for cap in ("12GiB", "4GiB", "2.5GiB"):
        chosen = free if cap == BUDGET else plan(*SPLIT, "--memory-budget", cap)
        tag = cap.replace(".", "_")
        n[f"choice_{tag}"] = (f"{chosen['micro_batches']} passes of {chosen['micro_batch']}",
                              f"dyn's count in {cap}")
        n[f"choice_{tag}_step"] = (ms(chosen["plan"]["step_time_s"], 1),
                                   f"dyn's step in {cap}")
        n[f"choice_{tag}_moves"] = (chosen["decision"].split(";")[0],
                                    f"what dyn's decision in {cap} offloads")
    one = plan(*ONE_PASS)["plan"]["step_time_s"]
    n["split_gain"] = (f"{1 - free['plan']['step_time_s'] / one:.0%}",
                       "12 GiB: how much faster dyn's choice is than the best one pass")
    n["free_table"] = (fenced(options_table()), "12 GiB: the options table as plan prints it")
    vgg416 = models.build("vgg416", num_classes=1000, image_size=224)
    n["vgg416_param_state"] = (gib(3 * 4 * parameter_count(vgg416)),
                               "VGG-416: parameters, gradients and momentum")
    # A profile measured at 256, scaled to 128, beside the one measured at 128.
    half = plan(*SPLIT, "--memory-budget", BUDGET, "--micro-batches", "2", "--chunks", "none")
    at128 = plan("--model", "vgg16", "--batch", "128", "--relu-bits", "--policy", "none",
                 "--profile", "benchmarks/profiles/vgg16-b128-h200.json")
    for key, p in (("scaled_128", half), ("measured_128", at128)):
        n[key] = (ms(sum(r["forward_s"] + r["backward_s"] for r in p["layers"])),
                  f"device time of a pass of 128, {key.replace('_', ' ')} profile")
    return n


def options_table() -> str:
    """The table of options as `minidnn plan` prints it (the lines after its title)."""
    printout = minidnn("plan", *SPLIT, "--memory-budget", BUDGET)
    lines = printout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("micro-batch counts"))
    end = next(k for k in range(start + 1, len(lines))
               if not lines[k].startswith("  ") or lines[k].startswith("  the planner's"))
    return "\n".join(lines[start:end])


def script(name: str):
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def walkthrough_numbers() -> dict:
    """The walk-through's numbers and its exercises' answers (scripts/walkthrough.py)."""
    return script("walkthrough").numbers()


# The README's table of models: (name, the image size its parameters are counted at).
COUNTED = (("alexnet", 227), ("overfeat", 231), ("vgg16", 224), ("vgg116", 224),
           ("resnet50", 224), ("googlenet", 224))


def model_table_numbers() -> dict:
    """The parameter counts of the README's table of models (1000 classes)."""
    n = {}
    for name, size in COUNTED:
        net = models.build(name, num_classes=1000, image_size=size)
        count = parameter_count(net)
        n[f"params_{name}"] = (f"{count:,}", f"{name}: parameters, 1000 classes, {size}x{size}")
    return n


def all_numbers() -> dict:
    """Every key the pages may quote: {key: (text, what it is)}."""
    n = {}
    for part in (memory_numbers, model_numbers, plan_numbers, split_numbers,
                 walkthrough_numbers, model_table_numbers):
        n.update(part())
    return n


# ---- the pages -----------------------------------------------------------------------------------
INLINE = re.compile(r"<!--n:(?P<key>[\w.]+)-->(?P<text>.*?)<!--/n-->", re.S)
BLOCK = re.compile(r"<!--block:(?P<key>[\w.]+)-->\n(?P<text>.*?)\n?<!--/block-->", re.S)


def quoted(page: str) -> list[tuple[str, str]]:
    """[(key, text quoted)] of every marker on a page, in order."""
    return [(m.group("key"), m.group("text")) for pattern in (INLINE, BLOCK)
            for m in pattern.finditer(page)]


def render(page: str, numbers: dict) -> str:
    """The page with every marker's text replaced by the number's text now (KeyError for a
    marker whose key no part computes)."""
    page = INLINE.sub(lambda m: f"<!--n:{m['key']}-->{numbers[m['key']][0]}<!--/n-->", page)
    return BLOCK.sub(lambda m: f"<!--block:{m['key']}-->\n{numbers[m['key']][0]}\n"
                               f"<!--/block-->", page)


def unclosed(page: str) -> list[str]:
    """Markers that open and do not close before the next one opens (a quoted text never
    holds a marker), one line each."""
    out = []
    for pattern, opening in ((INLINE, "<!--n:"), (BLOCK, "<!--block:")):
        found = list(pattern.finditer(page))
        if page.count(opening) != len(found) or any("<!--" in m["text"] for m in found):
            out.append(f"a {opening}...--> marker is not closed where it should be")
    return out


def stale(page: str, numbers: dict) -> list[str]:
    """What a page quotes that the code no longer computes, one line each."""
    out = unclosed(page)
    for key, text in quoted(page):
        if key not in numbers:
            out.append(f"{key}: no such number (scripts/make_docs.py computes none by that name)")
        elif text != numbers[key][0]:
            out.append(f"{key} ({numbers[key][1]}): quoted {text!r}, now {numbers[key][0]!r}")
    return out


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


def walkthrough_figure(path: Path, stamp: str) -> None:
    """The walk-through's step traced on this CPU, beside the step model's prediction of its
    plan (scripts/stream_timeline.py)."""
    import tempfile
    walkthrough, timeline = script("walkthrough"), script("stream_timeline")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "walk.json"
        walkthrough.run_step(str(trace))
        measured = timeline.measured_timeline(json.loads(trace.read_text()))
    predicted = timeline.predicted_timeline(walkthrough.PLAN_ARGS)
    timeline.draw(measured, predicted, path,
                  titles=("measured on this CPU: python3 scripts/walkthrough.py --trace",
                          f"predicted: minidnn plan (the {walkthrough.GPU} model)"),
                  caption=f"minidnn plan {' '.join(walkthrough.PLAN_ARGS)}; made by {COMMAND} "
                          f"at {stamp}")


CAPTION = re.compile(r"(`python3 scripts/make_docs.py` at commit )([0-9a-f]+\+?)")


def figures(stamp: str) -> None:
    """Draw the figures of the tutorial and the splitting chapter, and put the commit they
    were made at into their captions."""
    from minidnn.planner.timeline import draw_bytes_chart, draw_timeline
    (DOCS / "figures").mkdir(parents=True, exist_ok=True)
    base = ["--model", "vgg16", "--batch", str(BATCH), "--policy", "all"]
    k40, h200 = (plan(*base, "--gpu", g) for g in ("k40", "h200"))
    cmd = f"minidnn plan {' '.join(base)} --gpu k40|h200 --timeline FILE.png"
    draw_timeline([k40, h200], DOCS / "figures" / "timeline_vgg16_b256_all_k40_h200.png",
                  caption=f"{cmd}; made by {COMMAND} at {stamp}")
    draw_bytes_chart(plan(*ONE_PASS), DOCS / "figures" / "bytes_vgg16_b256_dyn_12GiB.png",
                     caption=f"minidnn plan {' '.join(ONE_PASS)} --bytes-chart FILE.png; made "
                             f"by {COMMAND} at {stamp}")
    memory_figure(DOCS / "figures" / "memory_vgg16_b256.png", stamp)
    budget_figure(DOCS / "figures" / "split_vgg16_b256_caps_h200.png")
    walkthrough_figure(DOCS / "figures" / "walkthrough_timeline.png", stamp)
    for page in PAGES:
        text = page.read_text()
        page.write_text(CAPTION.sub(lambda m: m.group(1) + stamp, text))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only list what the pages quote that the code no longer computes")
    parser.add_argument("--no-figures", action="store_true", help="leave the figures as they are")
    args = parser.parse_args(argv)
    numbers = all_numbers()
    if args.check:
        problems = [f"{page.relative_to(ROOT)}: {line}" for page in PAGES
                    for line in stale(page.read_text(), numbers)]
        print("\n".join(problems) or "every number quoted is what the code computes now")
        return 1 if problems else 0
    stamp = commit()
    for page in PAGES:
        page.write_text(render(page.read_text(), numbers))
    (DOCS / "plan_vgg16_b256_12GiB.txt").write_text(numbers["plan_printout"][0])
    drawn = stamp
    if args.no_figures:     # the figures stay as they were drawn, at the commit they name
        old = DOCS / "numbers.json"
        drawn = json.loads(old.read_text()).get("figures_commit") if old.is_file() else None
    else:
        figures(stamp)
    out = {"commit": stamp, "figures_commit": drawn, "command": COMMAND,
           "numbers": {k: {"text": t, "what": w} for k, (t, w) in sorted(numbers.items())}}
    (DOCS / "numbers.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"docs/numbers.json: {len(numbers)} numbers at {stamp}; pages: "
          f"{', '.join(str(p.relative_to(ROOT)) for p in PAGES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
