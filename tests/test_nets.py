"""The branching networks of models/: ResNets equal to torchvision's (parameter counts, names,
layouts), GoogLeNet as Caffe's bvlc_googlenet, and small ResNet and inception networks trained
on the CPU under every memory decision: the same bits as keeping everything."""
import json

import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.builder import NetBuilder
from minidnn.cli import main
from minidnn.decide import build_executor
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import (MemoryDecision, get_policy, recompute_candidates,
                                   relus_worth_bits)
from minidnn.models import googlenet, resnet
from minidnn.planner.dyn import FixedDecision

# torchvision's resnetN(num_classes=1000): sum of p.numel() over parameters().
TORCHVISION_COUNTS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
                      "resnet101": 44_549_160, "resnet152": 60_192_808}


@pytest.mark.parametrize("name", sorted(TORCHVISION_COUNTS))
def test_resnet_parameter_counts_are_torchvisions(name):
    assert models.build(name).num_params() == TORCHVISION_COUNTS[name]


def torchvision_resnet_keys(blocks, bottleneck):
    """The state dict keys of torchvision's ResNet, written out from its module tree."""
    bn = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    keys = ["conv1.weight"] + [f"bn1.{k}" for k in bn]
    for layer, count in enumerate(blocks, start=1):
        for i in range(count):
            block = f"layer{layer}.{i}"
            for j in range(1, 4 if bottleneck else 3):
                keys += [f"{block}.conv{j}.weight"] + [f"{block}.bn{j}.{k}" for k in bn]
            if i == 0 and (layer > 1 or bottleneck):
                keys += [f"{block}.downsample.0.weight"] + \
                    [f"{block}.downsample.1.{k}" for k in bn]
    return keys + ["fc.weight", "fc.bias"]


@pytest.mark.parametrize("name, blocks, bottleneck", [
    ("resnet18", (2, 2, 2, 2), False), ("resnet50", (3, 4, 6, 3), True)])
