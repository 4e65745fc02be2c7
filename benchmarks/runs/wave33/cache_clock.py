#!/usr/bin/env python3
"""The combination matrix's cells predicted from layers timed two ways: from the L2 cache a
step leaves (the profile's timing method 9, planner/cache_state.py) and back to back with the
cache as the call before left it (method 8). scripts/matrix_gpu.py's cells run once, in this
process, predicted from method 9's profiles; then `minidnn plan --report` predicts each cell
that ran again from method 8's, measured into a profile cache of their own. So both
predictions stand beside the same measured step.

    python3 benchmarks/runs/wave33/cache_clock.py OUT -- --models alexnet --precisions fp32 \\
        --fractions 0.25,least --time-limit 100

writes OUT/matrix.json, OUT/matrix.md (method 9) and OUT/cache_clock.md: both side by side.
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


def shown(predicted, measured) -> str:
    if predicted is None or not measured:
        return "-"
    return f"{predicted / measured:.3f} ({predicted * 1e3:.1f} / {measured * 1e3:.1f} ms)"


def main() -> int:
    out, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    argv = rest + ["--in-process", "--out", out]
    matrix_gpu.main(argv)
    with open(os.path.join(out, "matrix.json")) as f:
        cells = [c for c in json.load(f)["cells"] if c.get("predicted_step_s") is not None]
    os.environ["MINIDNN_CACHE"] = os.environ.get("MINIDNN_CACHE", "/tmp/cache") + "_8"
    profile._Clock.__call__ = back_to_back
    matrix = matrix_gpu.Matrix(matrix_gpu.parse_args(argv))
    matrix.opts.time_limit = 1e9
    lines = ["| cell | method 9: predicted / measured step | method 8 |", "| --- | ---: | ---: |"]
    for c in cells:
        model, precision, split = c["model"], c["precision"], c["split_batch_statistics"]
        path = os.path.join(out, matrix.name(model, precision, split, c["budget"]) + ".json")
        with open(path) as f:
            again = matrix.compare(model, precision, split, path, json.load(f))
        lines.append(f"| {matrix.name(model, precision, split, c['budget'])} | "
                     f"{shown(c['predicted_step_s'], c['measured_step_s'])} | "
                     f"{shown(again.get('predicted_step_s'), c['measured_step_s'])} |")
        print(lines[-1], flush=True)
    with open(os.path.join(out, "cache_clock.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
