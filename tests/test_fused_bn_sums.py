"""A residual add that takes the sums of the batch norm before it (minidnn/fusion.py,
bn_sums): in the pass that writes the gradient it hands that batch norm (bn_grad), the add
also takes the per-channel sums the batch norm's backward would read that gradient again
for, and the batch norm starts from them. Which pairs (those whose batch norm input stays on
the device); the CPU kernels' bits; a fused step's bits against the unfused one's under the
residual settings, recomputation and a hand-made decision that moves an input."""
from dataclasses import replace

import numpy as np
import pytest

from minidnn import models
from minidnn.decide import decide
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.fusion import bn_grad_pairs, bn_sums_pairs
from minidnn.kernels import cpu, cpu_batchnorm
from minidnn.memory.plan import LivenessPlan
from test_fused_add_sum import RESIDUAL_SETTINGS, recomputing_everything
from test_fused_bn_grad import PAIRS, projected_blocks
from test_fusion import _run

pytest.importorskip("ml_dtypes")


def input_storage(plan, bn):
    return plan.tensors[plan.net.node(bn).inputs[0]].storage


def test_every_handed_gradient_has_its_sums_taken_unless_its_input_moves():
    net = models.build("resnet50", num_classes=10, image_size=32)
    plan = LivenessPlan(net, 2)
    pairs = bn_grad_pairs(plan)
    assert bn_sums_pairs(plan, frozenset(), False) == pairs and len(pairs) == 16
    assert bn_sums_pairs(plan, frozenset(), True) == {}        # slices with statistics of their own
    moved = frozenset({input_storage(plan, "layer2.1.bn3")})
    kept = bn_sums_pairs(plan, moved, False)
    assert "layer2.1.bn3" not in kept and len(kept) == 15
    assert decide(net, 2, device="cpu").bn_sums == pairs
    assert decide(net, 2, device="cpu", fuse=False).bn_sums == {}
    assert decide(net, 2, device="cpu", deterministic=True, micro_batches=2,
                  split_batch_statistics=True).bn_sums == {}


def test_a_decision_that_moves_a_batch_norm_input_leaves_its_pair_unfused():
    """A budget that offloads the batch norms' inputs: dyn and all decide without those
    pairs, which then run unfused."""
    net = projected_blocks()
    decision = decide(net, 4, device="cpu", policy="all", memory_budget="1MiB")
    plan = LivenessPlan(net, 4, fuse=True)
    moved = decision.offload | decision.recompute
    assert any(input_storage(plan, bn) in moved for bn in PAIRS)
    assert decision.bn_sums == bn_sums_pairs(plan, moved, False) != PAIRS


def test_a_pair_that_is_no_bn_grad_pair_is_refused():
    net = projected_blocks()
    net.init_params(0)
    decision = decide(net, 4, device="cpu")
    with pytest.raises(ConfigError, match="batch norms' sums"):
        Executor(net, 4, device="cpu", decision=replace(decision, bn_sums={"b2.bn1": "b2.sum"}))


@pytest.mark.parametrize("addend", [False, True])
def test_the_kernel_gives_the_bits_of_the_add_then_the_batch_norm(addend):
    import ml_dtypes
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16):
        y, gy, g2, x = (rng.standard_normal((3, 4, 5, 6)).astype(dtype) for _ in range(4))
        y.ravel()[::5] = 0
        x += np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1).astype(dtype)
        wide = np.float32 if dtype == ml_dtypes.bfloat16 else dtype
        mean = x.astype(wide).mean(axis=(0, 2, 3))
        invstd = (1 / (x.astype(wide).std(axis=(0, 2, 3)) + 0.1)).astype(wide)
        weight = rng.standard_normal(4).astype(wide)
        part = g2 if addend else None
        plain = np.empty_like(gy)
        if addend:
            cpu.relu_mask_sum(y, gy, g2, plain)
        else:
            cpu.relu_backward(y, gy, plain)
        outs = [np.empty_like(x), np.empty(4, wide), np.empty(4, wide)]
        cpu_batchnorm.batchnorm_backward(x, plain, mean, invstd, weight, *outs)
        handed = np.empty_like(gy)
        sums = cpu_batchnorm.handed_sums(y, gy, part, handed, x, mean)
        fused = [np.empty_like(x), np.empty(4, wide), np.empty(4, wide)]
        cpu_batchnorm.batchnorm_backward(x, handed, mean, invstd, weight, *fused, sums=sums)
        assert handed.tobytes() == plain.tobytes()
        for a, b in zip(fused, outs):
            assert a.tobytes() == b.tobytes()