def test_resnet_state_dict_keys_and_layouts_are_torchvisions(name, blocks, bottleneck):
    net = models.build(name)
    net.init_params(0)
    state = net.state_dict()
    assert list(state) == torchvision_resnet_keys(blocks, bottleneck)
    assert state["conv1.weight"].shape == (64, 3, 7, 7)
    assert state["fc.weight"].shape == (1000, 512 * (4 if bottleneck else 1))
    if bottleneck:
        assert state["layer1.0.conv3.weight"].shape == (256, 64, 1, 1)
        assert state["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
        assert state["layer2.0.conv2.weight"].shape == (128, 128, 3, 3)   # the stride is here
        assert net.shapes["layer2.0.conv2"][-1] == 28 and net.shapes["layer2.0.conv1"][-1] == 56
    else:
        assert state["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
    assert state["layer4.0.bn1.running_var"].shape == (512,)
    assert net.shapes[net.output] == (1, 1000)


def test_googlenet_is_caffes_bvlc_googlenet():
    net = models.build("googlenet")
    shapes = net.shapes
    assert shapes["pool1.3x3_s2"] == (1, 64, 56, 56)
    assert shapes["inception_3a.output"] == (1, 256, 28, 28)
    assert shapes["inception_4e.output"] == (1, 832, 14, 14)
    assert shapes["inception_5b.output"] == (1, 1024, 7, 7)
    assert shapes["pool5.7x7_s1"] == (1, 1024, 1, 1)
    # The parameters, counted from Caffe's table of channels (weights and biases).
    expect, channels = 0, 192
    for c1, c3r, c3, c5r, c5, cp in googlenet.INCEPTION.values():
        expect += (channels + 1) * (c1 + c3r + c5r + cp) + (9 * c3r + 1) * c3 + \
            (25 * c5r + 1) * c5
        channels = c1 + c3 + c5 + cp
    expect += (3 * 49 + 1) * 64 + (64 + 1) * 64 + (64 * 9 + 1) * 192 + (1024 + 1) * 1000
    assert net.num_params() == expect == 6_998_552
    kinds = {type(n.layer).__name__ for n in net.nodes}
    assert {"Concat", "LRN", "MaxPool2d", "AvgPool2d", "Dropout"} <= kinds


def test_models_lists_every_network(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ["alexnet", "overfeat", "googlenet", "vgg16", "vgg416", "tiny_cnn", "mlp",
                 *TORCHVISION_COUNTS]:
        line = next(line for line in out.splitlines() if line.split()[0] == name)
        assert len(line.split()) > 5, line            # a description follows


# ---- small branching networks under every memory decision ----------------------------------------
def tiny_resnet():
    """Stem, a basic block, a bottleneck block that halves the map (downsample), head."""
    b = NetBuilder("tiny_resnet", 8, 5)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu")
    resnet.basic_block(b, "layer1.0", 8, 1)
    resnet.bottleneck_block(b, "layer2.0", 4, 2)
    b.global_avgpool("avgpool")
    b.flatten("flatten")
    b.linear("fc", 5)
    return b.finish()


def tiny_inception():
    """GoogLeNet's stem ideas (LRN, max-pool) and two inception modules on 8x8 maps."""
    b = NetBuilder("tiny_inception", 8, 5)
    b.conv("conv1", 8, 3, padding=1)
    b.relu("conv1.relu")
    b.lrn("norm1", size=3, alpha=1e-4, beta=0.75, k=1.0)
    googlenet.inception(b, "inception_a", 4, 4, 6, 2, 3, 3)
    googlenet.inception(b, "inception_b", 6, 4, 6, 2, 2, 2)
    b.maxpool("pool", 2)
    b.global_avgpool("avgpool")
    b.dropout("drop", 0.4)
    b.flatten("flatten")
    b.linear("fc", 5)
    return b.finish()


def train(make, decision=None, relu_bits=False, budget=None, steps=3, device="cpu",
          dropout=True, **kw):
    """The state dict (parameters and running statistics) after `steps` SGD steps under a
    MemoryDecision or a policy name (dropout=False: every dropout passes its input)."""
    rng = np.random.default_rng(0)
    net = make()
    policy = decision if isinstance(decision, str) else \
        FixedDecision(decision) if decision is not None else "none"
    with build_executor(net, 4, device=device, seed=0, policy=policy, relu_bits=relu_bits,
                        memory_budget=budget, **kw) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 5, 4), opt, dropout=dropout)
        stats = ex.memory_stats()
    return net.state_dict(), stats


def decisions(make):
    """Every kind of memory decision for the network `make` builds."""
    plan = LivenessPlan(make(), 4)
    everything = get_policy("all").decide(plan).offload
    recompute = frozenset([s.id for s in recompute_candidates(plan)])
    return {
        "all": get_policy("all").decide(plan),
        "conv": get_policy("conv").decide(plan),
        "recompute": MemoryDecision(recompute=recompute),
        "offload and recompute": MemoryDecision(offload=everything - recompute,
                                                recompute=recompute),
    }


@pytest.mark.parametrize("make", [tiny_resnet, tiny_inception])
def test_every_memory_decision_gives_the_same_bits_on_branching_networks(make):
    kept, kept_stats = train(make)
    assert int(kept.get("bn1.num_batches_tracked", 3)) == 3
    for label, decision in decisions(make).items():
        for budget in (None, "64MiB"):
            got, stats = train(make, decision, budget=budget)
            for key in kept:
                assert np.array_equal(got[key], kept[key]), (label, budget, key)
        if label != "recompute":
            assert stats["offloaded_bytes"] > 0, label
        if "recompute" in label:
            assert decision.recompute, label
            assert stats["avg_feature_map_bytes"] < kept_stats["avg_feature_map_bytes"], label
    assert relus_worth_bits(LivenessPlan(make(), 4))
    for policy in ("none", "all"):   # decided for the network with bit masks
        got, _ = train(make, policy, relu_bits=True)
        for key in kept:
            assert np.array_equal(got[key], kept[key]), ("relu bits", key)


def test_batch_norm_outputs_are_recomputed_and_their_statistics_move_once():
    plan = LivenessPlan(tiny_resnet(), 4)
    found = {plan.storages[s.id].tensors[0] for s in recompute_candidates(plan)}
    assert {"bn1", "layer1.0.bn1"} & found
    bn_outputs = frozenset([s.id for s in recompute_candidates(plan)
                                  if plan.nodes[s.producer].layer.kind == "batchnorm"])
    assert bn_outputs
    kept, _ = train(tiny_resnet)
    got, _ = train(tiny_resnet, MemoryDecision(recompute=bn_outputs))
    for key in kept:
        assert np.array_equal(got[key], kept[key]), key


# ---- the commands ------------------------------------------------------------------------------
def test_summary_plan_and_train_run_for_resnet_and_googlenet(capsys, tmp_path):
    for name in ("resnet50", "googlenet"):
        assert main(["summary", "--model", name, "--batch", "2"]) == 0
        out = capsys.readouterr().out
        assert f"total params {models.build(name).num_params():,}" in out
    for name, size in (("resnet18", 32), ("googlenet", 64)):
        report = tmp_path / f"{name}.json"
        assert main(["train", "--model", name, "--image-size", str(size), "--batch", "2",
                     "--steps", "2", "--device", "cpu", "--num-classes", "4", "--data",
                     "synthetic", "--policy", "all", "--report", str(report),
                     "--no-progress"]) == 0
        run = json.loads(report.read_text())
        assert len(run["loss"]) == 2 and all(np.isfinite(run["loss"]))
        assert run["offloaded_bytes"] > 0
        capsys.readouterr()


@pytest.mark.parametrize("name, size", [("resnet18", 32), ("googlenet", 64)])
def test_plan_gives_the_least_budget_of_a_branching_network(capsys, name, size):
    argv = ["plan", "--model", name, "--batch", "8", "--image-size", str(size), "--gpu", "h200",
            "--json"]
    assert main(argv) == 0
    loose = json.loads(capsys.readouterr().out)
    least = loose["minimum_budget_bytes"]
    # The least budget keeps the planner's reserve for fragmentation free, as every budget
    # does: at most the unconstrained step's need, with that reserve on top.
    from minidnn.planner.step_model import DEFAULT_RESERVE
    assert 0 < least <= loose["plan"]["required_bytes"] / (1 - DEFAULT_RESERVE)
    # Below the least budget the planner refuses, naming it.
    assert main(argv + ["--memory-budget", str(least // 2)]) == 2
    err = capsys.readouterr().err
    assert "too small" in err and "give --memory-budget" in err


def test_layers_of_a_resnet_are_measured_and_its_running_statistics_left_alone():
    from minidnn.backend import Device
    from minidnn.planner.profile import measure_layers
    net = tiny_resnet()
    net.init_params(0)
    before = net.state_dict()
    costs = measure_layers(net, 2, Device("cpu"), repeats=1, progress=False)
    assert costs["bn1"].forward_s["fastest"] > 0 and "layer2.0.add" in costs
    for key, value in net.state_dict().items():
        assert np.array_equal(value, before[key]), key


@pytest.fixture
def default_gpu_kernels():
    """Tests that ask for deterministic kernels put the default mode back after."""
    yield
    from minidnn import kernels
    from minidnn.backend import Device
    module = kernels.for_device(Device("gpu"))
    if hasattr(module, "configure"):
        module.configure()


@pytest.mark.gpu
@pytest.mark.parametrize("make", [tiny_resnet, tiny_inception])
def test_branching_networks_on_the_gpu(make, default_gpu_kernels):
    """Deterministic kernels: every decision the same bits as keeping everything; and, with
    dropout off, the CPU's numbers within float32 rounding (strict FP32 on the GPU)."""
    kept, _ = train(make, device="gpu", math="fp32", deterministic=True)
    for label, decision in decisions(make).items():
        got, _ = train(make, decision, device="gpu", math="fp32", deterministic=True)
        for key in kept:
            assert np.array_equal(got[key], kept[key]), (label, key)
    # The GPU draws dropout masks from CuPy's generator, the CPU from NumPy's: compare the
    # devices with dropout off.
    gpu, _ = train(make, device="gpu", math="fp32", deterministic=True, dropout=False)
    cpu, _ = train(make, dropout=False)
    for key in gpu:
        np.testing.assert_allclose(gpu[key], cpu[key], rtol=1e-3, atol=1e-4, err_msg=key)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("make", [tiny_resnet, tiny_inception])
def test_channels_last_maps_on_branching_networks(make, precision):
    """Channels-last maps (fp32 or bf16) give the parameters and running statistics of NCHW
    maps, within summation-order rounding, whatever the policy."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    want, _ = train(make, layout="nchw", precision=precision)
    for policy in ("none", "all"):
        got, _ = train(make, policy, layout="nhwc", precision=precision)
        for key, value in want.items():
            assert got[key].shape == value.shape, key
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{policy} {key}")
