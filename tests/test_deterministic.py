"""Deterministic mode (layers/slices.py): sums over the batch in fixed slices, added in one
order, so every micro-batch count, layer chunk and policy gives the same bits, on the CPU in
float32 (where another grouping of a sum shows in the last bits)."""
import numpy as np
import pytest

from minidnn import SGD
from minidnn.cli import main
from minidnn.decide import build_executor, decide
from minidnn.errors import ConfigError
from minidnn.layers import Add, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU
from minidnn.layers.slices import deterministic_slice
from minidnn.network import Network
from minidnn.planner.dyn import DynPolicy
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.split import plan_split

BATCH = 16          # slices of 2 images: at most 8 parts
STEPS = 3


def vgg_net() -> Network:
    """Two VGG stages and a classifier with dropout; the ReLUs add the convolutions' biases
    (minidnn/fusion.py), so their bias gradients are sliced too."""
    net = Network((3, 16, 16), num_classes=10, name="vgg", dtype=np.float32)
    net.add(Conv2d(8, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(8, 3, padding=1), name="conv2")
    net.add(ReLU(), name="relu2")
    net.add(MaxPool2d(2), name="pool1")
    net.add(Conv2d(16, 3, padding=1), name="conv3")
    net.add(ReLU(), name="relu3")
    net.add(MaxPool2d(2), name="pool2")
    net.add(Flatten(), name="flat")
    net.add(Linear(32), name="fc1")
    net.add(ReLU(), name="relu4")
    net.add(Dropout(0.5), name="drop")
    net.add(Linear(10), name="fc2")
    net.add_loss()
    return net


def resnet_net() -> Network:
    """A stem (two convolutions, a chain layer chunks may cut), then conv-BN-ReLU and a
    residual block with BatchNorm, and a classifier."""
    net = Network((3, 16, 16), num_classes=10, name="resnet", dtype=np.float32)
    net.add(Conv2d(8, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(8, 3, padding=1, bias=False), name="conv2")
    net.add(BatchNorm2d(), name="bn2")
    net.add(ReLU(), name="relu2")
    net.add(MaxPool2d(2), name="pool")
    net.add(Conv2d(8, 3, padding=1, bias=False), "pool", name="conv3")
    net.add(BatchNorm2d(), name="bn3")
    net.add(Add(), ["bn3", "pool"], name="add")
    net.add(ReLU(), name="relu3")
    net.add(Flatten(), name="flat")
    net.add(Linear(10), name="fc")
    net.add_loss()
    return net


def train(make_net, device="cpu", **options) -> dict:
    """The state dict (parameters and buffers) after STEPS SGD steps from seed 0."""
    net = make_net()
    rng = np.random.default_rng(1)
    with build_executor(net, BATCH, device=device, seed=0, **options) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3,
                  allocator=ex.allocator)
        for _ in range(STEPS):
            x = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 10, BATCH), opt)
        del opt
    return net.state_dict()


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def differing(reference: dict, runs: dict) -> list:
    """The names of the runs whose state differs from `reference` in any bit."""
    return [name for name, state in runs.items() if not same_bits(state, reference)]


def splits(make_net, deterministic: bool, **options) -> dict:
    """{description: state} of the step split every way the tests weigh."""
    runs = {f"{k} micro-batches": train(make_net, micro_batches=k,
                                        deterministic=deterministic, **options)
            for k in (1, 2, 4, 8)}
    for k, pieces in ((1, 2), (2, 4)):
        runs[f"{k} micro-batches, conv1..pool1 in {pieces}"] = train(
            make_net, policy="dyn", micro_batches=k, chunks=(("conv1", "pool1", pieces),),
            deterministic=deterministic, **options)
    return runs


def test_the_slice_is_the_batch_over_its_largest_power_of_two_up_to_eight():
    assert [deterministic_slice(b) for b in (256, 64, 16, 12, 8, 6, 7, 1)] == \
        [32, 8, 2, 3, 1, 3, 7, 1]


def test_every_split_and_chunk_gives_the_same_bits():
    runs = splits(vgg_net, deterministic=True)
    reference = runs.pop("1 micro-batches")
    assert differing(reference, runs) == []


def losses_of(make_net, **options) -> list:
    """The bits of every step's reported loss (float hex) over STEPS SGD steps from seed 0."""
    net = make_net()
    rng = np.random.default_rng(1)
    with build_executor(net, BATCH, device="cpu", seed=0, **options) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        out = []
        for _ in range(STEPS):
            x = rng.standard_normal((BATCH, 3, 16, 16)).astype(np.float32)
            out.append(float(ex.train_step(x, rng.integers(0, 10, BATCH), opt)).hex())
        del opt
    return out


def test_every_split_reports_the_same_loss_bits():
    """The loss a step reports is the mean of its slices' means summed as a tree
    (layers/slices.pairwise_sum), in one pass or across passes: the same bits in every split
    (summed pass after pass, the splits reported other last bits)."""
    runs = {k: losses_of(vgg_net, micro_batches=k, deterministic=True) for k in (1, 2, 4, 8)}
    runs["chunks"] = losses_of(vgg_net, policy="dyn", micro_batches=2, deterministic=True,
                               chunks=(("conv1", "pool1", 2),))
    assert all(r == runs[1] for r in runs.values()), runs


