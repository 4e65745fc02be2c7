"""A max pool that applies the mask of the ReLU before it (minidnn/fusion.py, pool_relu), and
the ReLU's forward too (pool_relu_forward), and sums the gradient of the bias the ReLU added
(pool_bias): which pairs qualify, that such a ReLU keeps nothing for backward, the CPU
kernels against the two layers' kernels bit for bit, and whole steps against the unfused
ones."""
from dataclasses import replace

import numpy as np
import pytest

from minidnn import models
from minidnn.builder import NetBuilder
from minidnn.decide import decide
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.fusion import bias_relu_pairs, conv_relu_pairs, pool_bias_pairs, \
    pool_relu_forward_pairs, pool_relu_pairs
from minidnn.kernels import RELU_MASK_BIT, PoolSpec, cpu, out_size
from minidnn.kernels.mapformat import MapFormat, bfloat16
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


@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # NaN, on purpose
@pytest.mark.parametrize("kernel,stride,padding,ceil", GEOMETRIES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stored", [None, "bf16"])
def test_the_cpu_pool_applying_the_relu_before_it_gives_the_bits_of_the_two_layers(
        kernel, stride, padding, ceil, bias, stored):
    """maxpool2d_forward(x, rectify=(b, stored)) against relu_forward(x, ., b), the map
    stored (rounded to bf16 where the maps are bf16 and the call sees widened copies), then
    the pool: the same maxima and marked offsets, bit for bit; x itself is left alone."""
    rng = np.random.default_rng(kernel * 10 + stride + 3 * bias)
    spec = PoolSpec(kernel=(kernel,) * 2, stride=(stride,) * 2, padding=(padding,) * 2,
                    ceil_mode=ceil)
    n, c, h = 2, 5, 9
    oh = out_size(h, kernel, stride, padding, ceil_mode=ceil)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    x.reshape(-1)[::13] = np.nan
    x[0, 1, :, :5] = 0.25                              # ties
    x[1, 2] = -1.0                                     # a plane the ReLU zeroes
    b = rng.standard_normal(c).astype(np.float32) if bias else None
    dtype = None if stored is None else bfloat16()
    if dtype is not None:                              # a widened copy of a bf16 map
        x = x.astype(dtype).astype(np.float32)
    before = x.copy()

    relu = np.empty_like(x)
    cpu.relu_forward(x, relu, b)
    if dtype is not None:
        relu = relu.astype(dtype).astype(np.float32)
    want_y, want_a = np.empty((n, c, oh, oh), np.float32), np.empty((n, c, oh, oh), np.uint8)
    cpu.maxpool2d_forward(relu, want_y, want_a, spec, relu=True)
    y, a = np.empty_like(want_y), np.empty_like(want_a)
    cpu.maxpool2d_forward(x, y, a, spec, relu=True, rectify=(b, dtype))
    assert _bits(y).tobytes() == _bits(want_y).tobytes()
    np.testing.assert_array_equal(a, want_a)
    assert _bits(x).tobytes() == _bits(before).tobytes()


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
def _fused_against_plain(build, kwargs, steps, size, field):
    """`steps` training steps and an evaluation of build()'s network fused and with --no-fuse
    (test_fusion._run): asserts that losses, weights and the evaluation's loss have the same
    bits; returns (the fused decision's `field` pairs, the unfused one's)."""
    fused = _run(build(), kwargs, steps, True, size, field)
    plain = _run(build(), kwargs, steps, False, size, field)
    assert fused[0] == plain[0] and fused[3] == plain[3]
    assert all(_bits(fused[1][k]).tobytes() == _bits(plain[1][k]).tobytes() for k in fused[1])
    return fused[2], plain[2]


@pytest.mark.parametrize("kwargs", [{}, {"precision": "bf16"}, {"layout": "nhwc"},
                                    {"relu_bits": True},
                                    {"policy": "all", "memory_budget": "1MiB"},
                                    {"deterministic": True, "micro_batches": 2}], ids=str)
def test_a_step_whose_pools_apply_relu_masks_gives_the_bits_of_the_unfused_one(kwargs):
    """Three training steps and an evaluation: losses, weights and the evaluation's loss
    have the bits of the same step with --no-fuse."""
    pairs, plain = _fused_against_plain(_one_reader_pools, kwargs, 3, 24, "pool_relu")
    assert pairs == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"}
    assert plain == {}


def _two_reader_input():
    """conv1's output read by relu1 and, after it, by conv2: relu1 cannot run in place."""
    b = NetBuilder("two_readers", image_size=8, num_classes=10)
    b.conv("conv1", 4, 3, padding=1)
    b.relu("relu1")
    b.maxpool("pool1", 2)                           # 4x4
    b.conv("conv2", 4, 3, stride=2, padding=1, src="conv1")   # 4x4
    b.add("sum", ["pool1", "conv2"])
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


def test_a_pool_applies_the_relus_forward_where_no_layer_before_it_does():
    """VGG-16: on float32 maps the convolutions apply the ReLUs before the pools (conv_relu),
    except under --deterministic, where the pools do; on bf16 maps the pools do. Not a ReLU
    that cannot run in place, nor one a batch norm applies (ResNet-18's stem), nor without
    `fuse`."""
    net = models.build("vgg16")
    pooled = pool_relu_pairs(LivenessPlan(net, 2))
    assert len(pooled) == 5
    assert pool_relu_forward_pairs(LivenessPlan(net, 2), False) == {}
    assert pool_relu_forward_pairs(LivenessPlan(net, 2), True) == pooled
    bf16 = LivenessPlan(net, 2, maps=MapFormat("nhwc", "bf16"))
    assert pool_relu_forward_pairs(bf16, False) == pooled == pool_relu_pairs(bf16)
    bits = LivenessPlan(net, 2, relu_bits=relu_bits_for(net), maps=MapFormat("nhwc", "bf16"))
    assert pool_relu_forward_pairs(bits, False) == pooled
    assert pool_relu_forward_pairs(LivenessPlan(net, 2, fuse=False), True) == {}

    two = LivenessPlan(_two_reader_input(), 2, maps=MapFormat("nchw", "bf16"))
    assert pool_relu_pairs(two) == {"relu1": "pool1"}
    assert pool_relu_forward_pairs(two, True) == {}        # relu1 writes a map of its own

    stem = LivenessPlan(models.build("resnet18", num_classes=10, image_size=32), 2,
                        maps=MapFormat("nchw", "bf16"))
    assert pool_relu_pairs(stem) == {"relu": "maxpool"}
    assert pool_relu_forward_pairs(stem, True) == {}       # bn1 applies it (bn_relu)


@pytest.mark.parametrize("kwargs,pairs", [
    ({"precision": "bf16"}, 3), ({"precision": "bf16", "layout": "nhwc", "relu_bits": True}, 3),
    ({"deterministic": True}, 3), ({"deterministic": True, "precision": "bf16",
                                    "micro_batches": 2}, 3),
    ({"precision": "bf16", "policy": "all", "memory_budget": "1MiB"}, 3), ({}, 0)], ids=str)
def test_a_step_whose_pools_apply_the_relus_forward_gives_the_bits_of_the_unfused_one(
        kwargs, pairs):
    """Three training steps and an evaluation, the pools applying the ReLUs before them
    (with their convolutions' biases) in forward and backward: the bits of --no-fuse. On
    float32 maps without --deterministic the convolutions apply those ReLUs instead."""
    fused, plain = _fused_against_plain(_one_reader_pools, kwargs, 3, 24, "pool_relu_forward")
    assert fused == ({"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"} if pairs else {})
    assert plain == {}


def _unbiased():
    """A ReLU on the network's input before a pool (no gradient wanted: not a pair), and a
    convolution without a bias -> ReLU -> pool (no bias to fold, so no convolution applies
    the ReLU, float32 maps too)."""
    b = NetBuilder("unbiased", image_size=8, num_classes=10)
    b.relu("relu0")
    b.maxpool("pool0", 2)
    b.conv("conv1", 4, 3, padding=1, bias=False)
    b.relu("relu1")
    b.maxpool("pool1", 2)
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


@pytest.mark.parametrize("kwargs", [{}, {"precision": "bf16", "layout": "nhwc"}], ids=str)
def test_a_pool_applies_a_relu_without_a_bias_with_the_unfused_bits(kwargs):
    """No bias: the pool's windows hold max(x, 0), as the ReLU's own pass stores it; on float32
    maps too, where no convolution applies a ReLU without a bias."""
    fused, _ = _fused_against_plain(_unbiased, kwargs, 2, 8, "pool_relu_forward")
    assert fused == {"relu1": "pool1"}


def test_resnet18s_stem_relu_is_masked_by_its_batch_norm_and_its_pool():
    """The stem's bn1 -> relu -> maxpool: the batch norm applies the ReLU (bn_relu) and the
    pool its mask (pool_relu); the two masks are one, and the bits are the unfused step's."""
    def resnet18():
        return models.build("resnet18", num_classes=10, image_size=32)

    decision = decide(resnet18(), 4)
    assert decision.pool_relu == {"relu": "maxpool"} and "relu" in decision.bn_relu
    _fused_against_plain(resnet18, {}, 2, 32, "pool_relu")


def test_a_decision_naming_other_pool_pairs_is_refused():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    decision = decide(net, 4)
    assert decision.pool_relu
    with pytest.raises(ConfigError, match="masks of ReLUs"):
        Executor(net, 4, device="cpu", decision=replace(decision, pool_relu={"relu1": "fc3"}))
    with pytest.raises(ConfigError, match="moves ReLUs into max pools"):
        Executor(net, 4, device="cpu",
                 decision=replace(decision, pool_relu_forward={"relu1": "fc3"}))


# ---- the pool sums the gradient of its ReLU's bias (pool_bias) --------------------------------
def test_vgg16s_pools_sum_the_bias_gradients_of_their_relus_but_under_deterministic():
    net = models.build("vgg16")
    plan = LivenessPlan(net, 2)
    pooled = pool_relu_pairs(plan)
    assert pool_bias_pairs(plan, False) == pooled            # every ReLU adds its bias
    assert pool_bias_pairs(plan, True) == {}
    assert decide(net, 2).pool_bias == pooled
    assert decide(net, 2, deterministic=True).pool_bias == {}
    assert decide(net, 2, fuse=False).pool_bias == {}
    # A ReLU that adds no bias leaves its pool nothing to sum.
    assert pool_bias_pairs(LivenessPlan(_unbiased(), 2), False) == {}


def _decided_run(net, kwargs, steps, size, pool_bias: bool, device="cpu"):
    """test_fusion._run's steps and evaluation under the step's decision, with its pool_bias
    pairs or without them (a decision made by hand): (losses, state_dict, the evaluation's
    loss, the decision's pool_bias pairs)."""
    losses, state, pairs, evaluated = _run(
        net, kwargs, steps, True, size, "pool_bias", device,
        edit=None if pool_bias else (lambda d: replace(d, pool_bias={})))
    return losses, state, evaluated, pairs


def pools_summing_bias(monkeypatch, module) -> list:
    """The calls of `module`'s maxpool2d_backward given a bias gradient to sum, recorded
    (True per such call) as they run."""
    calls = []
    original = module.maxpool2d_backward

    def recorded(*args, **kwargs):
        if kwargs.get("gb") is not None:
            calls.append(True)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, "maxpool2d_backward", recorded)
    return calls


