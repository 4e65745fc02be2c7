"""Every layer's backward against float64 finite differences (minidnn.gradcheck), the in-place
contract where a layer declares it, and the errors bad shapes and arguments raise."""
import numpy as np
import pytest

from minidnn.errors import ConfigError, ShapeError
from minidnn.gradcheck import check_backward
from minidnn.kernels import cpu as cpu_kernels
from minidnn.layers import (LRN, Add, AvgPool2d, Concat, Conv2d, Dropout, Flatten, Linear,
                            MaxPool2d, ReLU, SoftmaxCrossEntropy, StepContext)


# ---- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer, shape", [
    (Conv2d(4, 3), (2, 3, 6, 5)),
    (Conv2d(4, 3, padding=1, bias=False), (2, 2, 5, 5)),
    (Conv2d(6, (3, 2), stride=(2, 1), padding=(1, 0)), (2, 4, 7, 6)),
    (Conv2d(6, 3, groups=2, padding=1), (1, 4, 5, 5)),
    (Conv2d(4, 3, groups=4, padding=1, stride=2), (2, 4, 7, 7)),       # depthwise
    (Conv2d(3, 3, dilation=2, padding=2), (1, 2, 7, 6)),
    (Conv2d(2, 5, stride=4, padding=2), (1, 3, 11, 11)),
    (Conv2d(5, 1, init="uniform_fan_in"), (2, 3, 3, 4)),
], ids=["3x3", "pad-nobias", "rect-stride", "groups2", "depthwise-s2", "dilated", "s4-5x5", "1x1"])
def test_conv_gradients(layer, shape):
    check_backward(layer, [shape])


@pytest.mark.parametrize("layer, shape", [
    (MaxPool2d(2), (2, 3, 6, 6)),
    (MaxPool2d(3, stride=2), (2, 2, 7, 7)),                  # overlapping
    (MaxPool2d(3, stride=2, padding=1), (1, 2, 6, 7)),
    (MaxPool2d(3, stride=2, ceil_mode=True), (1, 2, 6, 6)),
    (MaxPool2d((2, 3), stride=(1, 2), padding=(1, 1), ceil_mode=True), (1, 2, 5, 6)),
], ids=["2x2", "3x3s2", "3x3s2p1", "ceil", "rect-ceil"])
def test_maxpool_gradients(layer, shape):
    check_backward(layer, [shape])


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("layer_args, shape", [
    (dict(kernel_size=2), (2, 3, 6, 6)),
    (dict(kernel_size=3, stride=2), (2, 2, 7, 7)),
    (dict(kernel_size=3, stride=2, padding=1), (1, 2, 6, 7)),
    (dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), (1, 2, 6, 6)),
    (dict(kernel_size=(2, 3), stride=(3, 2), padding=(1, 1), ceil_mode=True), (1, 2, 7, 6)),
], ids=["2x2", "3x3s2", "3x3s2p1", "ceil-p1", "rect-ceil"])
def test_avgpool_gradients(layer_args, shape, count_include_pad):
    check_backward(AvgPool2d(**layer_args, count_include_pad=count_include_pad), [shape])


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn_gradients(size):
    # alpha large enough that the cross-channel term is far above the tolerance.
    check_backward(LRN(size=size, alpha=0.9, beta=0.75, k=1.0), [(2, 6, 3, 2)])


def test_lrn_gradients_default_constants():
    check_backward(LRN(), [(2, 7, 3, 3)])


def test_dropout_gradients_in_training():
    layer = Dropout(0.3)
    layer.index = 0  # the mask's random stream is keyed by the layer's position
    check_backward(layer, [(4, 5, 3)])