def test_without_deterministic_mode_the_splits_differ():
    """The test above is not trivially true: without the slices the sums group differently
    and the bits differ (the same runs, deterministic mode off)."""
    runs = splits(vgg_net, deterministic=False)
    reference = runs.pop("1 micro-batches")
    assert len(differing(reference, runs)) >= 4
    # ... by rounding only
    for state in runs.values():
        for name, value in state.items():
            np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-5)


def test_channels_last_maps_give_the_same_bits_for_every_split():
    runs = {k: train(vgg_net, micro_batches=k, deterministic=True, layout="nhwc")
            for k in (1, 4)}
    assert same_bits(runs[1], runs[4])


def test_batch_norm_with_split_statistics_normalizes_the_same_slices_in_every_split():
    """split_batch_statistics: each slice of 2 images is normalized with its own statistics
    whatever the count, so weights, running estimates and the count of batches tracked are
    the same bits; without deterministic mode each micro-batch's statistics differ."""
    runs = {k: train(resnet_net, micro_batches=k, deterministic=True,
                     split_batch_statistics=True) for k in (1, 2, 4, 8)}
    assert differing(runs[1], runs) == []
    assert int(runs[1]["bn2.num_batches_tracked"]) == STEPS * BATCH // 2
    plain = {k: train(resnet_net, micro_batches=k, split_batch_statistics=True)
             for k in (1, 2)}
    assert not same_bits(plain[1], plain[2])


def test_batch_norm_with_whole_batch_statistics_gives_the_same_bits_under_every_plan():
    """Whole-batch statistics: no micro-batches, but layer chunks around the batch norms
    and the policies' plans change nothing."""
    reference = train(resnet_net, deterministic=True)
    runs = {"chunk conv1..conv2": train(resnet_net, deterministic=True, policy="dyn",
                                        chunks=(("conv1", "conv2", 2),)),
            "all": train(resnet_net, deterministic=True, policy="all")}
    assert differing(reference, runs) == []


def test_policies_at_a_budget_give_the_same_bits():
    """Below the least budget of one unchunked pass, dyn splits the step or chunks it; the
    bits are those of policy none and of all."""
    net = vgg_net()
    one_pass = plan_split(net, BATCH, lambda b: analytic_profile(net, b, "h200"), 1 << 40,
                          (1,), counts=[1], chunks=()).minimum_budget
    budget = int(one_pass * 0.8)
    policy = DynPolicy(gpu="h200")
    decision = decide(net, BATCH, policy=policy, memory_budget=budget, device="cpu", deterministic=True)
    assert decision.micro_batches > 1 or decision.chunks
    reference = train(vgg_net, deterministic=True)
    runs = {"all": train(vgg_net, deterministic=True, policy="all"),
            "dyn": train(vgg_net, deterministic=True, policy=DynPolicy(gpu="h200"),
                         memory_budget=budget)}
    assert differing(reference, runs) == []


def test_the_planner_weighs_only_splits_into_whole_slices():
    net = vgg_net()
    found = plan_split(net, BATCH, lambda b: analytic_profile(net, b, "h200"), 1 << 20, (1,),
                       batch_slice=deterministic_slice(BATCH))
    counts = {o.micro_batches for o in found.options}
    assert counts and max(counts) == 8          # not 16 passes of one image
    assert all((o.batch // pieces) % 2 == 0 for o in found.options
               for _, _, pieces in o.chunks)
    assert 16 in {o.micro_batches for o in plan_split(
        net, BATCH, lambda b: analytic_profile(net, b, "h200"), 1 << 20, (1,)).options}


@pytest.mark.parametrize("options", [dict(micro_batches=16),
                                     dict(policy="dyn", micro_batches=4,
                                          chunks=(("conv1", "pool1", 4),))])
def test_a_split_into_parts_smaller_than_a_slice_is_refused(options):
    with pytest.raises(ConfigError, match="slices of 2 images"):
        build_executor(vgg_net(), BATCH, device="cpu", deterministic=True, **options)
    build_executor(vgg_net(), BATCH, device="cpu", **options).close()   # allowed without


def test_the_train_command_refuses_it_in_one_line(capsys):
    code = main(["train", "--model", "mlp", "--image-size", "16", "--batch", "16",
                 "--micro-batches", "16", "--deterministic", "--no-progress", "--device",
                 "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("minidnn: error: --deterministic")


def test_the_step_model_counts_the_slices_gradient_temporaries():
    """Under --deterministic a backward over several slices sums through one set of
    gradient-sized temporaries (sum_in_slices): counted where temporaries are in the arena
    (the GPU), even in one pass; none for a call of one slice."""
    from minidnn.layers import Linear
    from minidnn.memory.allocator import aligned
    from minidnn.planner.costs import accumulation_bytes
    fc = Linear(7)
    fc.setup([(8, 5)])
    grads = aligned(7 * 4)      # the bias's: the weight's gradient is added in place
    assert accumulation_bytes(fc, None, "backward", 1, None, 2, rows=8, in_arena=1) == grads
    assert accumulation_bytes(fc, None, "backward", 1, None, 2, rows=8, in_arena=0) == 0
    assert accumulation_bytes(fc, None, "backward", 1, None, 8, rows=8, in_arena=1) == 0
    assert accumulation_bytes(fc, None, "backward", 1, None, None, rows=8, in_arena=1) == 0
    assert accumulation_bytes(fc, None, "forward", 1, None, 2, rows=8, in_arena=1) == 0
