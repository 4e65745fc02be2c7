#!/usr/bin/env python3
"""Where the step model's time and a measured step part: every layer call, predicted beside
measured, added up by phase and layer kind.

    minidnn train ... --report runs/run.json                  # on the GPU: the measured step
    minidnn train ... --trace runs/step.json                  # the same run, traced
    python3 scripts/model_vs_trace.py runs/step.json --report runs/run.json   # the same GPU
    python3 scripts/model_vs_trace.py runs/step.json --plan runs/plan.json [--report ...]

The step model (planner/step_model.py) prices a call at its layer's time in the profile,
measured alone at the pass's batch (planner/profile.py); the trace (minidnn/trace.py) times the
same call inside a real step, one event pair around it (with `--trace-held`, the stream held
while the host issues the call, so that the pair times the device, not the host). A step
split into K micro-batches makes K calls per layer and phase: they are averaged, so each row
is one pass. The plan is
`minidnn plan --report RUN.json` with the run's micro-batches and chunks (made here, so on the
GPU that ran it, from its cached profile), or a saved `minidnn plan --json` output. With the
run's report, the step the run measured (replayed as a CUDA graph where it could be) stands
beside the sum of its traced calls: what a replay gains or loses between the calls.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from stream_timeline import measured_timeline, plan_json  # noqa: E402
from minidnn.report import steady_step_times  # noqa: E402


# Traced calls adding up to more than this many times the run's replayed step were timed by
# the host issuing them (passes of a few images), not by the device running them.
HOST_BOUND = 1.5


def steady_median(report: dict) -> float | None:
    """The median of a run's steady steps (minidnn/report.py: after its warm-up, neither
    captured as a CUDA graph nor traced), None when it has none."""
    steady = sorted(steady_step_times(report))
    return steady[len(steady) // 2] if steady else None


def measured_calls(trace: dict) -> tuple[dict, int]:
    """({(phase, layer): [seconds of each call]}, traced step) of the trace's last step."""
    timeline = measured_timeline(trace)
    calls: dict = defaultdict(list)
    for c in timeline["calls"]:
        calls[(c["phase"], c["layer"])].append(c["end"] - c["start"])
    return calls, timeline["step"]


def held_of(trace: dict) -> dict | None:
    """{'held': True, 'unheld_calls': n} of a held trace (`--trace-held`: each call's span
    the device's time), None of a plain one."""
    return trace.get("otherData") if isinstance(trace, dict) else None


def plan_of_run(report_path: str, report: dict) -> dict:
    """The plan of the run `report` describes: its settings, micro-batches and chunks."""
    chunks = report.get("chunks") or []
    return plan_json(["--report", report_path,
                      "--micro-batches", str(int(report.get("micro_batches") or 1)),
                      "--chunks", ",".join(f"{a}:{b}:{n}" for a, b, n in chunks) or "none"])


def predicted_calls(plan: dict) -> dict:
    """{(phase, layer): seconds} of one pass in the step model's timeline."""
    return {(c["phase"], c["layer"]): c["end"] - c["start"] for c in plan["timeline"]["calls"]}


def layer_kinds(plan: dict) -> dict:
    """{layer name: its kind} of the plan's network; a chunk's piece ('conv1@0') is its layer's."""
    from minidnn import models
    net = models.build(plan["model"], num_classes=plan.get("num_classes") or 1000,
                       image_size=plan.get("image_size"))
    return {node.name: node.layer.kind for node in net.nodes}


def kind_of(kinds: dict, layer: str) -> str:
    return kinds.get(layer, kinds.get(layer.split("@")[0], "?"))


def compare(measured: dict, predicted: dict, kinds: dict, passes: int) -> tuple[list, list]:
    """(rows by phase and kind, rows by call): {'phase', 'kind' or 'layer', 'predicted',
    'measured'} in seconds per pass; a call the trace has but the timeline has not (or the
    reverse) counts 0 on the side without it."""
    by_kind: dict = defaultdict(lambda: [0.0, 0.0, 0])
    by_call = []
    for key in sorted(set(measured) | set(predicted)):
        phase, layer = key
        p = predicted.get(key, 0.0)
        m = sum(measured.get(key, ())) / passes
        row = by_kind[(phase, kind_of(kinds, layer))]
        row[0] += p
        row[1] += m
        row[2] += 1
        by_call.append({"phase": phase, "layer": layer, "predicted": p, "measured": m})
    kind_rows = [{"phase": ph, "kind": k, "predicted": p, "measured": m, "calls": n}
                 for (ph, k), (p, m, n) in by_kind.items()]
    kind_rows.sort(key=lambda r: -max(r["predicted"], r["measured"]))
    by_call.sort(key=lambda r: -abs(r["measured"] - r["predicted"]))
    return kind_rows, by_call