@pytest.mark.parametrize("p, train", [(0.5, False), (0.0, True)])
def test_dropout_identity(p, train):
    layer = Dropout(p)
    layer.index = 0
    check_backward(layer, [(3, 4)], train=train)
    layer.setup([(3, 4)], np.float64)
    x = np.random.default_rng(0).standard_normal((3, 4))
    y = np.empty_like(x)
    layer.forward([x], y, {"mask": np.zeros((3, 4), bool)}, StepContext(np, train=train))
    np.testing.assert_array_equal(y, x)


def test_dropout_mask_rate_scale_and_replay():
    layer = Dropout(0.25)
    layer.index = 3
    layer.setup([(200, 50)], np.float32)
    x = np.ones((200, 50), np.float32)
    outs = []
    for step in (0, 0, 1):
        ctx = StepContext(np, train=True, step=step, seed=7)
        y = np.empty_like(x)
        mask = np.empty(x.shape, bool)
        layer.forward([x], y, {"mask": mask}, ctx)
        outs.append(y)
        assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
        assert abs((y == 0).mean() - 0.25) < 0.02
        np.testing.assert_array_equal(y != 0, mask)
    np.testing.assert_array_equal(outs[0], outs[1])    # same (seed, step, layer): same mask
    assert not np.array_equal(outs[0], outs[2])        # next step: a new mask


def test_concat_gradients_three_inputs():
    check_backward(Concat(), [(2, 1, 3, 3), (2, 3, 3, 3), (2, 2, 3, 3)])


def test_concat_other_axis_and_vectors():
    check_backward(Concat(axis=-1), [(2, 3, 2), (2, 3, 4)])
    check_backward(Concat(), [(3, 2), (3, 5)])


def test_concat_places_inputs_in_order():
    layer = Concat()
    layer.setup([(1, 1, 2), (1, 2, 2)])
    y = np.empty((1, 3, 2))
    layer.forward([np.zeros((1, 1, 2)), np.ones((1, 2, 2))], y, {}, StepContext(np))
    np.testing.assert_array_equal(y[0, :, 0], [0, 1, 1])


@pytest.mark.parametrize("n", [2, 3])
def test_add_gradients(n):
    check_backward(Add(), [(2, 3, 4, 2)] * n)


def test_given_layers_gradients():
    check_backward(ReLU(), [(3, 4, 2, 2)])
    check_backward(ReLU(keep="bits"), [(3, 4, 2, 2)])
    check_backward(ReLU(keep="bits"), [(3, 7, 5, 3)])       # 315 values: a partial last word
    check_backward(Linear(5), [(3, 7)])
    check_backward(Linear(2, bias=False), [(4, 3)])
    check_backward(Flatten(), [(2, 3, 2, 2)])
    labels = np.array([0, 3, 1, 3])
    check_backward(SoftmaxCrossEntropy(), [(4, 5), (4,)], inputs=[None, labels])


# ---- the checker itself can fail -----------------------------------------------------------------
class _OffByOneConv(Conv2d):
    """Conv2d whose input gradient is slightly wrong."""

    def backward(self, xs, y, gy, gxs, aux, ctx):
        super().backward(xs, y, gy, gxs, aux, ctx)
        gxs[0] *= 1.01


class _WeightGradTransposedConv(Conv2d):
    """Conv2d whose weight gradient is flipped along the kernel axes."""

    def backward(self, xs, y, gy, gxs, aux, ctx):
        super().backward(xs, y, gy, gxs, aux, ctx)
        w = self.params["weight"]
        w.grad[...] = w.grad[:, :, ::-1, ::-1].copy()


class _ForgetsToRetain(LRN):
    """LRN that reads its input in backward without declaring it."""
    retain_inputs = ()


def test_broken_input_gradient_is_caught():
    with pytest.raises(AssertionError, match="input 0 gradient"):
        check_backward(_OffByOneConv(3, 3, name="bad"), [(1, 2, 5, 5)])


def test_broken_weight_gradient_is_caught():
    with pytest.raises(AssertionError, match="weight gradient"):
        check_backward(_WeightGradTransposedConv(3, 3, name="bad"), [(1, 2, 5, 5)])