def assert_same_runs(a, b):
    assert a[0] == b[0] and a[2] == b[2]
    assert all(_bits(a[1][k]).tobytes() == _bits(b[1][k]).tobytes() for k in a[1])


@pytest.mark.parametrize("kwargs,sums", [({}, 3), ({"layout": "nhwc"}, 3),
                                         ({"micro_batches": 2}, 6), ({"relu_bits": True}, 3),
                                         ({"policy": "all", "memory_budget": "1MiB"}, 3),
                                         ({"precision": "bf16"}, 0)], ids=str)
def test_a_step_whose_pools_sum_bias_gradients_gives_the_bits_of_one_whose_relus_do(
        monkeypatch, kwargs, sums):
    """Three training steps and an evaluation of a decision with its pool_bias pairs against
    the same decision without them: the same losses, weights and evaluation, bit for bit;
    the pools sum the three biases' gradients in every pass (`sums` calls a step), but on
    bf16 maps on the CPU, whose pools widen them (their ReLUs sum)."""
    calls = pools_summing_bias(monkeypatch, cpu)
    fused = _decided_run(_one_reader_pools(), kwargs, 3, 24, True)
    assert fused[3] == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"}
    assert len(calls) == 3 * sums
    calls.clear()
    apart = _decided_run(_one_reader_pools(), kwargs, 3, 24, False)
    assert calls == []
    assert_same_runs(fused, apart)