def ratio(p: float, m: float) -> str:
    return f"{p / m:.2f}" if m > 0 else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a minidnn train --trace file")
    ap.add_argument("--report", default=None, metavar="RUN.json",
                    help="the run's --report: its measured step, and its plan unless --plan")
    ap.add_argument("--plan", default=None, metavar="PLAN.json",
                    help="the same plan's `minidnn plan --json` output")
    ap.add_argument("--top", type=int, default=12, help="calls furthest from their prediction")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows")
    args = ap.parse_args(argv)
    try:
        trace = json.loads(Path(args.trace).read_text())
        measured, step = measured_calls(trace)
        held = held_of(trace)
        report = json.loads(Path(args.report).read_text()) if args.report else None
        plan = json.loads(Path(args.plan).read_text()) if args.plan else None
    except (OSError, ValueError, KeyError) as e:
        print(f"minidnn: error: {e}", file=sys.stderr)
        return 2
    if plan is None:
        if report is None:
            ap.error("give --report RUN.json or --plan PLAN.json")
        plan = plan_of_run(args.report, report)
    k = int(plan.get("micro_batches") or 1)
    if report is not None and int(report.get("micro_batches") or 1) != k:
        print(f"minidnn: error: the plan has {k} micro-batches, the run "
              f"{report.get('micro_batches')}: not the same plan", file=sys.stderr)
        return 2
    kinds = layer_kinds(plan)
    kind_rows, call_rows = compare(measured, predicted_calls(plan), kinds, k)
    total_p = sum(r["predicted"] for r in kind_rows)
    total_m = sum(r["measured"] for r in kind_rows)
    print(f"{plan['model']} b{plan['batch']}, {plan['precision']}, {k} pass(es) of "
          f"{plan['micro_batch']}; traced step {step}; milliseconds per pass\n")
    print("| phase | layer kind | calls | predicted | measured | predicted/measured |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in kind_rows:
        print(f"| {r['phase']} | {r['kind']} | {r['calls']} | {r['predicted'] * 1e3:.3f} | "
              f"{r['measured'] * 1e3:.3f} | {ratio(r['predicted'], r['measured'])} |")
    print(f"| all | | | {total_p * 1e3:.3f} | {total_m * 1e3:.3f} | "
          f"{ratio(total_p, total_m)} |\n")
    step_p = plan["timeline"]["step_time_s"]
    line = (f"step: predicted {step_p * 1e3:.1f} ms (layer calls {k} x {total_p * 1e3:.2f}); "
            f"traced calls {k} x {total_m * 1e3:.2f} = {k * total_m * 1e3:.1f} ms")
    run = None if report is None else steady_median(report)
    if report is not None and run is None:
        line += "; the run has no steady step (each a warm-up, captured or traced step)"
    if run is not None:
        line += f"; the run's step {run * 1e3:.1f} ms (median of its steady steps)"
        if not held and k * total_m > HOST_BOUND * run:
            line += (f"\nThe traced calls took {k * total_m / run:.1f} times the run's "
                     f"step: issued one by one, they measure the host's time to issue "
                     f"them here, not the device's; trace with --trace-held, or "
                     f"compare the run's step")
    if held:
        line += (f"\nA held trace: each call's span is the device's time for it "
                 f"({held.get('unheld_calls', 0)} calls issued more slowly than their hold)")
    print(line + "\n")
    print(f"The {args.top} calls furthest from their prediction (ms per pass):\n")
    print("| phase | layer | predicted | measured |")
    print("| --- | --- | ---: | ---: |")
    for r in call_rows[:args.top]:
        print(f"| {r['phase']} | {r['layer']} | {r['predicted'] * 1e3:.3f} | "
              f"{r['measured'] * 1e3:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"by_kind": kind_rows, "by_call": call_rows,
                                               "passes": k, "plan": plan}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
