"""A residual add that takes over a sum of gradients (minidnn/fusion.py, add_sum): a block's
output, read by the next block's identity path and its first convolution, gets its two
gradient parts added by the add before it, in the pass that masks them, instead of by the
memory manager after the convolution's backward. The pairs ResNets have; the kernels' bits;
a fused step's bits against the unfused one's in both precisions and layouts, under a budget
and with every map recomputed that can be; a gradient check; the temporary freed after the
add's backward; the step model holding what the run holds."""
import numpy as np
import pytest

from minidnn import Network, models
from minidnn.builder import NetBuilder
from minidnn.decide import build_executor, decide
from minidnn.fusion import add_relu_pairs, add_sum_pairs
from minidnn.kernels import cpu
from minidnn.layers import Add, Conv2d, Flatten, Linear, ReLU
from minidnn.memory.plan import LivenessPlan
from test_fusion import _run
from test_graph import check_gradients

pytest.importorskip("ml_dtypes")


def two_blocks():
    """A stem and two residual blocks, 8x8 images: the first block's output is read by the
    second's identity and its first convolution."""
    b = NetBuilder("two_blocks", image_size=8, num_classes=10)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu1")
    for k, src in ((1, "relu1"), (2, "out1")):
        b.conv(f"b{k}.conv1", 8, 3, padding=1, bias=False, src=src)
        b.batchnorm(f"b{k}.bn1")
        b.relu(f"b{k}.relu1")
        b.conv(f"b{k}.conv2", 8, 3, padding=1, bias=False)
        b.batchnorm(f"b{k}.bn2")
        b.add(f"b{k}.sum", [f"b{k}.bn2", src])
        b.relu(f"out{k}")
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


@pytest.mark.parametrize("model, blocks", [("resnet18", 8), ("resnet50", 16)])
def test_every_block_output_but_the_last_has_its_sum_taken_over(model, blocks):
    net = models.build(model, num_classes=10, image_size=32)
    plan = LivenessPlan(net, 2)
    pairs = add_sum_pairs(plan)
    assert len(pairs) == blocks - 1
    index = {n.name: i for i, n in enumerate(plan.nodes)}
    for add, reader in pairs.items():
        assert index[reader] == index[add] + 2 and reader.endswith(".conv1")
    assert decide(net, 2, device="cpu").add_sum == pairs
    assert decide(net, 2, device="cpu", fuse=False).add_sum == {}
    # ReLUs that keep bits leave their adds unfused, and so their sums.
    bits = decide(net, 2, device="cpu", relu_bits=True)
    assert set(bits.add_sum) <= set(bits.add_relu.values()) and len(bits.add_sum) < len(pairs)


@pytest.mark.parametrize("between", [False, True])
def test_the_first_reader_must_run_right_after_the_relu(between):
    """With another call between the block's ReLU and its first reader, the add's backward
    would not be the next to read the gradient: the sum stays the memory manager's."""
    b = NetBuilder("late", image_size=8, num_classes=10)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.relu("relu1")
    b.conv("conv2", 8, 3, padding=1, bias=False)
    b.add("sum", ["conv2", "relu1"])
    b.relu("out")
    if between:
        b.conv("side", 8, 1, bias=False, src="relu1")
    b.conv("a", 8, 3, padding=1, bias=False, src="out")
    b.add("sum2", ["a", "out"])
    if between:
        b.add("sum3", ["sum2", "side"])
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 10)
    plan = LivenessPlan(b.finish(), 2)
    assert add_relu_pairs(plan)["out"] == "sum"
    assert add_sum_pairs(plan) == ({} if between else {"sum": "a"})


