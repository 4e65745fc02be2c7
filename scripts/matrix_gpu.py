#!/usr/bin/env python3
"""The combination matrix on a GPU: every network at every budget down to its least, each
run in its own process, with what it promised set beside what it did.

For each model, precision (and, for networks with BatchNorm, with and without
--split-batch-statistics):
  1. `minidnn train` without a budget: the unconstrained peak (steady_peak_device_bytes);
  2. `minidnn train` with a 4 KiB budget: the least budget its refusal names (the figure the
     user is told, as printed) and `minidnn plan --json`'s minimum_budget_bytes beside it;
  3. `minidnn train --policy dyn` at each --fractions entry: a fraction of the unconstrained
     peak, or `least`; each cell a subprocess with a timeout, recording whether it ran to the
     end, was refused before step one, or failed mid-run (the error line), and, for a run
     that ended, `minidnn plan --report RUN.json --json`'s predicted peak and step time
     against the measured ones.
Targets: no failure mid-run; predicted peak within 3% and step time within 10% of measured:
the columns predicted/measured peak and predicted/measured step say pass or fail.

The measured step is comparable with the step model's (back-to-back steady steps, the plans
chosen, replayed from a CUDA graph where the run can): the median of the run's step times
(`step_time_s` of its report) leaving out the first WARMUP_STEPS (the first calls of each
convolution measure its cuDNN plans) and the steps captured as CUDA graphs (their capture is
paid once; `step_graphs.captured_at`). Hence --steps 12 by default: 2 warm-up, at most one
capture, 9 timed.

    python3 scripts/matrix_gpu.py --out runs/matrix                      # the H200 matrix
    python3 scripts/matrix_gpu.py --out runs/m --models vgg16 --precisions bf16 \\
        --fractions 0.5,least --time-limit 1800
    python3 scripts/matrix_gpu.py --out /tmp/m --device cpu --batch 4 --image-size 32 \\
        --models vgg11 --steps 2                                          # a quick CPU check

With --trace each budget cell's last step is traced (held on a GPU: `minidnn train
--trace-held`, each call's span the device's time) and set beside the step model's calls by
phase and layer kind (scripts/model_vs_trace.py): the kinds furthest from their prediction
are listed under the table, which says where a missed step goes wrong. The traced step is
left out of the measured step.

Writes OUT/matrix.json (settings, every cell) and OUT/matrix.md (the table). --time-limit
bounds the whole wall clock: no run outlives it, and the cells left when it runs out are
listed as skipped. The whole GPU matrix takes more than half an hour on an H200 that has no
profiles cached yet (AlexNet's two rows about 2 minutes, VGG-16's 3, GoogLeNet's and
ResNet-50's longer: each profile is measured first, and a cell of 64 passes of 4 images runs
for a minute or more), so it is run a network at a time, within the time a call allows:

    python3 scripts/matrix_gpu.py --out /tmp/m --models vgg16 --precisions fp32,bf16 \
        --fractions 0.75,0.5,0.35,0.25,least --time-limit 230
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from minidnn.errors import fmt_bytes, parse_bytes  # noqa: E402
from minidnn.report import steady_step_times  # noqa: E402

MODELS = ("vgg16", "resnet50", "googlenet", "alexnet", "overfeat")
PEAK_TARGET = 0.03
STEP_TARGET = 0.10
#: Steps a run's measured step leaves out first: the training loop's own warm-up (its report's
#: images_per_s leaves out as many), in which each convolution measures its cuDNN plans.
WARMUP_STEPS = 2
#: What a budget error names when it happened in the set-up, before step one (the
#: parameters, their gradients, the static layout's region); any other budget error
#: (a layer call, the optimizer, code between calls) happened in a step.
SET_UP = re.compile(r"exceeded in (feature maps \(static layout\)|parameter \S+|"
                    r"buffer \S+|gradient of \S+): requested")


# ---- one run -------------------------------------------------------------------------------------
def run_minidnn(args: list[str], timeout: float, in_process: bool = False) -> dict:
    """`python3 -m minidnn ARGS`: {returncode, stdout, stderr, wall_s} or {timed_out}.
    in_process: `minidnn.cli.main(ARGS)` in this process instead (no timeout)."""
    t0 = time.time()
    if in_process:
        return run_in_process(args, t0)
    try:
        proc = subprocess.run([sys.executable, "-m", "minidnn", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return {"timed_out": True, "wall_s": round(time.time() - t0, 1)}
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "wall_s": round(time.time() - t0, 1)}


def run_in_process(args: list[str], t0: float) -> dict:
    """`minidnn.cli.main(ARGS)` with its output captured: what a process would have printed.
    The cells then share this process's CUDA context, compiled kernels and measured cuDNN
    plan tables (each run still chooses its plans for its own workspace), as a user's later
    runs share the profile on disk; a fresh process per cell costs 10-20 s of start-up on the
    H200, most of it measuring plans again."""
    import contextlib
    import io
    import traceback
    from minidnn import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except Exception:   # a bug: its traceback, as a process would print it
            traceback.print_exc()
            code = 1
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "wall_s": round(time.time() - t0, 1)}


def error_line(result: dict) -> str | None:
    """The one `minidnn: error:` line of a failed run (or its last line, for a crash)."""
    if result.get("timed_out"):
        return f"timed out after {result['wall_s']} s"
    if result.get("returncode") == 0:
        return None
    lines = (result.get("stderr") or "").strip().splitlines() or \
        (result.get("stdout") or "").strip().splitlines() or ["(no output)"]
    errors = [line for line in lines if line.startswith("minidnn: error:")]
    return (errors or lines)[-1]


def outcome(result: dict) -> str:
    """'ran', 'refused' (before step one), 'failed mid-run', 'timed out' or 'failed'."""
    if result.get("timed_out"):
        return "timed out"
    if result.get("returncode") == 0:
        return "ran"
    line = error_line(result) or ""
    if "too small for" in line and "the least it can train in" in line:
        return "refused"
    if "memory budget exceeded" in line:
        return "refused" if SET_UP.search(line) else "failed mid-run"
    return "failed"


def least_named(line: str | None) -> int | None:
    """The least budget a refusal names (bytes, as printed), or None."""
    m = re.search(r"the least it can train in is (\S+)", line or "")
    return parse_bytes(m.group(1)) if m else None


def timed_steps(report: dict) -> list[float]:
    """The step times (seconds) of a run's steady steps: its report's `step_time_s` less the
    first WARMUP_STEPS (the runs' warm-up), the steps captured as CUDA graphs and the steps
    traced (minidnn/report.py, steady_step_times)."""
    return steady_step_times(report)


#: Layer kinds a traced cell lists under the table: those furthest from their prediction.
KINDS_LISTED = 4


def traced_kinds(trace_path: str, report_path: str, report: dict) -> dict:
    """A traced cell's layer calls beside the step model's (scripts/model_vs_trace.py), by
    phase and layer kind: {'kinds': the KINDS_LISTED rows furthest from their prediction,
    milliseconds per pass, 'held': was the trace held, 'unheld_calls'}, or {'trace_error'}."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import model_vs_trace as mvt
    try:
        with open(trace_path) as f:
            trace = json.load(f)
        measured, _ = mvt.measured_calls(trace)
        plan = mvt.plan_of_run(report_path, report)
        rows, _ = mvt.compare(measured, mvt.predicted_calls(plan), mvt.layer_kinds(plan),
                              int(report.get("micro_batches") or 1))
    except (OSError, ValueError, KeyError, SystemExit) as e:
        return {"trace_error": f"{type(e).__name__}: {e}"}
    rows.sort(key=lambda r: -abs(r["measured"] - r["predicted"]))
    held = mvt.held_of(trace) or {}
    return {"kinds": [{"phase": r["phase"], "kind": r["kind"], "calls": r["calls"],
                       "predicted_ms": r["predicted"] * 1e3, "measured_ms": r["measured"] * 1e3}
                      for r in rows[:KINDS_LISTED]],
            "held": bool(held.get("held")), "unheld_calls": held.get("unheld_calls", 0)}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(predicted, measured) -> float | None:
    """predicted / measured, or None where either is missing."""
    return None if predicted is None or not measured else predicted / measured


def verdict(r: float | None, target: float) -> str | None:
    """'pass' when predicted/measured lies within `target` of 1, else 'fail' (None: not
    measured)."""
    return None if r is None else ("pass" if abs(r - 1) <= target + 1e-12 else "fail")


class Matrix:
    """The runs of one invocation: settings, the clock, the cells done."""

    def __init__(self, opts):
        self.opts = opts
        self.started = time.time()
        self.cells: list[dict] = []
        self.skipped: list[str] = []
        os.makedirs(opts.out, exist_ok=True)

    def left_s(self) -> float:
        return self.opts.time_limit - (time.time() - self.started)

    def train_args(self, model: str, precision: str, split: bool, budget: int | None,
                   report: str, policy: str) -> list[str]:
        o = self.opts
        args = ["train", "--model", model, "--data", "synthetic", "--batch", str(o.batch),
                "--steps", str(o.steps), "--device", o.device, "--precision", precision,
                "--policy", policy, "--eval-every", "0", "--eval-batches", "1",
                "--no-progress", "--log-every", str(o.steps), "--report", report]
        if o.image_size:
            args += ["--image-size", str(o.image_size)]
        if budget is not None:
            args += ["--memory-budget", str(int(budget))]
        if o.relu_bits and policy == "dyn":
            args.append("--relu-bits")
        if split:
            args.append("--split-batch-statistics")
        if not o.graphs:
            args.append("--no-graphs")
        return args

    def plan_args(self, model: str, precision: str, split: bool) -> list[str]:
        o = self.opts
        args = ["plan", "--json", "--model", model, "--batch", str(o.batch),
                "--precision", precision, "--num-classes", "1000"]
        if o.image_size:
            args += ["--image-size", str(o.image_size)]
        if o.relu_bits:
            args.append("--relu-bits")
        if split:
            args.append("--split-batch-statistics")
        return args

    def run(self, args: list[str]) -> dict:
        """One `minidnn` command: in its own process with a timeout, or --in-process."""
        return run_minidnn(args, min(self.opts.timeout, self.left_s()), self.opts.in_process)

    def name(self, model: str, precision: str, split: bool, what: str) -> str:
        return f"{model}-{precision}{'-split' if split else ''}-{what}"

    # -- a row of the table ------------------------------------------------------------------
    def row(self, model: str, precision: str, split: bool) -> None:
        """The unconstrained run, the least budget, then every fraction's cell."""
        o = self.opts
        base = dict(model=model, precision=precision, split_batch_statistics=split)
        path = os.path.join(o.out, self.name(model, precision, split, "none") + ".json")
        free = self.run(self.train_args(model, precision, split, None, path, "none"))
        if outcome(free) != "ran":
            self.cells.append(dict(base, budget="none", outcome=outcome(free),
                                   error=error_line(free), wall_s=free["wall_s"]))
            return
        with open(path) as f:
            unconstrained = json.load(f)
        peak = unconstrained.get("steady_peak_device_bytes") or \
            unconstrained["peak_device_bytes"]
        self.cells.append(dict(base, budget="none", budget_bytes=None, outcome="ran",
                               measured_peak_bytes=peak, images_per_s=unconstrained.get(
                                   "images_per_s"), wall_s=free["wall_s"]))
        if self.left_s() <= 0:
            self.skipped.append(self.name(model, precision, split, "budgets"))
            return
        least = self.least_budget(model, precision, split, base)
        for fraction in o.fractions:
            label = fraction if fraction == "least" else f"{float(fraction):.0%}"
            if self.left_s() <= 0:
                self.skipped.append(self.name(model, precision, split, label))
                continue
            budget = least if fraction == "least" else int(float(fraction) * peak)
            if budget is None:
                self.cells.append(dict(base, budget=label, outcome="no least budget named"))
                continue
            self.cell(model, precision, split, label, budget, base)
            self.write()      # each cell on disk as it ends: a killed run keeps what ran

    def least_budget(self, model: str, precision: str, split: bool, base: dict) -> int | None:
        """The figure a too-small budget's refusal names (as printed), with plan's beside it
        in the cell recorded for it."""
        path = os.path.join(self.opts.out, self.name(model, precision, split, "probe") + ".json")
        probe = self.run(self.train_args(model, precision, split, 4096, path, "dyn"))
        line = error_line(probe)
        least = least_named(line)
        # Planned at an ample budget (1 TiB), which any step fits: its least budget beside.
        plan = self.run(self.plan_args(model, precision, split)
                        + ["--memory-budget", str(2**40)])
        planned = None
        if plan.get("returncode") == 0:
            planned = json.loads(plan["stdout"]).get("minimum_budget_bytes")
        self.cells.append(dict(base, budget="4 KiB probe", outcome=outcome(probe), error=line,
                               least_from_train_bytes=least, least_from_plan_bytes=planned,
                               wall_s=probe["wall_s"]))
        return least

    def cell(self, model: str, precision: str, split: bool, label: str, budget: int,
             base: dict) -> None:
        o = self.opts
        name = self.name(model, precision, split, label)
        path = os.path.join(o.out, name + ".json")
        args = self.train_args(model, precision, split, budget, path, "dyn")
        trace = os.path.join(o.out, name + ".trace.json") if o.trace else None
        if trace:
            args += ["--trace", trace] + (["--trace-held"] if o.device == "gpu" else [])
        result = self.run(args)
        cell = dict(base, budget=label, budget_bytes=budget, outcome=outcome(result),
                    error=error_line(result), wall_s=result["wall_s"])
        if cell["outcome"] == "ran":
            with open(path) as f:
                report = json.load(f)
            cell.update(micro_batches=report.get("micro_batches"), chunks=report.get("chunks"),
                        images_per_s=report.get("images_per_s"))
            cell.update(self.compare(model, precision, split, path, report))
            if trace:
                cell.update(traced_kinds(trace, path, report))
        self.cells.append(cell)

    def compare(self, model: str, precision: str, split: bool, path: str,
                report: dict) -> dict:
        """`minidnn plan --report RUN.json --json`'s predicted peak and step beside the
        measured ones: the run's steady peak and the median of its timed steps
        (timed_steps), as predicted/measured ratios with their verdicts."""
        result = self.run(self.plan_args(model, precision, split) + ["--report", path])
        if result.get("returncode") != 0:
            return {"plan_error": f"plan: {error_line(result)}"}
        rows = {r["quantity"]: r for r in json.loads(result["stdout"])["comparison"]["rows"]}
        timed = timed_steps(report)
        return compared(rows["peak device memory"]["predicted"],
                        rows["peak device memory"]["measured"],
                        rows["step time (s)"]["predicted"], median(timed), len(timed))

    # -- output --------------------------------------------------------------------------------
    def write(self) -> tuple[str, str]:
        o = self.opts
        settings = {k: v for k, v in vars(o).items()}
        data = {"settings": settings, "targets": {"peak": PEAK_TARGET, "step": STEP_TARGET},
                "cells": self.cells, "skipped": self.skipped,
                "wall_s": round(time.time() - self.started, 1)}
        json_path = os.path.join(o.out, "matrix.json")
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)
        md_path = os.path.join(o.out, "matrix.md")
        with open(md_path, "w") as f:
            f.write(markdown(data) + "\n")
        return json_path, md_path


