#!/usr/bin/env python3
"""A measured step beside the step model's prediction of the same plan: two panels, each with
a compute, an offload and a prefetch lane, the layers named on their calls, and the waits
between the streams (the compute stream idle until a copy ends) drawn in red.

    minidnn train ... --trace runs/step.json --report runs/step_report.json   # on the GPU
    python3 scripts/stream_timeline.py runs/step.json --out runs/step_timeline.png \\
        --predict "--report runs/step_report.json"                             # anywhere
    python3 scripts/stream_timeline.py runs/walk.json --out walk.png \\
        --predict "--model scripts/walkthrough.py --num-classes 10 --image-size 32 --batch 32 \\
                   --gpu k40 --memory-budget 8MiB --micro-batches 1 --chunks none"

The measured panel is read from a minidnn `--trace` file (Chrome trace format, written by
minidnn/trace.py: one 'X' event per layer call on the compute stream, per copy on the offload
and prefetch streams, each with its step in args); the predicted one is the `timeline` of
`minidnn plan ARGS --json` (the step model, planner/step_model.py). Each panel has its own time
axis: a CPU trace beside a GPU model differs by orders of magnitude, and the shapes are what
compare. A measured step split into micro-batches shows each pass's calls one after the
other; the step model's timeline (planner/timeline.py: timeline_data) keeps one call per layer
and phase, so its panel shows one pass of a split step.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LANES = ("compute", "offload", "prefetch")
PHASE_COLOURS = {"forward": "tab:blue", "recompute": "tab:green", "backward": "tab:orange"}
COPY_COLOURS = {"offload": "0.35", "prefetch": "0.6"}
# A wait shorter than this fraction of the step is not drawn (it would be invisible).
MIN_WAIT = 0.002


def measured_timeline(trace: dict, step: int | None = None) -> dict:
    """One step of a Chrome trace written by minidnn (default: the last) as {'step',
    'step_time_s', 'calls': [{'phase', 'layer', 'start', 'end', 'stall'}], 'copies':
    [{'stream', 'name', 'start', 'end'}]}, seconds from the step's first event (a copy may
    come before the first layer call); a call's stall is the compute stream's idle time since
    the call before it (the first call's: since the step's first event). ValueError when
    the trace holds no layer call (of that step)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    lanes = {e["tid"]: e["args"]["name"].split()[0] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and lanes.get(e.get("tid")) in LANES]
    steps = sorted({e["args"].get("step", 0) for e in spans})
    if not steps:
        raise ValueError("the trace holds no layer call or copy (was it written by "
                         "minidnn train --trace?)")
    step = steps[-1] if step is None else step
    spans = sorted((e for e in spans if e["args"].get("step", 0) == step),
                   key=lambda e: e["ts"])
    compute = [e for e in spans if lanes[e["tid"]] == "compute"]
    if not compute:
        raise ValueError(f"step {step} has no layer call in the trace (steps: {steps})")
    t0 = spans[0]["ts"]
    calls, last_end = [], t0
    for e in compute:
        calls.append({"phase": e["cat"], "layer": e["args"]["layer"],
                      "start": (e["ts"] - t0) / 1e6, "end": (e["ts"] + e["dur"] - t0) / 1e6,
                      "stall": max(e["ts"] - last_end, 0.0) / 1e6})
        last_end = max(last_end, e["ts"] + e["dur"])
    copies = [{"stream": lanes[e["tid"]], "name": e["name"], "start": (e["ts"] - t0) / 1e6,
               "end": (e["ts"] + e["dur"] - t0) / 1e6}
              for e in spans if lanes[e["tid"]] != "compute"]
    end = max([c["end"] for c in calls] + [c["end"] for c in copies])
    return {"step": step, "step_time_s": end, "calls": calls, "copies": copies}


def plan_json(plan_args: list[str]) -> dict:
    """The output of `minidnn plan PLAN_ARGS --json`, made in this process."""
    from minidnn.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["plan", *plan_args, "--json"])
    if status:
        raise SystemExit(err.getvalue().strip() or f"minidnn plan failed ({status})")
    return json.loads(out.getvalue())


def predicted_timeline(plan_args: list[str]) -> dict:
    """The step model's timeline of the plan `minidnn plan PLAN_ARGS` makes (its --json)."""
    return plan_json(plan_args)["timeline"]


def waits(timeline: dict) -> list[tuple[float, float, dict | None]]:
    """[(start, end, copy)] of each stretch the compute stream waited before a call (seconds),
    with the copy whose end it waited for: the last copy ending within the wait, or None when
    none did (the host, not a copy, was late)."""
    out = []
    for call in timeline["calls"]:
        if call["stall"] <= MIN_WAIT * timeline["step_time_s"]:
            continue
        start, end = call["start"] - call["stall"], call["start"]
        ending = [c for c in timeline["copies"] if start < c["end"] <= end + 1e-9]
        out.append((start, end, max(ending, key=lambda c: c["end"]) if ending else None))
    return out


