"""The planner's choice of micro-batches (planner/split.py): the profile rule for other
batches, checked against a profile measured there, and the joint search."""
import contextlib
import io
import json
from pathlib import Path

import pytest

from minidnn import models
from minidnn.cli import main
from minidnn.decide import build_executor
from minidnn.memory.policy import relu_bits_for
from minidnn.planner.dyn import DynPolicy
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.profile import load_profile
from minidnn.planner.split import PRUNE_WITHIN, micro_batch_counts, plan_split, scale_profile

PROFILES = Path(__file__).resolve().parents[1] / "benchmarks" / "profiles"
GiB = 2**30


def vgg16():
    """(VGG-16, the ReLUs that keep bit masks in the runs the profiles are of)."""
    net = models.build("vgg16", num_classes=1000)
    return net, relu_bits_for(net)


def total(profile, what):
    return sum(what(cost) for cost in profile.layers.values())


def test_counts_are_powers_of_two_that_divide_the_batch():
    assert micro_batch_counts(256) == [1, 2, 4, 8, 16, 32, 64]
    assert micro_batch_counts(12) == [1, 2, 4]
    assert micro_batch_counts(1) == [1]


def test_a_profile_scaled_to_batch_128_matches_the_one_measured_there():
    net, bits = vgg16()
    measured = load_profile(PROFILES / "vgg16-b128-h200.json")
    scaled = scale_profile(load_profile(PROFILES / "vgg16-b256-h200.json"), net, 128, bits)
    scaled.check_matches(net, 128, bits)
    device = total(scaled, lambda c: c.time("forward") + c.time("backward"))
    want = total(measured, lambda c: c.time("forward") + c.time("backward"))
    assert device == pytest.approx(want, rel=0.02)
    big = ("conv1_2", "conv2_2", "conv3_2")     # the calls that matter most, one by one
    for name in big:
        assert scaled.layer(name).time("backward") == pytest.approx(
            measured.layer(name).time("backward"), rel=0.05), name
    workspace = total(scaled, lambda c: c.max_workspace())
    assert workspace == pytest.approx(total(measured, lambda c: c.max_workspace()), rel=0.1)
    assert scaled.layer("conv1_2").host_s == \
        load_profile(PROFILES / "vgg16-b256-h200.json").layer("conv1_2").host_s


def test_vgg16_b256_trains_in_2_5_gib_in_micro_batches():
    net, bits = vgg16()
    prof = load_profile(PROFILES / "vgg16-b256-h200.json")
    split = plan_split(net, 256, lambda b: scale_profile(prof, net, b, bits), int(2.5 * GiB),
                       (0,), counts=[1, 16, 32, 64], relu_bits=bits)
    assert split.minimum_budget <= 2.5 * GiB
    unsplit = split.options[0]
    assert unsplit.result is None and unsplit.minimum_budget > 8 * GiB   # 8.43 GiB measured
    chosen = split.chosen
    assert chosen is not None and chosen.micro_batches >= 16
    assert chosen.best.fits and chosen.best.required_bytes <= 2.5 * GiB