def compared(predicted_peak, measured_peak, predicted_step, measured_step,
             timed: int) -> dict:
    """A cell's predicted against measured figures: the ratios, their errors and verdicts
    (peak within PEAK_TARGET, step within STEP_TARGET)."""
    peak, step = ratio(predicted_peak, measured_peak), ratio(predicted_step, measured_step)
    return dict(predicted_peak_bytes=predicted_peak, measured_peak_bytes=measured_peak,
                peak_ratio=peak, peak_error=None if peak is None else peak - 1,
                peak_verdict=verdict(peak, PEAK_TARGET),
                peak_within_target=None if peak is None else verdict(peak, PEAK_TARGET) == "pass",
                predicted_step_s=predicted_step, measured_step_s=measured_step,
                timed_steps=timed, step_ratio=step,
                step_error=None if step is None else step - 1,
                step_verdict=verdict(step, STEP_TARGET),
                step_within_target=None if step is None else verdict(step, STEP_TARGET) == "pass")


def _ratio(c: dict, what: str) -> str:
    """'0.987 pass' for a cell's predicted/measured `what` ('peak' or 'step'), else '-'."""
    r = c.get(f"{what}_ratio")
    return "-" if r is None else f"{r:.3f} {c[f'{what}_verdict']}"


def _size(v) -> str:
    return "-" if v is None else fmt_bytes(v)


