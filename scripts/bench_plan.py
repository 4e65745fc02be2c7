#!/usr/bin/env python3
"""How long `minidnn plan` takes: the planner's own time, on the CPU that runs it.

Each case runs `python3 -m minidnn plan ...` in its own process (imports included, as a user
waits for it), `--repeat` times, and prints the wall-clock seconds of each run, the best of
them, and the number of decisions the plan says it evaluated. No GPU is needed: the costs come
from the analytic model of --gpu, or from a profile file with --profile.

    python3 scripts/bench_plan.py                                   # the default cases
    python3 scripts/bench_plan.py --case vgg416:32:12GiB --case vgg16:256:4GiB
    python3 scripts/bench_plan.py --case vgg16:256:4GiB --profile benchmarks/profiles/vgg16-b256-h200.json
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CASES = ("vgg16:256:12GiB", "vgg16:256:4GiB", "vgg416:32:12GiB")


def plan_command(model: str, batch: str, budget: str, gpu: str, profile: str | None) -> list:
    """The `minidnn plan` command line of one case."""
    cmd = [sys.executable, "-m", "minidnn", "plan", "--model", model, "--batch", batch,
           "--memory-budget", budget]
    return cmd + (["--profile", profile] if profile else ["--gpu", gpu])


def time_plan(cmd: list) -> tuple[float, str]:
    """(wall-clock seconds, stdout) of one run of `cmd` in the repository root.

    Raises:
        RuntimeError: the command failed.
    """
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return seconds, done.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", metavar="MODEL:BATCH:BUDGET",
                    help=f"a case to time (repeatable; default {', '.join(DEFAULT_CASES)})")
    ap.add_argument("--gpu", default="h200", help="analytic model of this GPU (default h200)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="plan from this profile instead of --gpu")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per case")
    args = ap.parse_args(argv)
    print(f"minidnn plan, wall-clock seconds per run ({os.cpu_count()} CPUs; "
          f"{'profile ' + args.profile if args.profile else 'gpu ' + args.gpu})")
    print(f"{'case':<22}{'best s':>9}{'decisions':>11}  runs (s)")
    for case in args.case or DEFAULT_CASES:
        model, batch, budget = case.split(":")
        cmd = plan_command(model, batch, budget, args.gpu, args.profile)
        runs, out = [], ""
        for _ in range(max(args.repeat, 1)):
            seconds, out = time_plan(cmd)
            runs.append(seconds)
        found = re.search(r"\((\d+) decisions evaluated\)", out)
        decisions = found.group(1) if found else "-"
        print(f"{case:<22}{min(runs):>9.2f}{decisions:>11}  "
              f"{' '.join(f'{s:.2f}' for s in runs)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