def test_in_12_gib_a_split_step_is_predicted_faster_than_offload_and_recompute():
    net, bits = vgg16()
    prof = load_profile(PROFILES / "vgg16-b256-h200.json")
    split = plan_split(net, 256, lambda b: scale_profile(prof, net, b, bits), 12 * GiB, (0, 1),
                       counts=[1, 2], chunks=(), relu_bits=bits)
    whole, halves = split.options
    assert split.chosen is halves
    # Two passes fit moving nothing, so they are planned first and bound the one pass's
    # searches: no plan of it that fits came within PRUNE_WITHIN of them.
    assert not halves.best.offload and not halves.best.recompute
    assert whole.result is None and whole.error is None
    assert whole.skipped == "no plan that fits is faster than the one chosen"
    unbounded = whole.planner.run()
    assert unbounded.best.offload or unbounded.best.recompute
    assert halves.best.step_time_s < unbounded.best.step_time_s / (1 + PRUNE_WITHIN)
    # The chosen count's plan is pruned (pruning it again gains nothing).
    assert halves.pruned
    again = halves.planner.prune(halves.best)
    assert again.step_time_s == halves.best.step_time_s
    # Two passes: twice a pass's compute, the second's gradient adds, the fully connected
    # layers' gradients once (minidnn/gathered.py), one optimizer update. Of a fused ReLU,
    # the share of its passes left (minidnn/fusion.py): the ReLUs before max pools keep
    # nothing, bits neither, so their convolutions apply them, and their pools apply their
    # masks. Of a gathered layer's backward, its input gradient's: its forward's time.
    model = halves.result.model
    relus = {"relu1_2", "relu2_2", "relu3_3", "relu4_3", "relu5_3"}
    assert model.gathered == {"fc6", "fc7", "fc8"}
    assert set(model.forward_share) == relus
    assert set(model.backward_share) == relus | model.gathered
    layers = model.profile.layers
    for fc in model.gathered:
        assert layers[fc].time("backward") * model.backward_share[fc] == \
            pytest.approx(layers[fc].time("forward"))
    assert model.gathered_s == pytest.approx(sum(
        layers[fc].time("backward") - layers[fc].time("forward") for fc in model.gathered))
    pass_s = sum(c.time("forward") * model.forward_share.get(n, 1.0) +
                 c.time("backward") * model.backward_share.get(n, 1.0)
                 for n, c in model.profile.layers.items())
    plain = model.evaluate(frozenset(), model.algos("fastest"))
    adds = model.profile.accumulate_s    # 0: this profile was measured before the adds were
    assert plain.compute_s == pytest.approx(2 * pass_s + adds + model.gathered_s +
                                            prof.optimizer_s, rel=1e-9)


def test_dyn_chooses_micro_batches_and_the_executor_runs_them():
    net = models.build("tiny_cnn", num_classes=10, image_size=32)
    batch = 64
    least = {}
    for k in (1, 2):
        split = plan_split(net, batch, lambda b: analytic_profile(net, b, "h200"), 2**40, (1,),
                           counts=[k])
        least[k] = split.minimum_budget
    assert least[2] < least[1]
    budget = (least[1] + least[2]) // 2             # one pass of 64 cannot fit; two of 32 can
    policy = DynPolicy(gpu="h200")      # (layer chunks: tests/test_planner_chunks.py)
    with build_executor(net, batch, device="cpu", policy=policy, memory_budget=budget,
                        compute=False, chunks=()) as ex:
        assert ex.micro_batches == ex.decision.micro_batches >= 2
        assert ex.plan.batch == batch // ex.micro_batches
        assert ex.simulate_step()["peak_device_bytes"] <= budget
    forced = DynPolicy(gpu="h200")
    with build_executor(net, batch, device="cpu", policy=forced, memory_budget=2**40,
                        compute=False, micro_batches=4) as ex:
        assert ex.micro_batches == 4 and ex.plan.batch == 16
        assert [o.micro_batches for o in forced.split.options] == [4]


def plan_command(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--model", "tiny_cnn", "--image-size", "32", "--batch", "64",
                     "--gpu", "h200", *argv]) == 0
    return out.getvalue()


def test_the_plan_command_shows_the_counts_weighed_and_takes_a_forced_one():
    loose = json.loads(plan_command("--json"))
    counts = [o["micro_batches"] for o in loose["micro_batch_options"]]
    assert counts[0] == 1 and loose["micro_batches"] == 1     # the whole GPU: no need to split
    least = [o["minimum_budget_bytes"] for o in loose["micro_batch_options"]]
    assert loose["minimum_budget_bytes"] == min(least) < least[0]
    tight = json.loads(plan_command("--json", "--memory-budget", str(least[1] + 4096),
                                    "--chunks", "none"))
    assert tight["micro_batches"] >= 2 and tight["micro_batch"] * tight["micro_batches"] == 64
    text = plan_command("--memory-budget", str(least[1] + 4096), "--chunks", "none")
    assert "micro-batch counts and layer chunks weighed" in text and "(chosen)" in text
    assert f"as {tight['micro_batches']} micro-batches of {tight['micro_batch']}" in text
    forced = json.loads(plan_command("--json", "--micro-batches", "4"))
    assert forced["micro_batches"] == 4 and len(forced["micro_batch_options"]) == 1
