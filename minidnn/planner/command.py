"""`minidnn plan`: how a network will train within a memory budget, before it runs.

    minidnn plan --model vgg16 --batch 256 --memory-budget 12GiB              # this GPU, or h200
    minidnn plan --model vgg16 --batch 256 --memory-budget 12GiB --gpu k40    # the paper's GPU
    minidnn plan --report runs/vgg16.json --gpu h200                          # predicted vs run

Prints one row per layer (feature-map bytes, kept or offloaded, convolution plan and its
workspace, predicted compute and copy times, and how long the compute stream waits before the
layer), then the predicted peak memory and step time, the least budget that works, and how the
other policies (none, vDNN_conv, vDNN_all, vDNN_dyn's greedy order) would do.

Where the costs come from: --profile FILE (a measured profile), else --gpu NAME (an analytic
model, see planner/gpus.py), else this machine's GPU (measured once, then cached), else the
analytic model of the h200. With --report RUN.json (a `minidnn train --report` file) the plan
is made for that run's model, batch, policy and budget, and set beside what the run measured.

The CLI wires this module in with `add_parser(subparsers)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from .. import argtypes
from ..chunks import describe
from ..errors import ConfigError, fmt_bytes
from ..kernels.mapformat import GPU_DEFAULT_LAYOUT, LAYOUTS, PRECISIONS, MapFormat
from ..memory.arena import GPU_SAFETY_MARGIN
from ..memory.policy import CALL_PHASES
from ..memory.schedule import StepSchedule
from ..jsonsafe import json_safe
from ..kernels.math_mode import MATH_MODES, parse as parse_math_mode
from ..layers.conv import describe_plan_setting
from .costs import ALGOS
from ..memory.policy import get_policy, relu_bits_for
from ..spec import StepSpec
from .dyn import RUN_INPUT_BATCHES
from .planning import (PolicyBudgetError, ProfileSource, plan_policy, plan_step,
                       relu_bits_note, statistics_note)
from .search import LOOKAHEADS, budget_to_give
from .split import PRUNE_WITHIN, micro_batch_counts
from .timeline import bytes_by_layer, timeline_data

POLICIES = ("dyn", "none", "conv", "all")


# ---- arguments -----------------------------------------------------------------------------------


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to an argparse subparsers object; returns its parser."""
    from .gpus import gpu_names
    p = subparsers.add_parser(
        "plan", help="plan memory for a budget: what to offload or recompute, which conv "
                     "plans, how fast",
        description="Plan a training step within a memory budget (vDNN_dyn): per layer, keep, "
                    "offload or recompute its feature map and which convolution plan to run; the "
                    "predicted peak memory and step time; the least budget that works.")
    p.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="built-in model or a .py model file (default: the --report's)")
    p.add_argument("--batch", type=argtypes.positive_int, default=None, metavar="N",
                   help="images per step (default: the --report's)")
    p.add_argument("--image-size", type=argtypes.positive_int, default=None, metavar="S",
                   help="height = width of the images (default: the model's native size)")
    p.add_argument("--num-classes", type=argtypes.positive_int, default=None, metavar="K",
                   help="classes (default 1000, or the --report's)")
    p.add_argument("--memory-budget", type=argtypes.size, default=None, metavar="SIZE",
                   help="device memory for everything, e.g. 12GiB (default: the whole GPU)")
    p.add_argument("--gpu", default=None, metavar="|".join(gpu_names()),
                   help="plan for this GPU from its analytic model (default: measure this "
                        "machine's GPU, or the h200 model when there is none; a --report of "
                        "a CPU run: this CPU, measured, as the run planned)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="plan from a measured profile (JSON, as the profiling pass caches it)")
    p.add_argument("--math", choices=MATH_MODES, default=None,
                   help="convolution math: tf32 or strict fp32 (default: the --report's, "
                        "else tf32, as training)")
    p.add_argument("--policy", choices=POLICIES, default=None,
                   help="dyn: plan (default); none/conv/all: predict that vDNN policy")
    p.add_argument("--conv-algo", choices=ALGOS, default="fastest",
                   help="convolution plans for --policy none/conv/all (default fastest)")
    p.add_argument("--prefetch-lookahead", type=argtypes.count, default=None, metavar="N",
                   help="layers ahead backward prefetches, as the run will use (default: dyn "
                        "chooses it; 1 for the other policies)")
    p.add_argument("--micro-batches", type=argtypes.positive_int, default=None, metavar="K",
                   help="plan a step as K passes of batch/K images (as train --micro-batches; "
                        "default: dyn chooses K, the other policies run one pass)")
    p.add_argument("--chunks", type=argtypes.layer_chunks, default=None,
                   metavar="FIRST:LAST:PIECES",
                   help="plan each pass with the layers FIRST..LAST run in PIECES pieces of "
                        "its batch (as train --chunks; comma-separate several; 'none': no "
                        "chunks; default: dyn weighs a few runs of the layers with the "
                        "largest maps)")
    p.add_argument("--split-batch-statistics", action="store_true",
                   help="let dyn split the batch of a network with BatchNorm (as train "
                        "--split-batch-statistics; otherwise such a network runs one pass; "
                        "default: the --report's)")
    p.add_argument("--relu-bits", action="store_true",
                   help="plan with ReLU bit masks where they free a map (as train "
                        "--relu-bits; dyn leaves them off where its plan without them is "
                        "faster)")
    p.add_argument("--no-fuse", action="store_true",
                   help="plan every layer in its own passes, as train --no-fuse runs them "
                        "(fused, a residual add that applies the ReLU after it keeps its "
                        "output longer and the gradient part it sums until its backward, and "
                        "a ReLU before a max pool keeps nothing for backward)")
    p.add_argument("--no-graphs", action="store_true",
                   help="predict a step issued layer by layer from the host (as train "
                        "--no-graphs; also taken from a --report whose GPU run replayed no "
                        "step from a CUDA graph)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="feature maps in fp32 or bf16 (as train --precision; default: the "
                        "--report's, else fp32); bf16 maps plan at 2 bytes a value, their "
                        "times are the profile's")
    p.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="how the run stores feature maps, as train --layout (default: the "
                        "--report's, else the GPU's default, nhwc); a profile of this GPU is "
                        "measured in it")
    p.add_argument("--host-link-gbps", type=argtypes.positive_float, default=None,
                   metavar="GB/S", help="pinned copies get at most this many GB/s each way, "
                   "e.g. what each GPU measured with several copying at once "
                   "(scripts/bench_host_link.py)")
    p.add_argument("--report", default=None, metavar="RUN.json",
                   help="a run report: plan for its settings and compare with its measurements")
    p.add_argument("--refresh-profile", action="store_true",
                   help="measure this GPU again even when a cached profile matches")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_figure_options(p)
    return p


def add_figure_options(p) -> None:
    """--timeline and --bytes-chart: figures of the planned step (planner/timeline.py)."""
    p.add_argument("--timeline", default=None, metavar="FILE.png",
                   help="draw the planned step's compute, offload and prefetch streams, with "
                        "the stalls, from the step-time model")
    p.add_argument("--bytes-chart", default=None, metavar="FILE.png",
                   help="draw per layer the feature-map bytes kept, offloaded, recomputed and "
                        "encoded between forward and backward")


def draw_figures(args, planned: dict) -> None:
    """Write the figures --timeline and --bytes-chart ask for (ConfigError if one cannot be
    written or matplotlib does not import)."""
    from .timeline import draw_bytes_chart, draw_timeline
    for option, path, draw in (("--timeline", getattr(args, "timeline", None),
                                lambda p: draw_timeline([planned], p)),
                               ("--bytes-chart", getattr(args, "bytes_chart", None),
                                lambda p: draw_bytes_chart(planned, p))):
        if not path:
            continue
        try:
            draw(path)
        except ImportError as e:
            raise ConfigError(f"{option} needs matplotlib, which does not import ({e})") from e
        except OSError as e:
            raise ConfigError(f"{option}: cannot write {path!r}: {e}") from e


# ---- helpers -------------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _load_report(path: str) -> dict:
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--report: cannot read run report {path!r}: {e}") from e
    missing = [k for k in ("model", "batch", "policy", "peak_device_bytes") if k not in report]
    if missing:
        raise ConfigError(f"--report: {path!r} is not a minidnn run report (missing "
                          f"{', '.join(missing)})")
    return report


def _settings(args, report: dict | None) -> dict:
    """Model, batch, image size, classes, policy, budget, math, deterministic, precision,
    layout, CUDA graphs, ReLU bit masks, fusion, split batch statistics: the command line's,
    else the report's, else the defaults."""
    r = report or {}
    # A report writes e.g. 'fp32 deterministic' (report.math_mode).
    report_math, deterministic = parse_math_mode(r.get("math_mode"))
    s = {
        "model": args.model or r.get("model"),
        "batch": args.batch or r.get("batch"),
        "image_size": args.image_size or r.get("image_size"),
        "num_classes": args.num_classes or r.get("num_classes") or 1000,
        "policy": args.policy or r.get("policy") or "dyn",
        "budget": args.memory_budget if args.memory_budget is not None
        else r.get("memory_budget_bytes"),
        "math": args.math or report_math or "tf32",
        "deterministic": deterministic,
        "precision": args.precision or r.get("precision") or "fp32",
        "layout": args.layout or r.get("layout") or GPU_DEFAULT_LAYOUT,
        # A GPU run's report says None for its graphs where no step could be replayed
        # (--no-graphs, or a step that cannot be captured: the step model finds that too).
        "graphs": not args.no_graphs and not (r.get("device") == "gpu" and "step_graphs" in r
                                              and r["step_graphs"] is None),
        "relu_bits": bool(args.relu_bits or r.get("relu_bits")),
        # a run with --no-fuse: on a GPU a ReLU its convolution would apply takes its pass
        "fuse": not args.no_fuse and bool(r.get("fuse", True)),
        "split_batch_statistics": bool(getattr(args, "split_batch_statistics", False)
                                       or r.get("split_batch_statistics")),
    }
    if not s["model"] or not s["batch"]:
        raise ConfigError("plan needs --model and --batch (or --report RUN.json to take them "
                          "from a run)")
    if s["policy"] not in POLICIES:
        raise ConfigError(f"cannot plan policy {s['policy']!r} (from the report); plannable: "
                          f"{', '.join(POLICIES)}")
    return s


def _measures_here(args) -> bool:
    """Does the plan measure this machine's GPU (no --profile, no --gpu, a GPU present)?"""
    from ..backend import gpu_available
    return not args.profile and not args.gpu and gpu_available()


def _profile_source(args, s: dict, report: dict | None) -> tuple:
    """(ProfileSource, a line saying where the costs come from): --profile FILE, else --gpu
    NAME's analytic model, else this GPU measured (with the math mode and deterministic
    algorithms of the settings `s`, as the --report's run had them), else the analytic
    model of the report's GPU or the h200; a CPU run's report, this CPU measured."""
    from .gpus import preset_for_device_name
    if args.profile:
        from .profile import load_profile
        prof = load_profile(args.profile)
        return ProfileSource(profile=prof), f"measured profile {args.profile} ({{device}}, {{math}})"
    if args.gpu:
        return ProfileSource(gpu=args.gpu, math=s["math"]), "analytic model of the {device} ({math})"
    if _measures_here(args):
        from .. import kernels
        from ..backend import Device
        mod = kernels.for_device(Device("gpu"))
        if hasattr(mod, "configure"):
            mod.configure(math=s["math"], deterministic=s["deterministic"]
                          or mod.math_mode()["deterministic"])
        return (ProfileSource(device=Device("gpu"), refresh=args.refresh_profile),
                "measured profile of this {device} ({math}, cached)")
    if report and report.get("device") == "cpu":   # a CPU run is planned as train planned it
        from ..backend import Device
        return (ProfileSource(device=Device("cpu"), refresh=args.refresh_profile),
                "measured profile of this CPU (the report's run; cached)")
    preset = None
    if report and report.get("device") == "gpu":
        preset = preset_for_device_name(str(report.get("device_name", "")))
    name = preset.name if preset else "h200"
    return (ProfileSource(gpu=name, math=s["math"]),
            f"analytic model of the {name} ({{math}}; no GPU here, choose another with --gpu)")


def layer_rows(model, ev) -> list[dict]:
    """One dict per node (and one for the input `data`): what the plan does with it."""
    from ..network import DATA
    plan, prof = model.plan, model.profile
    rows = []

    def prof_copy(nbytes, direction):
        return model.copy_seconds(nbytes, direction)

    def storage_row(name, kind, tensor_bytes, sid, producer):
        s = plan.storages[sid]
        owner = s.producer == producer and s.tensors[0] == name
        if not owner:
            status = f"= {s.tensors[0]}"
        elif sid in ev.offload:
            status = "offload"
        elif sid in ev.recompute:
            status = "recompute"
        elif s.needed_in_backward:
            status = "keep"
        else:
            status = "free"
        moved = owner and sid in ev.offload   # shown once, on the row of the buffer's owner
        return dict(layer=name, type=kind, bytes=tensor_bytes, status=status,
                    offload_s=prof_copy(s.nbytes, "offload") if moved else 0.0,
                    prefetch_s=prof_copy(s.nbytes, "prefetch") if moved else 0.0)

    t = plan.tensors[DATA]
    row = storage_row(DATA, "input", int(np.prod(t.shape)) * t.dtype.itemsize, t.storage, -1)
    row.update(algo="", workspace=0, forward_s=0.0, backward_s=0.0, wait_s=0.0)
    rows.append(row)
    for i, node in enumerate(plan.nodes):
        t = plan.tensors[node.name]
        row = storage_row(node.name, type(node.layer).__name__,
                          int(np.prod(t.shape)) * t.dtype.itemsize, t.storage, i)
        for aux in plan.aux_specs(i):
            sid = plan.tensors[f"{node.name}:{aux}"].storage
            if sid in ev.offload:
                row["status"] += f" +{aux}"
                nbytes = plan.storages[sid].nbytes
                row["offload_s"] += prof_copy(nbytes, "offload")
                row["prefetch_s"] += prof_copy(nbytes, "prefetch")
        cost = prof.layer(node.name)
        algo = ev.conv_algo.get(node.layer.name, "")     # a chunk's pieces: their layer's
        a = algo or "fastest"
        share = model.forward_share.get(node.name, 1.0)    # fused into the layer before it
        row.update(algo=algo, workspace=max(cost.workspace("forward", a),
                                            cost.workspace("backward", a)),
                   forward_s=share * model.layer_time(node.name, "forward", a),
                   backward_s=model.backward_share.get(node.name, 1.0) *
                   cost.time("backward", a),
                   wait_s=sum(ev.calls.get((p, i), (0, 0, 0.0))[2]
                              for p in CALL_PHASES))
        rows.append(row)
    return rows


def _decision_line(model, ev) -> str:
    from ..memory.policy import offload_candidates
    n_off = len(ev.offload)
    total = len(offload_candidates(model.plan))
    mem_opt = sorted(n for n, a in ev.conv_algo.items() if a == "min_workspace")
    limited = sorted(n for n, a in ev.conv_algo.items() if a not in ALGOS)
    parts = [f"offload {n_off} of {total} feature maps ({fmt_bytes(ev.offloaded_bytes)} per "
             f"step each way)" if n_off else "offload nothing"]
    if ev.recompute:
        names = model.plan.tensor_names(ev.recompute)
        nbytes = sum(model.plan.storages[sid].nbytes for sid in ev.recompute)
        chains = StepSchedule(model.plan, recompute=ev.recompute).chains()
        segments = sum(len(c) > 1 for c in chains)
        single = len(chains) - segments
        how = ""
        if segments:
            how = f": {segments} segment{'s' * (segments > 1)} of maps rebuilt one from another"
        if segments and single:
            how += f", {single} single map{'s' * (single > 1)}"
        parts.append(f"recompute {len(names)} ({', '.join(names[:6])}"
                     f"{', ...' if len(names) > 6 else ''}: {fmt_bytes(nbytes)}) in "
                     f"backward{how}")
    for names, what in ((limited, "the fastest plans within a workspace limit"),
                        (mem_opt, "their memory-optimal plan")):
        if names:
            parts.append(f"{len(names)} of {len(ev.conv_algo)} convolutions on {what} "
                         f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    if ev.conv_algo and not mem_opt and not limited:
        parts.append("every convolution on its fastest plan")
    if model.gathered:
        names = sorted(model.gathered)
        parts.append(f"the gradients of {', '.join(names)} once a step, from the rows of "
                     f"every pass ({fmt_bytes(model.gathered_bytes)} held: minidnn/gathered.py)")
    return "; ".join(parts)


def _evaluation_json(model, ev) -> dict:
    return {
        "offload": model.plan.tensor_names(ev.offload),
        "recompute": model.plan.tensor_names(ev.recompute),
        "conv_algo": dict(ev.conv_algo),
        "fits": ev.fits,
        "required_bytes": ev.required_bytes,
        "peak_device_bytes": ev.peak_bytes,
        "feature_map_region_bytes": ev.region_bytes,
        "planned_workspace": {f"{name}/{phase}": n for (name, phase), n in ev.workspace.items()},
        "step_time_s": ev.step_time_s,
        "images_per_s": model.step_batch / ev.step_time_s if ev.step_time_s > 0 else None,
        "compute_time_s": ev.compute_s,
        "offloaded_bytes": ev.offloaded_bytes,
        "prefetched_bytes": ev.prefetched_bytes,
        "avg_feature_map_bytes": ev.avg_feature_map_bytes,
        "lower_bound_s": model.lower_bound_s(ev),
    }


def _same_option(a, b) -> bool:
    """Do two SplitOptions (of a scaled and a measured plan) run the same passes and chunks?"""
    return (a.micro_batches, a.chunks) == (b.micro_batches, b.chunks)


def _passes(option) -> str:
    """'2 micro-batches of 128', or 'one pass of 256'."""
    return (f"{option.micro_batches} micro-batches of {option.batch}"
            if option.micro_batches > 1 else f"one pass of {option.batch}")


def _option_json(option, chosen) -> dict:
    """One micro-batch count (with layer chunks or without) the planner weighed
    (planner/split.py: SplitOption); chosen: the option the plan runs."""
    best = option.best
    return {
        "micro_batches": option.micro_batches, "micro_batch": option.batch,
        "chunks": [list(c) for c in option.chunks], "chosen": option is chosen,
        "prefetch_lookahead": option.lookahead,
        "fits": best is not None,
        "step_time_s": best.step_time_s if best else None,
        "images_per_s": option.planner.model.step_batch / best.step_time_s if best else None,
        "required_bytes": best.required_bytes if best else None,
        "peak_device_bytes": best.peak_bytes if best else None,
        "minimum_budget_bytes": int(option.minimum_budget),
        "skipped": option.skipped,
        "pruned": option.pruned,
    }


# ---- the command ---------------------------------------------------------------------------------
def make_plan(args) -> dict:
    """Everything `minidnn plan` shows, as a dict (see run() for the printing)."""
    from .. import models
    report = _load_report(args.report) if args.report else None
    s = _settings(args, report)
    net = models.build(s["model"], num_classes=int(s["num_classes"]),
                       image_size=int(s["image_size"]) if s["image_size"] else None)
    batch = int(s["batch"])
    relu_bits = relu_bits_for(net) if s["relu_bits"] else frozenset()
    maps = MapFormat(s["layout"], s["precision"])
    source, line = _profile_source(args, s, report)
    source.host_link_gbps = args.host_link_gbps
    prof = source.pass_profile(net, batch, batch, relu_bits, maps)    # the step's own
    line = line.format(device=prof.device_name, math=prof.math)
    if args.host_link_gbps:
        line += f"; host link {args.host_link_gbps:g} GB/s each way"
    notes = list(prof.notes)
    if maps.precision != "fp32":
        notes.append(f"feature maps in {maps.precision}: planned at their bytes; the times are "
                     f"the profile's, as measured or modelled")
    budget = s["budget"]
    if budget is None:
        budget = max(int(prof.memory_bytes) - GPU_SAFETY_MARGIN, 0)
        notes.append(f"no --memory-budget: planning for the whole {prof.device_name} "
                     f"({fmt_bytes(prof.memory_bytes)} less {fmt_bytes(GPU_SAFETY_MARGIN)} the "
                     f"arena leaves to CUDA)")
    spec = _plan_spec(args, s, net, batch, budget)
    options = dict(relu_bits=relu_bits, input_batches=RUN_INPUT_BATCHES)
    lookaheads = _lookaheads(args, s, spec)
    dyn = s["policy"] == "dyn"
    planned = plan_step(net, spec, source, maps, lookaheads, options, weigh_relu_bits=dyn)
    if planned.chosen is None and dyn:
        raise planned.infeasible_error()
    bits_note = relu_bits_note(planned)
    notes += [bits_note] if bits_note else []
    options["relu_bits"] = planned.relu_bits
    # BatchNorm keeping one pass: what --split-batch-statistics would give, where that is much
    note = statistics_note(net, spec, planned.chosen.best.step_time_s, source, maps,
                           lookaheads, options) if dyn else None
    if note is None and spec.whole_batch(net) and len(micro_batch_counts(batch)) > 1:
        note = (f"not split into micro-batches: {len(net.batch_statistics_layers())} "
                f"BatchNorm layers normalize with the whole batch's statistics "
                f"(--split-batch-statistics allows a split)")
    notes += [note] if note else []
    static = None if dyn else \
        _policy_plan(net, spec, s["policy"], args.conv_algo, source, maps, options)
    out = _plan_dict(args, s, net, spec, planned, prof, line, maps, notes, static)
    if report is not None:
        out["comparison"] = compare_with_report(out, report, args.report)
    return out


def _plan_spec(args, s: dict, net, batch: int, budget: int):
    """The StepSpec `minidnn plan` plans (checked against the network): dyn weighs the
    micro-batch counts and layer chunks that --micro-batches and --chunks leave open; the
    other policies run one pass, unchunked."""
    dyn = s["policy"] == "dyn"
    forced = args.micro_batches
    spec = StepSpec(batch=batch, policy=s["policy"], memory_budget=int(budget),
                    micro_batches=forced if forced is not None else (None if dyn else 1),
                    chunks=args.chunks if args.chunks is not None else (None if dyn else ()),
                    split_batch_statistics=s["split_batch_statistics"],
                    prefetch_lookahead=1 if args.prefetch_lookahead is None
                    else args.prefetch_lookahead,
                    relu_bits=s["relu_bits"], precision=s["precision"],
                    layout=s["layout"], deterministic=s["deterministic"] or None,
                    fuse=s["fuse"], graphs=s["graphs"])
    spec.check_network(net)
    spec.check_policy(get_policy(s["policy"]))
    return spec


def _policy_plan(net, spec, policy: str, conv_algo: str, source, maps, options: dict):
    """The plan of a vDNN policy's one decision (planning.plan_policy), every convolution on
    `conv_algo`: what a run of `spec` under that policy needs, the least budget its refusal
    names."""
    from ..memory.plan import LivenessPlan
    plan = LivenessPlan(net, spec.batch // (spec.micro_batches or 1),
                        relu_bits=options["relu_bits"], maps=maps, fuse=spec.fuse)
    decision = get_policy(policy).decide(plan, spec.memory_budget)
    convs = {node.name: conv_algo for node in net.nodes if node.layer.kind == "conv"}
    return plan_policy(net, spec, source, maps, decision.offload, convs, options)


def _alternatives(planner, result) -> list:
    """What the other policies and dyn's searches would do, as rows of the plan."""
    model = planner.model
    alternatives = []
    for policy in ("none", "conv", "all"):
        for algo in ("fastest", "min_workspace"):
            alt = planner.baseline(policy, algo)
            alternatives.append(dict(label=f"{policy}, {algo.replace('_', '-')} plans",
                                     **_evaluation_json(model, alt)))
    floor = result.floor if result else None
    if floor is not None:
        label = next(lbl for lbl, e in result.floor_trail if e is floor)
        alternatives.append(dict(label=f"vDNN_dyn greedy order: {label}",
                                 **_evaluation_json(model, floor)))
    if result is not None:
        for key, label in (("greedy", "dyn's greedy search, one map at a time"),
                           ("segments", "dyn's checkpointed segments"),
                           ("segments+greedy", "dyn's greedy from checkpointed segments")):
            found = result.searches.get(key)
            if found is not None:
                alternatives.append(dict(label=label, **_evaluation_json(model, found)))
        alternatives.append(dict(label="dyn (minidnn planner)",
                                 **_evaluation_json(model, result.best)))
    return alternatives


def _choose_lookahead(args, s: dict) -> bool:
    """dyn chooses the prefetch lookahead too, unless --prefetch-lookahead fixes it."""
    return args.prefetch_lookahead is None and s["policy"] == "dyn"


def _lookaheads(args, s: dict, spec) -> tuple:
    """The prefetch lookaheads the plan tries: every one dyn may choose, or the one given."""
    return LOOKAHEADS if _choose_lookahead(args, s) else (spec.prefetch_lookahead,)


def _plan_dict(args, s: dict, net, spec, planned, prof, source: str, maps, notes: list,
               static=None) -> dict:
    """make_plan's dict from the StepPlan `planned` of `spec` (see make_plan); static: the
    PolicyPlan of a vDNN policy's decision (None for dyn), whose prediction and least
    budget the plan shows."""
    choose = _choose_lookahead(args, s)
    budget = spec.memory_budget
    split = planned.split
    option = planned.chosen or split.options[0]
    if planned.remeasured is not None:
        first = planned.first
        notes.append(f"{_passes(option)}"
                     + (f", layers {describe(option.chunks)}," if option.chunks else "")
                     + " planned again from profiles measured at their own batches, as "
                       "a run plans them (the table of options is from the scaled "
                       "profile)"
                     + ("" if _same_option(first, option) else
                        f": measured, it is faster than {_passes(first)}"
                        + (f", layers {describe(first.chunks)}" if first.chunks else "")
                        + ", the scaled profile's choice"))
    counts = sorted({o.micro_batches for o in split.options})
    # The row of the option the step runs (its figures in the table are the scaled profile's).
    chosen = next((o for o in split.options if _same_option(o, option)), planned.first)
    batch = int(s["batch"])
    planner, result, infeasible = option.planner, option.result, option.error
    lookahead = option.lookahead
    if choose:
        tried = ", ".join(map(str, LOOKAHEADS))
        notes.append(f"prefetch lookahead {lookahead} chosen (tried {tried})")
    if len(counts) > 1 or len(split.options) > 1:
        notes.append(f"the step runs as {_passes(option)}"
                     + (f", layers {describe(option.chunks)}" if option.chunks else "")
                     + (f": of {', '.join(map(str, counts))} micro-batches, with layer "
                        f"chunks or without," if len(counts) > 1 else
                        ": with layer chunks or without,")
                     + " the fastest that fits (see the table of options)")
    lookahead = lookahead if lookahead is not None else _lookaheads(args, s, spec)[0]
    if static is None:
        minimum_budget = planned.least_budget()
        ev = result.best
    else:   # what the policy's one decision needs: a smaller budget is refused (decide.py)
        minimum_budget, ev = static.least_budget, static.evaluation
        planner = static.planner
    model = planner.model
    alternatives = _alternatives(planner, result)
    if static is not None:
        # The policy's own refusal (what `minidnn train` says), not dyn's.
        try:
            static.check(budget, s["policy"])
        except PolicyBudgetError as e:
            notes.append(str(e))
    elif result is None and infeasible is not None:
        # Only when no lookahead found a plan: a failed lookahead beside one that succeeded is
        # not news about the budget (the plan above fits).
        notes.append(str(infeasible))
    out = {
        "model": s["model"], "network": net.name, "batch": batch,
        "image_size": net.input_shape[-1], "num_classes": int(s["num_classes"]),
        "policy": s["policy"], "math": prof.math, "precision": maps.precision,
        "layout": maps.layout,
        "profile_source": source,
        "gpu": prof.device_name, "memory_budget_bytes": int(budget),
        "usable_bytes": planner.usable, "prefetch_lookahead": lookahead,
        "micro_batches": option.micro_batches, "micro_batch": option.batch,
        "chunks": [list(c) for c in option.chunks],
        "relu_bits": sorted(planned.relu_bits),     # the ReLUs that keep bit masks
        "gathered": sorted(model.gathered),         # gradients once a step (gathered.py)
        "minimum_budget_bytes": minimum_budget,
        "micro_batch_options": [_option_json(o, chosen) for o in split.options],
        "plan": _evaluation_json(model, ev),
        "decision": _decision_line(model, ev),
        "layers": layer_rows(model, ev),
        "timeline": timeline_data(model, ev),
        "bytes_by_layer": bytes_by_layer(model.plan, ev),
        "alternatives": alternatives,
        "bandwidth": {"d2h": prof.d2h_bw, "h2d": prof.h2d_bw, "duplex": prof.duplex_bw},
        "evaluations": len(model.cache),
        "notes": notes,
    }
    return out




def compare_with_report(planned: dict, report: dict, path: str) -> dict:
    """Predicted against measured: peak device bytes, step time, images/s, bytes moved.

    A report's bytes moved are its last pass's (every pass alike): a step's are that times
    its micro-batches. `differs` says how this plan's step is not the one the run took (its
    micro-batches or layer chunks: the planner, or its profile, changed since), None when
    it is: the comparison then sets one step beside another."""
    p = planned["plan"]
    batch = report.get("batch") or planned["batch"]
    passes = int(report.get("micro_batches") or 1)
    ran = (passes, [list(c) for c in report.get("chunks") or []])
    planned_step = (int(planned["micro_batches"]), planned["chunks"])
    # A report written before these fields were: nothing to tell the steps apart by.
    known = "micro_batches" in report and "chunks" in report
    differs = None if ran == planned_step or not known else (
        f"the run took {_step_shape(*ran)}, this plan {_step_shape(*planned_step)}")
    # The steady state's peak when the run reports it (the first steps also measure every
    # cuDNN plan, whose trial workspaces are not part of training).
    peak = report.get("steady_peak_device_bytes") or report.get("peak_device_bytes")
    ips = report.get("images_per_s")
    measured_step = batch / ips if ips else None
    rows = []
    for what, pred, meas, target in (
            ("peak device memory", p["peak_device_bytes"], peak, 0.05),
            ("step time (s)", p["step_time_s"], measured_step, 0.15),
            ("images/s", p["images_per_s"], ips, None),
            ("offloaded bytes per step", p["offloaded_bytes"],
             _per_step(report.get("offloaded_bytes"), passes), None),
            ("prefetched bytes per step", p["prefetched_bytes"],
             _per_step(report.get("prefetched_bytes"), passes), None)):
        err = (pred - meas) / meas if (pred is not None and meas) else None
        rows.append({"quantity": what, "predicted": pred, "measured": meas,
                     "relative_error": err, "target": target,
                     "within_target": None if (target is None or err is None)
                     else abs(err) <= target})
    return {"report": path, "device_name": report.get("device_name"),
            "policy": report.get("policy"), "steps": report.get("steps"), "rows": rows,
            "differs": differs}


def _per_step(pass_bytes, passes: int):
    return None if pass_bytes is None else int(pass_bytes) * passes


def _step_shape(micro_batches: int, chunks: list) -> str:
    """'8 micro-batches' / 'one pass', with its layer chunks."""
    shape = f"{micro_batches} micro-batches" if micro_batches > 1 else "one pass"
    return shape + (f", {describe(chunks)}" if chunks else "")


def _fmt_value(what: str, v) -> str:
    if v is None:
        return "-"
    if "bytes" in what or "memory" in what:
        return fmt_bytes(v)
    if "time" in what:
        return f"{v * 1e3:.1f} ms"
    return f"{v:.1f}"


def _options_lines(out: dict) -> list:
    """The table of the micro-batch counts and layer chunks weighed (none for one option)."""
    if len(out["micro_batch_options"]) <= 1:
        return []
    labels = [f"{o['micro_batches']} x {o['micro_batch']}"
              + (f", {describe(o['chunks'])}" if o["chunks"] else "")
              + (" (chosen)" if o["chosen"] else "")
              + ("" if o["pruned"] or not o["fits"] else " *")
              for o in out["micro_batch_options"]]
    label_w = max([22] + [len(label) + 2 for label in labels])
    lines = ["", "micro-batch counts and layer chunks weighed (dyn's plan at each; the "
                 "least budget each can train in):",
             f"  {'micro-batches, layer chunks':<{label_w}}{'lookahead':>10}"
             f"{'needs':>12}{'peak':>12}{'step ms':>10}{'img/s':>9}{'least budget':>14}"]
    for o, label in zip(out["micro_batch_options"], labels):
        if o["fits"]:
            cols = (f"{o['prefetch_lookahead']:>10}{fmt_bytes(o['required_bytes']):>12}"
                    f"{fmt_bytes(o['peak_device_bytes']):>12}"
                    f"{o['step_time_s'] * 1e3:>10.1f}{o['images_per_s']:>9.0f}")
        else:
            why = o["skipped"] or "does not fit"
            cols = f"  {why[:51]:<51}"
        lines.append(f"  {label:<{label_w}}{cols}{fmt_bytes(o['minimum_budget_bytes']):>14}")
    if any(o["fits"] and not o["pruned"] for o in out["micro_batch_options"]):
        lines.append(f"  * not pruned: more than {PRUNE_WITHIN:.0%} slower than the fastest "
                     f"option before pruning")
    return lines


def _comparison_lines(c: dict) -> list:
    """Predicted against measured, for a plan made for a --report."""
    lines = ["", f"predicted against measured ({c['report']}: policy {c['policy']}, "
                 f"{c['steps']} steps on {c['device_name']}):",
             f"  {'quantity':<28}{'predicted':>14}{'measured':>14}{'error':>9}  target"]
    for r in c["rows"]:
        err = "-" if r["relative_error"] is None else f"{r['relative_error']:+.1%}"
        target = "" if r["target"] is None else \
            f"within {r['target']:.0%}: {'yes' if r['within_target'] else 'no'}"
        lines.append(f"  {r['quantity']:<28}{_fmt_value(r['quantity'], r['predicted']):>14}"
                     f"{_fmt_value(r['quantity'], r['measured']):>14}{err:>9}  {target}")
    if c.get("differs"):
        lines.append(f"  not the same step: {c['differs']}")
    return lines


def format_plan(out: dict) -> str:
    """The printed form of make_plan's dict."""
    split = (f" as {out['micro_batches']} micro-batches of {out['micro_batch']} (the layer "
             f"table and memory are one pass's; step times are the whole step's)"
             if out["micro_batches"] > 1 else "")
    if out["chunks"]:
        split += f", layers {describe(out['chunks'])} (the table lists each piece)"
    lines = [f"{out['network']}: batch {out['batch']}{split}, {out['image_size']}x"
             f"{out['image_size']} images, {out['num_classes']} classes; costs from the "
             f"{out['profile_source']}",
             f"memory budget {fmt_bytes(out['memory_budget_bytes'])} (plans fill "
             f"{fmt_bytes(out['usable_bytes'])}; the rest is left for fragmentation); "
             f"policy {out['policy']}; prefetch lookahead {out['prefetch_lookahead']}"
             + ("" if out["precision"] == "fp32" else f"; feature maps {out['precision']}"),
             ""]
    # Columns as wide as the longest layer name and status (ResNet's 'layer1.0.downsample.0').
    name_w = max([13] + [len(r["layer"]) + 1 for r in out["layers"]])
    status_w = max([20] + [len(r["status"]) + 1 for r in out["layers"]])
    head = (f"{'layer':<{name_w}}{'type':<20}{'feature map':>12}  {'keep/offload':<{status_w}}"
            f"{'conv plan':<15}{'workspace':>11}{'fwd ms':>9}{'bwd ms':>9}{'offload ms':>11}"
            f"{'prefetch ms':>12}{'wait ms':>9}")
    lines += [head, "-" * len(head)]
    for r in out["layers"]:
        lines.append(f"{r['layer']:<{name_w}}{r['type'][:19]:<20}{fmt_bytes(r['bytes']):>12}  "
                     f"{r['status']:<{status_w}}"
                     f"{describe_plan_setting(r['algo']) if r['algo'] else '':<15}"
                     f"{fmt_bytes(r['workspace']) if r['workspace'] else '-':>11}"
                     f"{_ms(r['forward_s']):>9}{_ms(r['backward_s']):>9}"
                     f"{_ms(r['offload_s']) if r['offload_s'] else '-':>11}"
                     f"{_ms(r['prefetch_s']) if r['prefetch_s'] else '-':>12}"
                     f"{_ms(r['wait_s']) if r['wait_s'] > 5e-6 else '-':>9}")
    lines.append("-" * len(head))
    p = out["plan"]
    fit = "fits" if p["fits"] else "DOES NOT FIT"
    lines += [
        f"plan: {out['decision']}",
        f"predicted peak device memory {fmt_bytes(p['peak_device_bytes'])} (the step needs "
        f"{fmt_bytes(p['required_bytes'])}: {fit} the budget"
        + (f"; feature maps{' and cuDNN workspaces' if p['planned_workspace'] else ''} in a "
           f"static region of {fmt_bytes(p['feature_map_region_bytes'])}"
           if p["feature_map_region_bytes"] else "") + ")",
        f"predicted step time {p['step_time_s'] * 1e3:.1f} ms ({p['images_per_s']:.0f} "
        f"images/s); compute alone {p['compute_time_s'] * 1e3:.1f} ms; no schedule of these "
        f"copies beats {p['lower_bound_s'] * 1e3:.1f} ms = max(compute, bytes moved / "
        f"bandwidth at {out['bandwidth']['d2h'] / 1e9:.0f} GB/s)",
        f"minimum feasible budget: {fmt_bytes(out['minimum_budget_bytes'])} (give "
        f"--memory-budget {budget_to_give(out['minimum_budget_bytes'])} or more)",
        "", "the alternatives (predicted):",
        f"  {'configuration':<52}{'needs':>12}{'peak':>12}{'step ms':>10}{'img/s':>9}  fits"]
    for a in out["alternatives"]:
        lines.append(f"  {a['label'][:51]:<52}{fmt_bytes(a['required_bytes']):>12}"
                     f"{fmt_bytes(a['peak_device_bytes']):>12}{a['step_time_s'] * 1e3:>10.1f}"
                     f"{a['images_per_s']:>9.0f}  {'yes' if a['fits'] else 'no'}")
    lines += _options_lines(out)
    dyn = next((a for a in out["alternatives"] if a["label"].startswith("dyn")), None)
    floor = next((a for a in out["alternatives"] if a["label"].startswith("vDNN_dyn")), None)
    if dyn and floor and dyn["step_time_s"] > 0:
        lines.append(f"  the planner's step is {floor['step_time_s'] / dyn['step_time_s']:.2f}x "
                     f"as fast as vDNN_dyn's greedy order ({out['evaluations']} decisions "
                     f"evaluated)")
    if out.get("comparison"):
        lines += _comparison_lines(out["comparison"])
    for note in out["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(args, out=print) -> int:
    """Run `minidnn plan` with parsed arguments; returns the exit status (0)."""
    planned = make_plan(args)
    draw_figures(args, planned)
    if args.json:
        out(json.dumps(json_safe(planned), indent=1))
    else:
        out(format_plan(planned))
    return 0
