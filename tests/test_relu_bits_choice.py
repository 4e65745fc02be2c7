"""dyn weighs the ReLU bit masks asked for (`--relu-bits`) against a plan without them: the masks
free maps, but a ReLU that keeps bits cannot be applied in its convolution's epilogue. Under a
budget both fit, the plan predicted RELU_BITS_GAIN faster runs; where only the masks fit, they
stay; the least budget is the masks'. Planned here from the H200's analytic model, as
`minidnn plan --gpu h200` plans (on the GPU the same road measures both profiles)."""
import argparse
import functools
import json

import pytest

from minidnn import models
from minidnn.decide import decide
from minidnn.kernels.mapformat import MapFormat
from minidnn.memory.policy import relu_bits_for
from minidnn.planner import command, dyn
from minidnn.planner.planning import RELU_BITS_GAIN, ProfileSource, plan_step
from minidnn.planner.search import LOOKAHEADS
from minidnn.spec import StepSpec

GiB = 2**30


@functools.lru_cache(maxsize=None)
def vgg16():
    return models.build("vgg16", num_classes=1000)


def planned(budget: int, weigh: bool = True, micro_batches: int | None = None):
    """plan_step of VGG-16 b256 TF32 (channels last), asked for bit masks, from the model;
    micro_batches: that many passes (None: dyn's choice)."""
    net = vgg16()
    spec = StepSpec(batch=256, policy="dyn", memory_budget=budget, relu_bits=True,
                    micro_batches=micro_batches)
    options = dict(relu_bits=relu_bits_for(net), input_batches=dyn.RUN_INPUT_BATCHES)
    return plan_step(net, spec, ProfileSource(gpu="h200"), MapFormat("nhwc", "fp32"),
                     LOOKAHEADS, options, weigh_relu_bits=weigh)


def test_a_budget_both_fit_runs_the_faster_plan_without_the_masks():
    step = planned(4 * GiB)
    masks = step.other_bits
    assert step.relu_bits == frozenset() and masks.relu_bits == relu_bits_for(vgg16())
    assert step.chosen.best.fits and masks.chosen.best.fits
    ms = step.chosen.best.step_time_s
    assert ms * (1 + RELU_BITS_GAIN) <= masks.chosen.best.step_time_s
    # The least budget is the masks' (a smaller budget than the plan without them needs).
    assert step.least_budget() == masks.least_budget()
    unweighed = planned(4 * GiB, weigh=False)
    assert unweighed.relu_bits == masks.relu_bits and unweighed.other_bits is None
    assert unweighed.chosen.best.step_time_s == masks.chosen.best.step_time_s


def test_a_budget_only_the_masks_fit_keeps_them():
    # In 8 passes of 32 the maps hold much of the step (dyn's least budget, 64 passes of 4,
    # is mostly parameters: there the plan without the masks fits as well, and is faster).
    least = planned(4 * GiB, micro_batches=8).least_budget()
    step = planned(least, micro_batches=8)
    assert step.relu_bits == relu_bits_for(vgg16())
    assert step.chosen.best.fits and step.chosen.best.peak_bytes <= least
    assert step.other_bits.chosen is None       # without the masks nothing fits


def test_the_decision_runs_the_plan_without_masks_and_fuses_its_relus(monkeypatch):
    policy = dyn.DynPolicy(gpu="h200", input_batches=dyn.RUN_INPUT_BATCHES)
    spec = StepSpec(batch=256, policy=policy, memory_budget=4 * GiB, relu_bits=True,
                    layout="nhwc")
    decision = decide(vgg16(), spec, device="cpu")
    assert decision.relu_bits == frozenset()
    masked = decide(vgg16(), spec.replace(policy="none", memory_budget=None), device="cpu")
    assert masked.relu_bits == relu_bits_for(vgg16())
    # Each ReLU after a convolution is applied in its epilogue, bit masks or none: more pairs.
    assert set(masked.conv_relu) < set(decision.conv_relu)
    assert any(n.startswith("ReLU bit masks left off") for n in policy.notes)
    # Without a budget dyn plans nothing: the masks asked for stay.
    free = decide(vgg16(), spec.replace(policy=dyn.DynPolicy(gpu="h200"),
                                        memory_budget=None), device="cpu")
    assert free.relu_bits == relu_bits_for(vgg16())


def plan_json(*argv) -> dict:
    parser = argparse.ArgumentParser(prog="minidnn")
    command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", "--model", "vgg16", "--batch", "256", "--gpu", "h200",
                              "--relu-bits", "--json", *argv])
    lines = []
    assert command.run(args, out=lines.append) == 0
    return json.loads("\n".join(lines))


@pytest.mark.parametrize("policy, kept", [("dyn", False), ("none", True)])
def test_plan_says_which_masks_the_step_keeps(policy, kept):
    out = plan_json("--memory-budget", "4GiB", "--policy", policy)
    assert out["relu_bits"] == (sorted(relu_bits_for(vgg16())) if kept else [])
    left_off = [n for n in out["notes"] if n.startswith("ReLU bit masks left off")]
    assert bool(left_off) != kept


def test_a_run_says_it_left_the_masks_off_and_trains_in_its_budget(tmp_path, monkeypatch):
    """`minidnn train --policy dyn --relu-bits` on the CPU, dyn planning from the H200's model
    (as `plan --gpu h200`): a small VGG in 8 MiB runs without the masks, says so in a note
    and in its report, and stays inside the budget."""
    import os

    from minidnn.train import TrainConfig, train
    monkeypatch.setattr(dyn, "DynPolicy", functools.partial(dyn.DynPolicy, gpu="h200"))
    model = os.path.join(os.path.dirname(__file__), "matrix_models", "tiny_vgg.py")
    budget = 8 * 2**20
    cfg = TrainConfig(model=model, batch=64, image_size=32, num_classes=10, steps=2,
                      device="cpu", data="synthetic", policy="dyn", relu_bits=True,
                      memory_budget=budget, eval_every=0, progress=False,
                      report=str(tmp_path / "run.json"))
    lines = []
    train(cfg, log=lines.append)
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["relu_bits"] is True and report["relu_bits_kept"] == []
    assert any(line.startswith("note: ReLU bit masks left off") for line in lines)
    assert report["peak_device_bytes"] <= budget