def test_undeclared_retained_input_is_caught():
    with pytest.raises((TypeError, AttributeError)):
        check_backward(_ForgetsToRetain(3, alpha=0.5), [(1, 4, 2, 2)])


# ---- bad shapes and arguments --------------------------------------------------------------------
@pytest.mark.parametrize("layer, shapes, words", [
    (Conv2d(4, 3, name="convA"), [(2, 12)], "(N, C, H, W)"),
    (Conv2d(4, 3, groups=2, name="convB"), [(1, 3, 8, 8)], "divisible by groups=2"),
    (Conv2d(4, 5, padding=1, name="convC"), [(1, 3, 2, 8)], "dilated kernel"),
    (Conv2d(4, 3, dilation=3, name="convD"), [(1, 3, 6, 6)], "dilated kernel"),
    (MaxPool2d(3, name="poolA"), [(1, 3, 2, 2)], "at least the kernel"),
    (AvgPool2d(2, name="poolB"), [(1, 3, 8)], "(N, C, H, W)"),
    (LRN(name="lrnA"), [(4, 10)], "(N, C, H, W)"),
    (Add(name="addA"), [(1, 2, 3, 3), (1, 2, 3, 4)], "input 1 of shape (1, 2, 3, 4)"),
    (Add(name="addB"), [(1, 2, 3, 3)], "at least 2 inputs"),
    (Concat(name="catA"), [(1, 2, 3, 3), (1, 2, 4, 3)], "except along axis 1"),
    (Concat(axis=3, name="catB"), [(2, 5)], "axis 3"),
])
def test_bad_input_shape_names_the_layer(layer, shapes, words):
    with pytest.raises(ShapeError) as err:
        layer.setup(shapes)
    assert repr(layer.name) in str(err.value)
    assert words in str(err.value)


@pytest.mark.parametrize("make, words", [
    (lambda: Conv2d(5, 3, groups=2, name="c"), "divisible by groups=2"),
    (lambda: Conv2d(4, 0, name="c"), "kernel_size"),
    (lambda: Conv2d(4, 3, stride=(1, 0), name="c"), "stride"),
    (lambda: Conv2d(4, 3, algo="fast", name="c"), "algo"),
    (lambda: MaxPool2d(3, padding=2, name="p"), "at most half the kernel"),
    (lambda: AvgPool2d(2, padding=(0, 2), name="p"), "at most half the kernel"),
    (lambda: MaxPool2d(17), "uint8"),
    (lambda: Dropout(1.0), "p must be in [0, 1)"),
    (lambda: LRN(k=0.0), "k > 0"),
    (lambda: Concat(axis=0), "non-batch axis"),
    (lambda: Linear(0, name="fc"), "Linear 'fc': out_features must be a positive int, got 0"),
    (lambda: Linear("x"), "Linear: out_features must be a positive int, got 'x'"),
    (lambda: Linear(True), "out_features must be a positive int, got True"),
    (lambda: Linear(10, init="he_norml"), "init must be one of he_normal, uniform_fan_in, "
                                          "normal_0.01, zeros, ones; got 'he_norml'"),
    (lambda: Conv2d(4, 3, init="xavier", name="c"), "Conv2d 'c': init must be one of"),
])
def test_bad_arguments(make, words):
    with pytest.raises(ConfigError, match=None) as err:
        make()
    assert words in str(err.value)


def test_the_initializers_layers_accept_are_those_parameters_know():
    from minidnn.layers.base import Parameter
    from minidnn.layers.conv import INITIALIZERS
    rng = np.random.default_rng(0)
    for init in INITIALIZERS:
        assert Parameter((2, 3), init, fan_in=3).initial_value(rng, np.float32).shape == (2, 3)
        assert Linear(4, init=init).init == Conv2d(4, 3, init=init).init == init
    with pytest.raises(ValueError, match="unknown initializer"):
        Parameter((2, 3), "xavier").initial_value(rng, np.float32)