def test_the_cpu_pool_sums_the_bias_gradient_of_its_output_in_bias_grads_bits():
    rng = np.random.default_rng(5)
    for kernel, stride, padding, ceil in GEOMETRIES:
        spec = PoolSpec(kernel=(kernel, kernel), stride=(stride, stride),
                        padding=(padding, padding), ceil_mode=ceil)
        x = rng.standard_normal((3, 6, 9, 9)).astype(np.float32)
        oh = out_size(9, kernel, stride, padding, ceil_mode=ceil)
        y, arg = np.empty((3, 6, oh, oh), np.float32), np.empty((3, 6, oh, oh), np.uint8)
        cpu.maxpool2d_forward(x, y, arg, spec, relu=True)
        gy = rng.standard_normal(y.shape).astype(np.float32)
        want, want_b = np.empty_like(x), np.empty(6, np.float32)
        cpu.maxpool2d_backward(gy, arg, want, spec, relu=True)
        cpu.bias_grad(want, want_b)
        got, got_b = np.full_like(x, 7), np.full(6, 7, np.float32)
        cpu.maxpool2d_backward(gy, arg, got, spec, relu=True, gb=got_b)
        assert _bits(got).tobytes() == _bits(want).tobytes()
        assert _bits(got_b).tobytes() == _bits(want_b).tobytes()


def test_a_decision_naming_other_pool_bias_pairs_is_refused():
    net = _one_reader_pools()
    decision = decide(net, 4)
    assert decision.pool_bias
    with pytest.raises(ConfigError, match="sum bias gradients"):
        Executor(net, 4, device="cpu", decision=replace(decision, pool_bias={"relu3": "pool3"}))
    with pytest.raises(ConfigError, match="add no bias"):
        Executor(net, 4, device="cpu", decision=replace(decision, bias_relu={},
                                                        conv_relu={}))