def markdown(data: dict) -> str:
    """The table: one row per cell, then the targets missed and the cells skipped."""
    s = data["settings"]
    lines = [f"Combination matrix: batch {s['batch']}, {s['steps']} steps, device {s['device']}"
             f"{', relu bits' if s['relu_bits'] else ''}"
             f"{'' if s.get('graphs', True) else ', no CUDA graphs'} (targets: no failure mid-run, peak "
             f"within {PEAK_TARGET:.0%}, step within {STEP_TARGET:.0%})", "",
             f"Measured step: the median of the steps after the first {WARMUP_STEPS} (the "
             f"plans' measurement), captures as CUDA graphs left out.", "",
             "| model | precision | budget | outcome | peak predicted | peak measured "
             "| predicted/measured peak | step predicted | step measured (timed steps) "
             "| predicted/measured step | least (train / plan) | note |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for c in data["cells"]:
        model = c["model"] + (" (split statistics)" if c["split_batch_statistics"] else "")
        budget = c["budget"] + (f" = {fmt_bytes(c['budget_bytes'])}"
                                if c.get("budget_bytes") else "")
        step_p = c.get("predicted_step_s")
        step_m = c.get("measured_step_s")
        timed = c.get("timed_steps")
        least = ""
        if "least_from_train_bytes" in c:
            least = f"{_size(c['least_from_train_bytes'])} / {_size(c['least_from_plan_bytes'])}"
        note = c.get("error") or c.get("plan_error") or ""
        if c.get("micro_batches", 1) and c.get("micro_batches", 1) > 1:
            note = f"{c['micro_batches']} micro-batches " + note
        if c.get("chunks"):
            note = f"chunks {c['chunks']} " + note
        lines.append(
            f"| {model} | {c['precision']} | {budget} | {c['outcome']} "
            f"| {_size(c.get('predicted_peak_bytes'))} | {_size(c.get('measured_peak_bytes'))} "
            f"| {_ratio(c, 'peak')} "
            f"| {'-' if step_p is None else f'{step_p * 1e3:.1f} ms'} "
            f"| {'-' if step_m is None else f'{step_m * 1e3:.1f} ms ({timed})'} "
            f"| {_ratio(c, 'step')} | {least} | {note.replace('|', '/')} |")
    missed = [c for c in data["cells"] if c["outcome"] in ("failed mid-run", "failed",
                                                            "timed out")]
    off = [c for c in data["cells"] if c.get("peak_within_target") is False or
           c.get("step_within_target") is False]
    lines += ["", f"{len(missed)} cells failed or timed out; {len(off)} ran outside the "
                  f"peak or step target."]
    traced = [c for c in data["cells"] if c.get("kinds") or c.get("trace_error")]
    if traced:
        lines += ["", "Traced cells: the layer kinds furthest from the step model, per pass "
                      "(predicted / measured ms; a held trace times the device):", ""]
    for c in traced:
        model = c["model"] + (" (split statistics)" if c["split_batch_statistics"] else "")
        kinds = "; ".join(f"{k['phase']} {k['kind']} ({k['calls']}) {k['predicted_ms']:.2f} / "
                          f"{k['measured_ms']:.2f}" for k in c.get("kinds") or ())
        how = "held" if c.get("held") else "not held"
        if c.get("unheld_calls"):
            how += f", {c['unheld_calls']} calls issued past their hold"
        lines.append(f"- {model} {c['precision']} {c['budget']} ({how}): "
                     f"{kinds or c.get('trace_error')}")
    if data["skipped"]:
        lines.append(f"Skipped at the time limit ({s['time_limit']:g} s): "
                     f"{', '.join(data['skipped'])}.")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for matrix.json, matrix.md and runs")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--fractions", default="0.75,0.5,0.35,0.25,least",
                   help="budgets as fractions of the unconstrained peak, and 'least'")
    p.add_argument("--steps", type=int, default=12,
                   help=f"steps per run (default 12: {WARMUP_STEPS} warm-up, a capture, 9 "
                        f"timed)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--no-relu-bits", dest="relu_bits", action="store_false",
                   help="plan without --relu-bits (default: with them, as users run dyn)")
    p.add_argument("--time-limit", type=float, default=3 * 3600.0,
                   help="total wall-clock seconds; the cells left are skipped and listed")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="train with --no-graphs (every step issued layer by layer)")
    p.add_argument("--statistics", default="both", choices=("both", "whole", "split"),
                   help="rows of a network with BatchNorm: with whole-batch statistics, with "
                        "--split-batch-statistics, or both (default)")
    p.add_argument("--trace", action="store_true",
                   help="trace each budget cell's last step (held on a GPU) and list the "
                        "layer kinds furthest from the step model's prediction")
    p.add_argument("--in-process", action="store_true",
                   help="run every command in this process (no --timeout; the cells share "
                        "its CUDA context, kernels and measured cuDNN plans)")
    opts = p.parse_args(argv)
    opts.models = [m for m in opts.models.split(",") if m]
    opts.precisions = [m for m in opts.precisions.split(",") if m]
    opts.fractions = [f for f in opts.fractions.split(",") if f]
    for f in opts.fractions:
        if f != "least":
            try:
                ok = 0 < float(f) <= 1
            except ValueError:
                ok = False
            if not ok:
                p.error(f"--fractions: {f!r} is neither a fraction in (0, 1] nor 'least'")
    return opts


def batch_statistics(model: str) -> bool:
    """Has the network layers that normalize with the whole batch's statistics?"""
    from minidnn import models
    return bool(models.build(model, num_classes=10, image_size=None).batch_statistics_layers())


def main(argv=None) -> int:
    opts = parse_args(argv)
    matrix = Matrix(opts)
    for model in opts.models:
        # A network that normalizes with the whole batch's statistics (BatchNorm) also runs
        # with --split-batch-statistics, which lets dyn split its batch.
        splits = {"both": (False, True), "whole": (False,), "split": (True,)}[
            opts.statistics] if batch_statistics(model) else (False,)
        for precision in opts.precisions:
            for split in splits:
                if matrix.left_s() <= 0:
                    matrix.skipped.append(matrix.name(model, precision, split, "all budgets"))
                    continue
                matrix.row(model, precision, split)
                matrix.write()      # what is done is on disk, whatever comes next
    json_path, md_path = matrix.write()
    with open(md_path) as f:
        print(f.read())
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