def counted_sums(monkeypatch) -> dict:
    """Calls of handed_sums, and of the batch norm's backward given sums, counted."""
    calls = {"handed_sums": 0, "given": 0}
    handed, backward = cpu_batchnorm.handed_sums, cpu_batchnorm.batchnorm_backward

    def counted_handed(*a):
        calls["handed_sums"] += 1
        return handed(*a)

    def counted_backward(*a, **k):
        calls["given"] += k.get("sums") is not None
        return backward(*a, **k)
    monkeypatch.setattr(cpu_batchnorm, "handed_sums", counted_handed)
    monkeypatch.setattr(cpu_batchnorm, "batchnorm_backward", counted_backward)
    return calls


# Deterministic with whole-batch statistics: one slice, the whole pass, takes the sums.
@pytest.mark.parametrize("kwargs", RESIDUAL_SETTINGS + [{"deterministic": True}], ids=str)
def test_a_fused_step_gives_the_bits_of_the_unfused_one(kwargs, monkeypatch):
    calls = counted_sums(monkeypatch)
    fused = _run(projected_blocks(), kwargs, 2, True, 8, "bn_sums")
    passes = 2 * kwargs.get("micro_batches", 1)
    # Fused where bn_grad is (not on bf16 maps, widened on the CPU), the input is kept (not
    # under `all` at 1 MiB, which offloads it) and the statistics are the whole pass's.
    sliced = kwargs.get("deterministic") and kwargs.get("split_batch_statistics")
    if kwargs.get("precision") == "bf16" or kwargs.get("policy") or sliced:
        assert calls == {"handed_sums": 0, "given": 0}
    else:
        assert fused[2] == PAIRS
        assert calls == {"handed_sums": 2 * passes, "given": 2 * passes}
    plain = _run(projected_blocks(), kwargs, 2, False, 8, "bn_sums")
    assert plain[2] == {}
    assert fused[0] == plain[0] and fused[3] == plain[3]
    for k in fused[1]:
        assert fused[1][k].tobytes() == plain[1][k].tobytes(), k


def test_recomputing_every_candidate_runs_unfused_with_the_same_bits(monkeypatch):
    """A hand-made decision that recomputes every map, the batch norms' inputs among them,
    keeps decide's bn_sums: those pairs run unfused, with the bits of a step never fused."""
    calls = counted_sums(monkeypatch)
    assert recomputing_everything(projected_blocks(), True, "bn_sums") == \
        recomputing_everything(projected_blocks(), False, "bn_sums")
    assert calls["handed_sums"] == 0


def test_the_sums_an_add_takes_are_counted_in_its_backward():
    """The stage-one sums an add takes for its batch norm (at most 2 MiB) live from the add's
    call to the batch norm's: the step model counts them in the add's backward, fused, and
    and not with --no-fuse. (Counted wherever the pair may fuse: a bound.)"""
    from minidnn.planner.costs import handed_sums_bytes
    from minidnn.planner.step_model import StepModel
    from test_planner import flat_profile
    net = projected_blocks()
    fused = StepModel(net, 4, flat_profile(net, 4))
    apart = StepModel(net, 4, flat_profile(net, 4), fuse=False)
    for bn, add in PAIRS.items():
        a = fused.index[add]
        extra = handed_sums_bytes(net.node(bn).layer)
        assert extra > 0
        assert fused._transient[("backward", a)] - apart._transient[("backward", a)] == extra
        assert fused._transient[("forward", a)] == apart._transient[("forward", a)]
