#!/usr/bin/env python3
"""A walk-through a laptop runs in seconds: one training step of a tiny network under a plan
that offloads, prefetches and recomputes, printed event by event, each event with the line of
minidnn that issued it (docs/walkthrough.md reads it).

    python3 scripts/walkthrough.py                           # the schedule, event by event
    python3 scripts/walkthrough.py --trace runs/walk.json    # and a Chrome trace (Perfetto)
    minidnn plan --model scripts/walkthrough.py --num-classes 10 --image-size 32 --batch 32 \\
        --gpu k40 --memory-budget 8MiB --micro-batches 1 --chunks none --no-fuse  # its plan

The file is also a model file: `build(num_classes, image_size)` returns the tiny network, so
`minidnn plan --model scripts/walkthrough.py` and `minidnn train --model scripts/walkthrough.py`
take it as they take a built-in model.

How an event finds its line: while the step runs, Python's profiling hook (sys.setprofile)
sees every call of the memory manager's moves (MOVES below) and every layer the executor runs
(LAYER_CALL), and takes the line of the caller: the place in the manager that decided the
move, the place in the executor that ran the layer. Nothing is written down by hand, so
the lines follow the code. The plan comes from `minidnn.decide` with the dyn policy on the
analytic model of the paper's GPU (`DynPolicy(gpu="k40")`): the budget is small enough that the
plan must move maps, and the K40's slow copies make recomputing one map cheaper than copying it.
The step runs every layer in its own passes (`--no-fuse`), as vDNN's did: fused, each max pool
would apply the mask of the ReLU before it, whose map backward would then not read at all
(minidnn/fusion.py), leaving this small network's plan almost nothing to move.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from minidnn import SGD, Executor  # noqa: E402
from minidnn.builder import NetBuilder  # noqa: E402
from minidnn.cli import main as minidnn_main  # noqa: E402
from minidnn.decide import decide  # noqa: E402
from minidnn.errors import fmt_bytes  # noqa: E402
from minidnn.memory.manager import MemoryManager  # noqa: E402
from minidnn.planner import DynPolicy  # noqa: E402

BATCH = 32
IMAGE_SIZE = 32
CLASSES = 10
BUDGET = "8MiB"
GPU = "k40"
# The plan as `minidnn plan` makes it for this walk-through (one pass, no layer chunks).
PLAN_ARGS = ["--model", "scripts/walkthrough.py", "--num-classes", str(CLASSES), "--image-size",
             str(IMAGE_SIZE), "--batch", str(BATCH), "--gpu", GPU, "--memory-budget", BUDGET,
             "--micro-batches", "1", "--chunks", "none", "--no-fuse"]
# The memory manager's methods that make its moves (a rename fails the tests).
MOVES = ("_offload", "_leave_device", "_fetch")
# The executor's method that runs one layer call, and what it calls to run the layer (a rename
# leaves the schedule without layer calls, which the tests notice).
LAYER_CALL = "_call"
LAYER_RUNS = ("forward", "_layer_backward")
PACKAGE = str(ROOT / "minidnn")


def build(num_classes: int = CLASSES, image_size: int = IMAGE_SIZE):
    """The tiny network: two stages of two 3x3 convolutions (16, then 32 channels), each
    convolution followed by a ReLU, each stage by a 2x2 max-pool, then one linear layer.
    Input (3, image_size, image_size)."""
    b = NetBuilder("walkthrough", image_size, num_classes)
    for stage, channels in ((1, 16), (2, 32)):
        for k in (1, 2):
            b.conv(f"conv{stage}_{k}", channels, 3, padding=1)
            b.relu(f"relu{stage}_{k}")
        b.maxpool(f"pool{stage}", 2, stride=2)
    b.flatten("flatten")
    b.linear("fc", num_classes)
    return b.finish()


def where(frame) -> str:
    """'module:function:line' of a frame, the module relative to the package."""
    path = os.path.relpath(frame.f_code.co_filename, PACKAGE).replace(os.sep, "/")
    return f"{path.removesuffix('.py')}:{frame.f_code.co_name}:{frame.f_lineno}"


class Narrator:
    """Collects a step's events as [(clock, event, what, issued at)] through Python's profiling
    hook (`hook`, for sys.setprofile). The clock is the liveness plan's (forward of node i at
    time i, its backward at 2n-1-i)."""

    def __init__(self, ex: Executor):
        self.ex, self.events = ex, []
        self._moves = {getattr(MemoryManager, name).__code__: name for name in MOVES}
        self._layer_call = getattr(Executor, LAYER_CALL).__code__

    def hook(self, frame, event, arg):
        if event != "call":
            return
        caller = frame.f_back
        if frame.f_code in self._moves:
            self._move(self._moves[frame.f_code], frame.f_locals, caller)
        elif caller is not None and caller.f_code is self._layer_call and \
                frame.f_code.co_name in LAYER_RUNS:
            # The executor hands the layer its buffers: forward, recompute or backward.
            phase, node = caller.f_locals["phase"], caller.f_locals["node"]
            self.events.append((self.ex.manager.time, phase, node.name, where(caller)))

    def _move(self, move: str, args: dict, caller) -> None:
        manager = args["self"]
        if move == "_offload":
            kind, fm = "offload", manager.maps[args["sid"]]
        elif move == "_leave_device":
            fm = manager.maps[args["sid"]]
            if fm.device is None:           # nothing on the device to leave it
                return
            kind = args["why"]              # 'evict' (offloaded) or 'drop' (recomputed later)
        else:
            kind, fm = ("fetch on demand" if args["on_demand"] else "prefetch"), args["fm"]
        self.events.append((manager.time, kind, f"{fm.name} ({fmt_bytes(fm.nbytes)})",
                            where(caller)))


def plan_decision(net):
    """The decision of dyn for BUDGET on the K40 model, as `minidnn plan PLAN_ARGS` makes it."""
    return decide(net, BATCH, policy=DynPolicy(gpu=GPU), memory_budget=BUDGET,
                  micro_batches=1, chunks=(), fuse=False)


def run_step(trace: str | None = None):
    """One training step of the tiny network on the CPU under the plan, watched; returns
    (the decision, the events, the executor's memory_stats). trace: write the step's Chrome
    trace there."""
    net = build()
    decision = plan_decision(net)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH)
    ex = Executor(net, BATCH, device="cpu", memory_budget=BUDGET, fuse=False, decision=decision,
                  trace=bool(trace))
    try:
        narrator = Narrator(ex)
        opt = SGD(net.parameters(), lr=0.01, momentum=0.9)
        sys.setprofile(narrator.hook)
        try:
            ex.train_step(x, labels, opt)
        finally:
            sys.setprofile(None)
        if trace:
            Path(trace).parent.mkdir(parents=True, exist_ok=True)
            ex.tracer.write_chrome_trace(trace)
        return decision, narrator.events, ex.memory_stats()
    finally:
        ex.close()


def plan(*extra) -> dict:
    """`minidnn plan PLAN_ARGS EXTRA --json`: the walk-through's plan as the command prints it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = minidnn_main(["plan", *PLAN_ARGS, *extra, "--json"])
    if status:
        raise RuntimeError(f"minidnn plan: {err.getvalue().strip()}")
    return json.loads(out.getvalue())


def numbers() -> dict:
    """What docs/walkthrough.md quotes (scripts/make_docs.py): the schedule printed, the plan's
    figures and the exercises' answers. {key: (text, what it is)}."""
    n = {}
    _, events, _ = run_step()
    n["walk_schedule"] = (f"```text\n{format_events(events)}\n```",
                          "the walk-through's step, event by event")
    planned = plan()
    rows = {r["layer"]: r for r in planned["layers"]}
    n["walk_decision"] = (planned["decision"], "the walk-through's plan in one line")
    n["walk_lookahead"] = (str(planned["prefetch_lookahead"]), "its prefetch lookahead")
    for key, status in (("walk_offloaded", "offload"), ("walk_recomputed", "recompute")):
        n[key] = (", ".join(f"`{r['layer']}`" for r in planned["layers"]
                            if r["status"].split()[0] == status) or "none",
                  f"the maps the plan marks {status}")
    n["walk_nodes"] = (str(len(build().nodes)), "the network's nodes")
    n["walk_needs"] = (fmt_bytes(planned["plan"]["required_bytes"]), "the plan: needs")
    n["walk_minimum"] = (fmt_bytes(planned["minimum_budget_bytes"]), "the plan: least budget")
    # Exercise 1: a map's bytes: batch x channels x height x width x 4.
    n["ex1_answer"] = (fmt_bytes(rows["conv1_1"]["bytes"]), "conv1_1's output")
    # Exercise 2: what the step needs with nothing moved, against the budget.
    none = plan("--policy", "none")
    n["ex2_answer"] = (fmt_bytes(none["plan"]["required_bytes"]), "needs under none")
    # Exercise 3: under vDNN_all, the bytes that go out (and come back) per step.
    everything = plan("--policy", "all")
    n["ex3_answer"] = (fmt_bytes(everything["plan"]["offloaded_bytes"]),
                       "bytes offloaded per step under all")
    # Exercise 4: what the step needs when the batch doubles, nothing moved.
    n["ex4_answer"] = (fmt_bytes(plan("--policy", "none", "--batch", str(2 * BATCH))["plan"]
                                 ["required_bytes"]), "needs under none at twice the batch")
    return n


def format_events(events) -> str:
    """The events as a table: clock, event, what, issued at."""
    lines = [f"{'t':>3}  {'event':<16}{'what':<26}issued at",
             f"{'-' * 3}  {'-' * 15} {'-' * 25} {'-' * 40}"]
    for time, kind, what, at in events:
        lines.append(f"{time:>3}  {kind:<16}{what:<26}{at}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=None, metavar="PATH.json",
                        help="also write the step's Chrome trace (open it in Perfetto)")
    args = parser.parse_args(argv)
    decision, events, stats = run_step(args.trace)
    planned = plan()
    print(f"{planned['network']}: batch {BATCH}, {IMAGE_SIZE}x{IMAGE_SIZE} images; dyn's plan "
          f"for {BUDGET} on the {GPU} model: {planned['decision']}; prefetch lookahead "
          f"{decision.prefetch_lookahead}\n")
    print(format_events(events))
    print(f"\noffloaded {fmt_bytes(stats['offloaded_bytes'])}, prefetched "
          f"{fmt_bytes(stats['prefetched_bytes'])}; peak device memory "
          f"{fmt_bytes(stats['peak_device_bytes'])}")
    if args.trace:
        print(f"trace: {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
