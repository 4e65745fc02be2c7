"""A max pool that applies the mask of the ReLU before it (minidnn/fusion.py, pool_relu):
which pairs qualify, that such a ReLU keeps nothing for backward, the CPU kernels against the
two layers' kernels bit for bit, and whole steps against the unfused ones."""
from dataclasses import replace

import numpy as np
import pytest

from minidnn import models
from minidnn.builder import NetBuilder
from minidnn.decide import decide
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.fusion import bias_relu_pairs, conv_relu_pairs, pool_relu_pairs
from minidnn.kernels import RELU_MASK_BIT, PoolSpec, cpu, out_size
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import relu_bits_for
from test_fusion import _run


def test_vgg16s_pools_apply_the_masks_of_their_relus_which_keep_nothing():
    net = models.build("vgg16")
    plan = LivenessPlan(net, 2)
    pairs = pool_relu_pairs(plan)
    assert pairs == {"relu1_2": "pool1", "relu2_2": "pool2", "relu3_3": "pool3",
                     "relu4_3": "pool4", "relu5_3": "pool5"}
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    for relu, pool in pairs.items():
        i = index[relu]
        assert not plan.retains_output(i) and plan.aux_specs(i) == {}
        # Its map (the convolution's, in place) dies at the pool's forward.
        assert plan.storage_of(relu).free_time == index[pool]
    unfused = LivenessPlan(net, 2, fuse=False)
    assert pool_relu_pairs(unfused) == {}
    assert all(unfused.retains_output(index[r]) for r in pairs)
    assert plan.liveness_peak_bytes() < unfused.liveness_peak_bytes()


def test_relus_asked_to_keep_bits_keep_nothing_before_a_pool_and_stay_in_the_convolution():
    net = models.build("vgg16")
    bits = relu_bits_for(net)
    assert set(bits) >= {"relu1_2", "relu5_3"}
    plan = LivenessPlan(net, 2, relu_bits=bits)
    pooled = pool_relu_pairs(plan)
    assert set(pooled) == set(pool_relu_pairs(LivenessPlan(net, 2)))
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    assert all(plan.aux_specs(index[r]) == {} for r in pooled)
    # The ReLUs before pools write no bits, so float32 convolutions still apply them.
    assert set(pooled) <= set(conv_relu_pairs(plan, False))
    assert set(conv_relu_pairs(plan, False)) == set(bias_relu_pairs(plan)) - (bits - set(pooled))


def _one_reader_pools():
    """conv -> relu -> overlapping 3x3/2 pool (padded), conv -> relu -> 2x2 pool; a ReLU read
    by a pool and a convolution; a 12x12 pool (144 positions: no spare argmax bit)."""
    b = NetBuilder("pools", image_size=24, num_classes=10)
    b.conv("conv1", 8, 3, padding=1)
    b.relu("relu1")
    b.maxpool("pool1", 3, 2, padding=1)           # 12x12
    b.conv("conv2", 8, 3, padding=1)
    b.relu("relu2")
    b.maxpool("pool2", 2)                          # 6x6
    b.conv("conv3", 8, 3, padding=1)
    b.relu("relu3")
    b.maxpool("pool3", 2, src="relu3")             # relu3: two readers
    b.conv("conv4", 8, 1, src="relu3")
    b.relu("relu4")
    b.maxpool("pool4", 2, src="relu4")
    b.add("sum", ["pool3", "pool4"])
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


def _big_window():
    b = NetBuilder("big_window", image_size=12, num_classes=10)
    b.conv("conv1", 4, 3, padding=1)
    b.relu("relu1")
    b.maxpool("pool1", 12)                          # 144 positions
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


def test_only_a_relu_read_by_one_pool_with_a_spare_argmax_bit_hands_its_mask_over():
    pairs = pool_relu_pairs(LivenessPlan(_one_reader_pools(), 2))
    assert pairs == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"}
    assert pool_relu_pairs(LivenessPlan(_big_window(), 2)) == {}


# ---- the CPU kernels against the two layers' ---------------------------------------------------
def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


