#!/usr/bin/env python3
"""The combination matrix's cells predicted from layers timed two ways: from the L2 cache a
step leaves (the profile's timing method 9, planner/cache_state.py) and back to back with the
cache as the call before left it (method 8). Each clock runs scripts/matrix_gpu.py's cells in
this process with its own profile cache, so each cell's step is measured in both runs and
predicted from each clock's profile.

    python3 benchmarks/runs/wave33/cache_clock.py OUT -- --models alexnet --precisions fp32 \\
        --fractions 0.25,least --time-limit 100

writes OUT/step/ and OUT/back_to_back/ (matrix.json, matrix.md) and OUT/cache_clock.md: the
cells side by side.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import matrix_gpu  # noqa: E402
from minidnn.planner import profile  # noqa: E402

STEP_CLOCK = profile._Clock.__call__


def back_to_back(self, fn, repeats, warmup=1, warm=None):
    """The clock of timing method 8: the calls back to back, whatever the cache holds."""
    return STEP_CLOCK(self, fn, repeats, warmup)


def cells(path: str) -> dict:
    with open(path) as f:
        return {(c["model"], c["precision"], c["split_batch_statistics"], c["budget"]): c
                for c in json.load(f)["cells"]}


def main() -> int:
    out, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    base = os.environ.get("MINIDNN_CACHE", "/tmp/cache")
    for clock, call in (("step", STEP_CLOCK), ("back_to_back", back_to_back)):
        os.environ["MINIDNN_CACHE"] = f"{base}_{clock}"
        profile._Clock.__call__ = call
        matrix_gpu.main(rest + ["--in-process", "--out", os.path.join(out, clock)])
    step, b2b = (cells(os.path.join(out, c, "matrix.json")) for c in ("step", "back_to_back"))
    lines = ["| cell | from the step's cache: predicted / measured step | back to back |",
             "| --- | ---: | ---: |"]

    def ratio(c) -> str:
        if not c or c.get("predicted_step_s") is None or not c.get("measured_step_s"):
            return (c or {}).get("outcome", "not run")
        p, m = c["predicted_step_s"], c["measured_step_s"]
        return f"{p / m:.3f} ({p * 1e3:.1f} / {m * 1e3:.1f} ms)"
    for key in sorted(set(step) | set(b2b), key=str):
        lines.append(f"| {' '.join(str(k) for k in key if k not in (None, False))} | "
                     f"{ratio(step.get(key))} | {ratio(b2b.get(key))} |")
    with open(os.path.join(out, "cache_clock.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