# ---- settings the rest of the framework reads ----------------------------------------------------
def test_conv_spec_follows_algo_and_flops():
    conv = Conv2d(8, 3, stride=2, padding=1, groups=2, name="c1")
    conv.setup([(4, 6, 9, 9)])
    assert conv.out_shape == (4, 8, 5, 5)
    assert conv.params["weight"].shape == (8, 3, 3, 3)
    assert conv.spec.stride == (2, 2) and conv.spec.groups == 2 and conv.spec.key == "c1"
    assert conv.spec.algo == "fastest"
    conv.algo = "min_workspace"
    assert conv.spec.algo == "min_workspace"
    assert conv.flops() == 2 * 4 * 8 * 5 * 5 * 3 * 3 * 3
    with pytest.raises(ConfigError):
        conv.algo = "bogus"


def test_what_each_layer_keeps_for_backward():
    """What the memory manager must keep: inputs, outputs and 1-byte aux buffers."""
    pool = MaxPool2d(3, stride=2)
    pool.setup([(2, 4, 9, 9)])
    assert pool.retain_inputs == () and not pool.retain_output
    assert pool.aux_specs() == {"argmax": ((2, 4, 4, 4), np.uint8)}
    avg = AvgPool2d(2)
    avg.setup([(2, 4, 8, 8)])
    assert avg.retain_inputs == () and not avg.retain_output and avg.aux_specs() == {}
    lrn = LRN()
    lrn.setup([(2, 4, 3, 3)], np.float32)
    assert lrn.retain_inputs == (0,) and not lrn.retain_output
    assert lrn.aux_specs() == {"scale": ((2, 4, 3, 3), np.float32)}
    drop = Dropout()
    drop.setup([(2, 8)])
    assert drop.inplace and drop.retain_inputs == () and not drop.retain_output
    shape, dtype = drop.aux_specs()["mask"]
    assert shape == (2, 8) and np.dtype(dtype).itemsize == 1
    for layer in (Concat(), Add()):
        assert layer.retain_inputs == () and not layer.retain_output and layer.num_inputs is None


def test_layers_use_the_kernels_in_the_context():
    """Layers go through ctx.kernels, so the executor's choice of kernel module is honoured."""
    calls = []

    class Recorder:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(cpu_kernels, name)
    ctx = StepContext(np, kernels=Recorder())
    conv, pool, lrn = Conv2d(2, 3, padding=1), MaxPool2d(2), LRN(3)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    for layer in (conv, pool, lrn):
        layer.setup([x.shape])
        for p in layer.params.values():
            p.data = np.ones(p.shape, np.float32)
            p.grad = np.empty(p.shape, np.float32)
        y = np.empty(layer.out_shape, np.float32)
        aux = {k: np.empty(s, d) for k, (s, d) in layer.aux_specs().items()}
        layer.forward([x], y, aux, ctx)
        layer.backward([x], None, np.ones_like(y), [np.empty_like(x)], aux, ctx)
    # The weight gradient before the data gradient: the latter may overwrite the input.
    assert calls == ["conv2d_forward", "conv2d_backward_filter", "conv2d_backward_data",
                     "maxpool2d_forward", "maxpool2d_backward", "lrn_forward", "lrn_backward"]


def test_relu_keeps_its_output_or_a_bit_per_value():
    from minidnn.errors import ConfigError
    with pytest.raises(ConfigError, match="keep must be one of output, bits"):
        ReLU(keep="mask")
    relu = ReLU(keep="bits")
    relu.setup([(2, 3, 5, 7)])
    assert not relu.retain_output
    assert relu.aux_specs() == {"mask": ((28,), np.uint8)}  # 210 values: 7 words of 32 bits
    relu.keep = "output"
    assert relu.retain_output and relu.aux_specs() == {}