GEOMETRIES = [(2, 2, 0, False), (3, 2, 1, False), (3, 2, 0, True), (3, 1, 1, False)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # NaN and infinities, on purpose
@pytest.mark.parametrize("kernel,stride,padding,ceil", GEOMETRIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_pool_with_the_relu_mask_gives_the_relu_backward_of_its_backward(
        kernel, stride, padding, ceil, dtype):
    """Forward: the same maxima, the same offsets, bit 7 where the maximum is > 0. Backward:
    relu_backward of the unmasked backward, bit for bit, with zeros of both signs, NaN and
    infinities in the gradient and NaN, zeros and ties in the ReLU's output."""
    rng = np.random.default_rng(kernel * 10 + stride)
    spec = PoolSpec(kernel=(kernel,) * 2, stride=(stride,) * 2, padding=(padding,) * 2,
                    ceil_mode=ceil)
    n, c, h = 2, 3, 9
    oh = out_size(h, kernel, stride, padding, ceil_mode=ceil)
    x = np.maximum(rng.standard_normal((n, c, h, h)), 0).astype(dtype)
    x.reshape(-1)[::11] = np.nan
    x[0, 0] = 0                                   # a plane of zeros: ties, all masked
    x[1, 1, :, :4] = 0.5                          # ties of a positive maximum
    gy = rng.standard_normal((n, c, oh, oh)).astype(dtype)
    flat = gy.reshape(-1)
    flat[::5], flat[1::7], flat[2::13], flat[3::17] = -0.0, np.inf, np.nan, -np.inf

    y0, a0 = np.empty(gy.shape, dtype), np.empty(gy.shape, np.uint8)
    y1, a1 = np.empty_like(y0), np.empty_like(a0)
    cpu.maxpool2d_forward(x, y0, a0, spec)
    cpu.maxpool2d_forward(x, y1, a1, spec, relu=True)
    assert _bits(y1).tobytes() == _bits(y0).tobytes()
    np.testing.assert_array_equal(a1 & (RELU_MASK_BIT - 1), a0)
    np.testing.assert_array_equal((a1 >= RELU_MASK_BIT)[~np.isnan(y0)], (y0 > 0)[~np.isnan(y0)])

    want = np.empty(x.shape, dtype)
    cpu.maxpool2d_backward(gy, a0, want, spec)
    cpu.relu_backward(x, want, want)
    got = np.full(x.shape, 7, dtype)
    cpu.maxpool2d_backward(gy, a1, got, spec, relu=True)
    assert _bits(got).tobytes() == _bits(want).tobytes()


def test_a_window_without_a_spare_argmax_bit_is_refused_the_mask():
    spec = PoolSpec(kernel=(12, 12), stride=(12, 12))
    x = np.ones((1, 1, 12, 12), np.float32)
    y, a = np.empty((1, 1, 1, 1), np.float32), np.empty((1, 1, 1, 1), np.uint8)
    cpu.maxpool2d_forward(x, y, a, spec)
    with pytest.raises(ConfigError, match="128 positions"):
        cpu.maxpool2d_forward(x, y, a, spec, relu=True)
    with pytest.raises(ConfigError, match="128 positions"):
        cpu.maxpool2d_backward(y, a, x, spec, relu=True)


# ---- whole steps ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"precision": "bf16"}, {"layout": "nhwc"},
                                    {"relu_bits": True},
                                    {"policy": "all", "memory_budget": "1MiB"},
                                    {"deterministic": True, "micro_batches": 2}], ids=str)
def test_a_step_whose_pools_apply_relu_masks_gives_the_bits_of_the_unfused_one(kwargs):
    """Three training steps and an evaluation: losses, weights and the evaluation's loss
    have the bits of the same step with --no-fuse."""
    losses, state, pairs, evaluated = _run(_one_reader_pools(), kwargs, 3, True, 24,
                                           "pool_relu")
    assert pairs == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"}
    plain = _run(_one_reader_pools(), kwargs, 3, False, 24, "pool_relu")
    assert plain[2] == {}
    assert losses == plain[0] and evaluated == plain[3]
    assert all(_bits(state[k]).tobytes() == _bits(plain[1][k]).tobytes() for k in state)


def test_resnet18s_stem_relu_is_masked_by_its_batch_norm_and_its_pool():
    """The stem's bn1 -> relu -> maxpool: the batch norm applies the ReLU (bn_relu) and the
    pool its mask (pool_relu); the two masks are one, and the bits are the unfused step's."""
    net = models.build("resnet18", num_classes=10, image_size=32)
    decision = decide(net, 4)
    assert decision.pool_relu == {"relu": "maxpool"} and "relu" in decision.bn_relu
    fused = _run(net, {}, 2, True, 32, "pool_relu")
    plain = _run(models.build("resnet18", num_classes=10, image_size=32), {}, 2, False, 32,
                 "pool_relu")
    assert fused[0] == plain[0] and fused[3] == plain[3]
    assert all(_bits(fused[1][k]).tobytes() == _bits(plain[1][k]).tobytes() for k in fused[1])


def test_a_decision_naming_other_pool_pairs_is_refused():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    decision = decide(net, 4)
    assert decision.pool_relu
    with pytest.raises(ConfigError, match="masks of ReLUs"):
        Executor(net, 4, device="cpu", decision=replace(decision, pool_relu={"relu1": "fc3"}))