def draw_panel(ax, timeline: dict, title: str) -> None:
    """One timeline on one axis: three lanes, the calls coloured by phase and named where
    there is room, the copies named, the waits in red with a line from the copy waited for."""
    scale = 1e3                                  # seconds -> ms
    step = timeline["step_time_s"] * scale
    lane = {name: len(LANES) - 1 - k for k, name in enumerate(LANES)}
    room = step / 45                             # a label needs about this much time
    for c in timeline["calls"]:
        a, b = c["start"] * scale, c["end"] * scale
        ax.broken_barh([(a, b - a)], (lane["compute"] - 0.4, 0.8),
                       color=PHASE_COLOURS.get(c["phase"], "0.5"), edgecolor="white", lw=0.3)
        if b - a >= room:
            ax.text((a + b) / 2, lane["compute"], c["layer"], ha="center", va="center",
                    fontsize=6, rotation=90 if b - a < 3 * room else 0)
    labelled = {}                                # lane -> where its last label starts
    for c in sorted(timeline["copies"], key=lambda c: c["start"]):
        a, b = c["start"] * scale, c["end"] * scale
        ax.broken_barh([(a, max(b - a, step / 2000))], (lane[c["stream"]] - 0.35, 0.7),
                       color=COPY_COLOURS[c["stream"]], edgecolor="white", lw=0.3)
        if a - labelled.get(c["stream"], -room) >= room:     # name it where there is room
            labelled[c["stream"]] = a
            ax.text(a, lane[c["stream"]] + 0.42, c["name"], fontsize=5.5, va="bottom",
                    rotation=30)
    total = 0.0
    for start, end, copy in waits(timeline):
        total += end - start
        ax.broken_barh([(start * scale, (end - start) * scale)], (lane["compute"] - 0.4, 0.8),
                       color="tab:red", alpha=0.6, lw=0)
        if copy is not None:
            ax.plot([copy["end"] * scale, end * scale],
                    [lane[copy["stream"]] + 0.35, lane["compute"] - 0.4],
                    color="tab:red", lw=0.8, ls="--")
    ax.set_yticks([lane[n] for n in LANES])
    ax.set_yticklabels(LANES)
    ax.set_xlim(0, step)
    ax.set_ylim(-0.6, len(LANES) - 0.1)
    ax.set_xlabel("ms since the step began")
    ax.set_title(f"{title}: step {step:.1f} ms, compute waited {total * scale:.1f} ms",
                 fontsize=9)


def draw(measured: dict, predicted: dict, path, titles=("measured", "predicted"),
         caption: str = "") -> None:
    """The two-panel PNG: the measured timeline above the predicted one."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(2, 1, figsize=(13, 6.2))
    for ax, timeline, title in zip(axes, (measured, predicted), titles):
        draw_panel(ax, timeline, title)
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items()] + [
        Patch(color=COPY_COLOURS["offload"], label="offload copy"),
        Patch(color=COPY_COLOURS["prefetch"], label="prefetch copy"),
        Patch(color="tab:red", alpha=0.6, label="compute waits"),
        Line2D([], [], color="tab:red", ls="--", label="the copy it waits for")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.03 if caption else 0, 1, 0.95))
    if caption:
        fig.text(0.01, 0.008, caption, fontsize=7, color="0.3")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a minidnn --trace file (Chrome trace JSON)")
    parser.add_argument("--predict", required=True, metavar="'PLAN ARGS'",
                        help="the arguments of `minidnn plan` that make the same plan, quoted "
                             "(e.g. \"--report RUN.json\")")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="where to draw")
    parser.add_argument("--step", type=int, default=None,
                        help="the traced step to draw (default: the last)")
    args = parser.parse_args(argv)
    try:
        trace = json.loads(Path(args.trace).read_text())
        measured = measured_timeline(trace, args.step)
    except (OSError, ValueError) as e:
        print(f"minidnn: error: {args.trace}: {e}", file=sys.stderr)
        return 2
    predicted = predicted_timeline(shlex.split(args.predict))
    draw(measured, predicted, args.out,
         titles=(f"measured: {Path(args.trace).name}, step {measured['step']}",
                 "predicted: the step model"),
         caption=f"measured: {args.trace}; predicted: minidnn plan {args.predict}")
    print(f"{args.out}: measured step {measured['step_time_s'] * 1e3:.1f} ms, predicted "
          f"{predicted['step_time_s'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