def test_the_kernel_gives_the_sum_rounded_once_then_the_mask():
    """Against NumPy itself: the sum taken in float32 (float64 for float64 maps) and stored
    in the maps' dtype, then 0 where y is not > 0 (a product with the mask, as the CPU's
    relu_mask_copy: 0 * a finite sum is +-0); in place into gy, both outputs alike. Sums
    that cancel to 0 and round in bf16, and ordinary ones."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16):
        y, gy, g2 = (rng.standard_normal((2, 3, 5, 7)).astype(dtype) for _ in range(3))
        y.ravel()[::5] = 0
        g2.ravel()[:6] = -gy.ravel()[:6]
        wide = np.float64 if dtype == np.float64 else np.float32
        total = (gy.astype(wide) + g2.astype(wide)).astype(dtype)
        want = (total.astype(wide) * (y.astype(wide) > 0)).astype(dtype)
        gx0, gx1 = gy.copy(), np.empty_like(gy)
        cpu.relu_mask_sum_copy(y, gx0, g2, gx0, gx1)
        assert gx0.tobytes() == want.tobytes() == gx1.tobytes()


# The settings a residual fusion's step is checked under against --no-fuse: both precisions
# and layouts, a budget, micro-batches, deterministic slices.
RESIDUAL_SETTINGS = [{"precision": "fp32", "layout": "nchw"},
                     {"precision": "bf16", "layout": "nhwc"},
                     {"precision": "fp32", "layout": "nhwc"},
                     {"precision": "bf16", "layout": "nchw"},
                     {"policy": "all", "memory_budget": "1MiB"},
                     {"micro_batches": 2, "split_batch_statistics": True},
                     {"deterministic": True, "micro_batches": 2, "split_batch_statistics": True}]


@pytest.mark.parametrize("kwargs", RESIDUAL_SETTINGS, ids=str)
def test_a_fused_step_gives_the_bits_of_the_unfused_one(kwargs, monkeypatch):
    calls = {"sums": 0}       # relu_mask_sum_copy, or relu_mask_sum where bn2 reads on (bn_grad)
    for name in ("relu_mask_sum_copy", "relu_mask_sum"):
        original = getattr(cpu, name)

        def counted(*a, _original=original):
            calls["sums"] += 1
            return _original(*a)
        monkeypatch.setattr(cpu, name, counted)
    fused = _run(two_blocks(), kwargs, 2, True, 8, "add_sum")
    assert fused[2] == {"b1.sum": "b2.conv1"}
    # bf16 maps on the CPU are widened for the add, which then sums before it (as unfused)
    steps = 0 if kwargs.get("precision") == "bf16" else 2 * kwargs.get("micro_batches", 1)
    assert calls["sums"] == steps
    plain = _run(two_blocks(), kwargs, 2, False, 8, "add_sum")
    assert plain[2] == {} and calls["sums"] == steps
    assert fused[0] == plain[0] and fused[3] == plain[3]
    for k in fused[1]:
        assert fused[1][k].tobytes() == plain[1][k].tobytes(), k


def recomputing_everything(net, fuse: bool, field: str):
    """(losses, state bytes) of two steps of `net` (8x8 images, batch 4) with every map that
    can be recomputed recomputed; the decision's `field` fusion named exactly when fused."""
    from dataclasses import replace
    from minidnn import SGD
    from minidnn.executor import Executor
    from minidnn.memory.policy import recompute_candidates
    net.init_params(0)
    decision = decide(net, 4, device="cpu", fuse=fuse)
    ids = frozenset(s.id for s in recompute_candidates(LivenessPlan(net, 4, fuse=fuse)))
    with Executor(net, 4, device="cpu", seed=1,
                  decision=replace(decision, recompute=ids)) as ex:
        assert len(ex.decision.recompute) > 4 and bool(getattr(ex.decision, field)) == fuse
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9)
        rng = np.random.default_rng(2)
        losses = [float(ex.train_step(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                                      rng.integers(0, 10, 4), opt)) for _ in range(2)]
    return losses, {k: np.array(v).tobytes() for k, v in net.state_dict().items()}


def test_recomputing_every_candidate_keeps_the_bits():
    """Every map that can be recomputed is, the blocks' outputs among them, so recomputations
    run between the reader's backward and the add's: the same bits fused and not."""
    assert recomputing_everything(two_blocks(), True, "add_sum") == \
        recomputing_everything(two_blocks(), False, "add_sum")


def test_a_network_whose_add_sums_passes_a_gradient_check():
    net = Network((3, 6, 6), num_classes=4, dtype=np.float64)
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(4, 3, padding=1), name="conv2")
    net.add(Add(), inputs=["conv2", "relu1"], name="sum")
    net.add(ReLU(), name="out")
    net.add(Conv2d(4, 3, padding=1), name="conv3")
    net.add(Add(), inputs=["conv3", "out"], name="sum2")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add_loss()
    net.init_params(0)
    ex = build_executor(net, 3, device="cpu", seed=1)
    assert ex.decision.add_sum == {"sum": "conv3"}
    rng = np.random.default_rng(3)
    check_gradients(ex, rng.standard_normal((3, 3, 6, 6)), rng.integers(0, 4, 3))
    ex.close()


