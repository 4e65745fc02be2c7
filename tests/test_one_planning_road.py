"""`minidnn plan` and `train --policy dyn` plan on one road: the least budget plan reports is
the one a run refuses a smaller budget with, and a run at that budget trains."""
import argparse
import functools
import json

import pytest

from minidnn import models
from minidnn.planner import command, dyn
from minidnn.planner.search import InfeasibleBudgetError
from minidnn.train import TrainConfig, make_executor

NET = dict(model="tiny_cnn", batch=256, image_size=32, num_classes=10)


def plan_json(*argv) -> dict:
    """`minidnn plan --gpu h200 --relu-bits --json` of NET, with feature maps laid out as a
    run on the CPU lays them out (NCHW)."""
    parser = argparse.ArgumentParser(prog="minidnn")
    command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", "--model", NET["model"], "--batch", str(NET["batch"]),
                              "--image-size", str(NET["image_size"]), "--num-classes",
                              str(NET["num_classes"]), "--gpu", "h200", "--relu-bits",
                              "--layout", "nchw", "--json", *argv])
    lines = []
    assert command.run(args, out=lines.append) == 0
    return json.loads("\n".join(lines))


def train_executor(budget: int, monkeypatch):
    """The executor `minidnn train --policy dyn --relu-bits` makes (train.make_executor), its
    dyn policy planning from the h200's analytic model as `plan --gpu h200` does."""
    monkeypatch.setattr(dyn, "DynPolicy", functools.partial(dyn.DynPolicy, gpu="h200"))
    cfg = TrainConfig(model=NET["model"], batch=NET["batch"], image_size=NET["image_size"],
                      num_classes=NET["num_classes"], device="cpu", policy="dyn",
                      memory_budget=budget, relu_bits=True)
    net = models.build(NET["model"], num_classes=NET["num_classes"],
                       image_size=NET["image_size"])
    return make_executor(cfg, net, device="cpu")


def test_plan_reports_the_least_budget_a_run_refuses_below(monkeypatch):
    loose = plan_json()
    least = loose["minimum_budget_bytes"]
    tight = plan_json("--memory-budget", str(2 * least))     # a plan that fits says it too
    assert tight["minimum_budget_bytes"] == least
    with pytest.raises(InfeasibleBudgetError) as refused:
        train_executor(least - 1, monkeypatch)
    assert refused.value.minimum == least
    with pytest.raises(InfeasibleBudgetError) as planned:
        plan_json("--memory-budget", str(least - 1))
    assert planned.value.minimum == least
    ex = train_executor(least, monkeypatch)       # and the least budget trains
    try:
        assert ex.simulate_step()["peak_device_bytes"] <= least
    finally:
        ex.close()


def test_the_least_budget_leaves_out_chunks_that_are_never_planned():
    """Layer chunks that lower their count's least budget by less than CHUNK_GAIN are never
    planned (split.py), so their least budget is no budget a step trains in."""
    from minidnn.planner.split import SplitOption, _least
    count = SplitOption(micro_batches=4, batch=16, minimum_budget=1000)
    small_gain = SplitOption(micro_batches=4, batch=16, chunks=(("a", "b", 2),),
                             minimum_budget=990, trains=False)
    gain = SplitOption(micro_batches=2, batch=32, chunks=(("a", "b", 2),),
                       minimum_budget=995)
    assert _least([count, small_gain]) is count
    assert _least([count, small_gain, gain]) is gain
