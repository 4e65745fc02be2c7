#!/usr/bin/env python3
"""How long `minidnn plan` takes: the planner's own time, on the CPU that runs it.

Each case runs `python3 -m minidnn plan ...` in its own process (imports included, as a user
waits for it), `--repeat` times, and prints the wall-clock seconds of each run, the best of
them, the CPU seconds of the best run (user + system: what the planner itself spent, which
other work on the machine does not inflate as it does the wall clock), and the number of
decisions the plan says it evaluated. No GPU is needed: the costs come
from the analytic model of --gpu, or from a profile file with --profile. With --as-measured
each case plans from a file holding the analytic profile marked as measured, which takes the
path of a measured profile (scaled to each micro-batch, not modelled again).

    python3 scripts/bench_plan.py                                   # the default cases
    python3 scripts/bench_plan.py --case vgg416:32:12GiB --case vgg16:256:4GiB
    python3 scripts/bench_plan.py --case vgg416:32:12GiB --as-measured
    python3 scripts/bench_plan.py --case vgg16:256:4GiB --profile benchmarks/profiles/vgg16-b256-h200.json
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CASES = ("vgg16:256:12GiB", "vgg16:256:4GiB", "vgg416:32:12GiB")


def plan_command(model: str, batch: str, budget: str, gpu: str, profile: str | None) -> list:
    """The `minidnn plan` command line of one case."""
    cmd = [sys.executable, "-m", "minidnn", "plan", "--model", model, "--batch", batch,
           "--memory-budget", budget]
    return cmd + (["--profile", profile] if profile else ["--gpu", gpu])


def measured_copy(model: str, batch: int, gpu: str, folder: str) -> str:
    """Write the analytic profile of `model` at `batch` on `gpu`, marked as measured, into
    `folder`; returns the file's path."""
    sys.path.insert(0, REPO)
    from minidnn import models
    from minidnn.planner import analytic_profile
    from minidnn.planner.profile import save_profile
    net = models.build(model)
    prof = dataclasses.replace(analytic_profile(net, batch, gpu), source="measured")
    path = os.path.join(folder, f"{model}-b{batch}-{gpu}.json")
    save_profile(prof, path)
    return path


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def time_plan(cmd: list) -> tuple[float, float, str]:
    """(wall-clock seconds, CPU seconds, stdout) of one run of `cmd` in the repository root.

    Raises:
        RuntimeError: the command failed.
    """
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return seconds, cpu, done.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", metavar="MODEL:BATCH:BUDGET",
                    help=f"a case to time (repeatable; default {', '.join(DEFAULT_CASES)})")
    ap.add_argument("--gpu", default="h200", help="analytic model of this GPU (default h200)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="plan from this profile instead of --gpu")
    ap.add_argument("--as-measured", action="store_true",
                    help="plan from the analytic profile of --gpu saved as a measured one")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per case")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="also write each case's printed plan to DIR/MODEL-bBATCH-BUDGET.txt "
                         "(to compare the plans of two commits)")
    args = ap.parse_args(argv)
    source = f"profile {args.profile}" if args.profile else f"gpu {args.gpu}" + \
        (", its profile as if measured" if args.as_measured else "")
    print(f"minidnn plan, wall-clock seconds per run ({os.cpu_count()} CPUs; {source})")
    print(f"{'case':<22}{'best s':>9}{'CPU s':>8}{'decisions':>11}  runs (s)")
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as folder:
        for case in args.case or DEFAULT_CASES:
            run_case(case, args, folder)
    return 0


def run_case(case: str, args, folder: str) -> None:
    """Time one MODEL:BATCH:BUDGET case `args.repeat` times and print its row."""
    model, batch, budget = case.split(":")
    profile = measured_copy(model, int(batch), args.gpu, folder) if args.as_measured \
        else args.profile
    cmd = plan_command(model, batch, budget, args.gpu, profile)
    runs, out = [], ""
    for _ in range(max(args.repeat, 1)):
        seconds, cpu, out = time_plan(cmd)
        runs.append((seconds, cpu))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        suffix = "-measured" if args.as_measured else ""
        with open(os.path.join(args.out, f"{model}-b{batch}-{budget}{suffix}.txt"), "w") as f:
            f.write(out)
    found = re.search(r"\((\d+) decisions evaluated\)", out)
    decisions = found.group(1) if found else "-"
    best, cpu = min(runs)
    print(f"{case:<22}{best:>9.2f}{cpu:>8.2f}{decisions:>11}  "
          f"{' '.join(f'{s:.2f}' for s, _ in runs)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