def test_the_temporary_lives_until_the_add_and_no_longer():
    """The second reader's gradient part is held from its backward to the add's, then freed:
    at the step's end the device holds what the unfused step holds."""
    held = {}
    for fuse in (True, False):
        net = two_blocks()
        net.init_params(0)
        with build_executor(net, 4, device="cpu", seed=1, fuse=fuse) as ex:
            rng = np.random.default_rng(2)
            ex.forward(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                       rng.integers(0, 10, 4))
            manager = ex.manager
            index = {n.name: i for i, n in enumerate(ex.plan.nodes)}
            seen = []
            original = manager.after_backward

            def watched(i, _original=original, _seen=seen, _m=manager):
                _original(i)
                _seen.append((i, set(_m._addends)))
            manager.after_backward = watched
            ex.backward()
            held[fuse] = (seen, index, manager.resident_bytes)
    seen, index, resident = held[True]
    after = {i: addends for i, addends in seen}
    add = index["b1.sum"]
    assert after[index["b2.conv1"]] == {add}          # kept past the reader's backward
    assert after[index["out1"]] == {add}
    assert after[add] == set()                         # freed with the add's
    assert resident == held[False][2]


def test_the_kept_part_comes_by_best_fit_not_from_the_top():
    """The part an add keeps lives a few calls: it comes by best fit among the calls' blocks,
    not from the top of the arena (Allocator.lasting). From the top, it and the high-water
    mark of the blocks below add up in a step captured as a CUDA graph, which holds every
    address its blocks took: on an H200, ResNet-50 bf16 held 392 MiB more, and under a
    budget the captured step filled the whole budget where the plan promised 3% less
    (benchmarks/RESULTS.md, wave 20). An unsplit float32 step takes nothing else from the
    top (no bf16 weight copies, no summed micro-batch gradients)."""
    net = two_blocks()
    net.init_params(0)
    with build_executor(net, 4, device="cpu", seed=1, memory_budget="64MiB") as ex:
        arena = ex.allocator
        tops = []
        original = arena._blocks.allocate

        def allocate(size, top=False, _original=original):
            tops.append(top)
            return _original(size, top)
        arena._blocks.allocate = allocate
        rng = np.random.default_rng(2)
        ex.forward(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                   rng.integers(0, 10, 4))
        ex.backward()
        assert ex.manager._deferred_sums                  # the add did keep a part
    assert tops and not any(tops)


def test_the_step_model_prices_the_adds_that_sum():
    """The model's backward of an add that sums (SUMMING_ADD_SHARE: the two maps the step
    saves, off the add's measured copy); --no-fuse prices the plain add; nothing else
    moves."""
    from minidnn.planner.step_model import SUMMING_ADD_SHARE, StepModel
    from test_planner import flat_profile
    net = two_blocks()
    prof = flat_profile(net, 4, layer_s=1e-3)
    fused = StepModel(net, 4, prof, input_batches=0)
    assert fused.backward_share == {"b1.sum": SUMMING_ADD_SHARE}
    plain = StepModel(net, 4, prof, input_batches=0, fuse=False)
    assert plain.backward_share == {}
    gap = fused.evaluate(frozenset()).step_time_s - plain.evaluate(frozenset()).step_time_s
    shares = sum(fused.forward_share.values()) - len(fused.forward_share)
    assert gap == pytest.approx((SUMMING_ADD_SHARE - 1 + shares) * 1e-3)


@pytest.mark.parametrize("fuse", [True, False])
def test_the_step_model_holds_what_the_run_holds(fuse):
    """The step model's dry run (whose decision names no fusion) keeps the gradient part for
    the add as the run does: the feature-map bytes it predicts at every backward call are
    those the run's memory manager holds there."""
    from minidnn.planner.step_model import StepModel
    from test_planner import flat_profile
    net = two_blocks()
    net.init_params(0)
    predicted = StepModel(net, 4, flat_profile(net, 4), input_batches=0,
                          fuse=fuse).evaluate(frozenset()).fm_levels
    with build_executor(net, 4, device="cpu", seed=1, fuse=fuse) as ex:
        rng = np.random.default_rng(2)
        ex.forward(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                   rng.integers(0, 10, 4))
        ex.manager.stats.samples.clear()
        ex.backward()
        held = {(p, i): b for p, i, b in ex.manager.stats.samples if p == "backward"}
        index = {n.name: i for i, n in enumerate(ex.plan.nodes)}
    assert len(held) == len(index) and all(predicted[k] == b for k, b in held.items())
