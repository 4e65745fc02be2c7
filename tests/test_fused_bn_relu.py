"""The ReLU after a batch norm folded into it (minidnn/fusion.py), forward and backward: on
bf16 maps the batch norm stores narrow(max(v, 0)), which is max(narrow(v), 0) bit for bit; in
backward it masks the gradient where the ReLU's output, recomputed from x, is not positive.
A fused step gives the bits of the unfused one in both precisions and layouts (on the CPU,
bf16 maps are emulated with ml_dtypes)."""
import numpy as np
import pytest

from minidnn.builder import NetBuilder
from minidnn.fusion import bn_relu_pairs
from minidnn.kernels import cpu, cpu_batchnorm
from minidnn.kernels.mapformat import MapFormat
from minidnn.memory.plan import LivenessPlan
from test_fusion import _run

pytest.importorskip("ml_dtypes")


def small_resnet():
    """A stem and one residual block, 8x8 images: conv -> bn -> relu pairs and a ReLU after
    the residual add (which the add applies: tests/test_fused_add_relu.py)."""
    b = NetBuilder("small_resnet", image_size=8, num_classes=10)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu1")
    b.conv("conv2", 8, 3, padding=1, bias=False)
    b.batchnorm("bn2")
    b.relu("relu2")
    b.conv("conv3", 8, 3, padding=1, bias=False)
    b.batchnorm("bn3")
    b.add("sum", ["bn3", "relu1"])
    b.relu("relu3")
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


def train(settings, fuse, steps=2):
    """(losses, state_dict, the decision's bn_relu, an evaluation's loss) after `steps`
    training steps of batch 4."""
    return _run(small_resnet(), settings, steps, fuse, 8, "bn_relu")


def test_bf16_maps_fuse_the_same_pairs_as_fp32_ones():
    net = small_resnet()
    fp32 = bn_relu_pairs(LivenessPlan(net, 2))
    assert fp32 == {"relu1": "bn1", "relu2": "bn2"}     # relu3 follows the add
    assert bn_relu_pairs(LivenessPlan(net, 2, maps=MapFormat("nchw", "bf16"))) == fp32


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_step_gives_the_bits_of_the_unfused_one(layout, precision, monkeypatch):
    settings = {"precision": precision, "layout": layout}
    calls = []
    relu_backward = cpu.relu_backward
    monkeypatch.setattr(cpu, "relu_backward", lambda *a: calls.append(1) or relu_backward(*a))
    losses, state, pairs, evaluated = train(settings, fuse=True)
    assert pairs == {"relu1": "bn1", "relu2": "bn2"}
    # The batch norms did relu1's and relu2's, the add relu3's: on float32 maps with the
    # kernel (one gradient for bn2 to read on: bn_grad), none on bf16 maps (widened).
    masks = 2 if precision == "fp32" else 0
    assert len(calls) == masks
    plain_losses, plain_state, none, plain_evaluated = train(settings, fuse=False)
    assert none == {} and len(calls) == masks + 2 * 3
    assert losses == plain_losses and evaluated == plain_evaluated
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k


def test_the_fused_bf16_forward_stores_max_of_the_rounded_value():
    """Values whose float32 v rounds to -0 or to +0 in bf16 and ordinary ones: the batch
    norm's fused store equals the ReLU run on its unfused bf16 output, bit for bit."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    tiny = np.float32(2.0 ** -135)                     # below half bf16's least subnormal
    x = np.array([-3, -tiny, tiny, 0, 1e-3, 7, -1e-40, 1e-40], np.float32).reshape(1, 2, 2, 2)
    mean, invstd = np.zeros(2, np.float32), np.ones(2, np.float32)
    w, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    fused, plain = np.empty_like(x), np.empty_like(x)
    cpu_batchnorm.batchnorm_forward(x, mean, invstd, w, b, fused, relu=True)
    cpu_batchnorm.batchnorm_forward(x, mean, invstd, w, b, plain)
    stored = plain.astype(bf16)
    relu = np.empty_like(stored)
    cpu.relu_forward(stored, relu)
    assert fused.astype(bf16).view(np.uint16).tolist() == relu.view(np.uint16).tolist()


def _bn_inputs(shape, dtype, seed=5):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape).astype(dtype)
    w = (1 + 0.3 * rng.standard_normal(c)).astype(dtype)
    b = (0.5 * rng.standard_normal(c)).astype(dtype)
    return rng, x, w, b


@pytest.mark.parametrize("stored", [None, "bf16"])
def test_the_backward_through_the_relu_is_the_relus_then_the_batch_norms(stored):
    """batchnorm_backward(relu=...) on gy gives the bits of cpu.relu_backward on the stored
    output and then batchnorm_backward; tiny outputs that bf16 stores as 0 pass nothing."""
    import ml_dtypes
    rng, x, w, b = _bn_inputs((3, 4, 5, 6), np.float32)
    c = x.shape[1]
    mean, invstd, y = np.empty(c, np.float32), np.empty(c, np.float32), np.empty_like(x)
    cpu_batchnorm.batchnorm_training_forward(x, w, b, y, mean, invstd, 1e-5)
    # Channel 0 maps x to itself, one output 2**-140 (a positive float32 that bf16 stores
    # as 0; the statistics need not be the batch's for the bits to agree).
    mean[0], invstd[0], w[0], b[0] = 0, 1, 1, 0
    x[0, 0, 0, 0] = 2.0 ** -140
    cpu_batchnorm.batchnorm_forward(x, mean, invstd, w, b, y, relu=True)
    dtype = ml_dtypes.bfloat16 if stored else None
    out = y.astype(dtype).astype(np.float32) if stored else y
    gy = rng.standard_normal(x.shape).astype(np.float32)
    masked = np.empty_like(gy)
    cpu.relu_backward(out, gy, masked)
    want = [np.empty_like(x), np.empty(c, np.float32), np.empty(c, np.float32)]
    cpu_batchnorm.batchnorm_backward(x, masked, mean, invstd, w, *want)
    got = [np.full_like(x, np.nan), np.empty(c, np.float32), np.empty(c, np.float32)]
    cpu_batchnorm.batchnorm_backward(x, gy, mean, invstd, w, *got, relu=(b, dtype))
    for g, v in zip(got, want):
        assert g.tobytes() == v.tobytes()
    if stored:   # the tiny output passed in float32 and not in bf16
        assert y[0, 0, 0, 0] > 0 and masked[0, 0, 0, 0] == 0
    in_place = gy.copy()
    cpu_batchnorm.relu_mask(x, in_place, mean, invstd, w, b, dtype)
    assert in_place.tobytes() == masked.tobytes()


def test_the_folded_backward_passes_a_gradient_check():
    """float64: d/dx of sum(gy * relu(bn(x))) by central differences along random
    directions, against batchnorm_backward through the ReLU (and the parameters')."""
    rng, x, w, b = _bn_inputs((4, 3, 3, 2), np.float64, seed=7)
    c = x.shape[1]
    gy = rng.standard_normal(x.shape)

    def loss(x, w, b):
        y, mean, invstd = np.empty_like(x), np.empty(c), np.empty(c)
        cpu_batchnorm.batchnorm_training_forward(x, w, b, y, mean, invstd, 1e-5, relu=True)
        return float((gy * y).sum()), mean, invstd

    _, mean, invstd = loss(x, w, b)
    gx, gw, gb = np.empty_like(x), np.empty(c), np.empty(c)
    cpu_batchnorm.batchnorm_backward(x, gy, mean, invstd, w, gx, gw, gb, relu=(b, None))
    eps = 1e-6
    for _ in range(3):
        for k, (value, grad) in enumerate(((x, gx), (w, gw), (b, gb))):
            d = rng.standard_normal(value.shape)
            args = [x, w, b]
            args[k] = value + eps * d
            up = loss(*args)[0]
            args[k] = value - eps * d
            down = loss(*args)[0]
            np.testing.assert_allclose((up - down) / (2 * eps), float((grad * d).sum()),
                                       rtol=1e-5, atol=1e-8)


def test_the_bandwidth_script_says_in_one_line_that_it_needs_a_gpu():
    import subprocess
    import sys
    from minidnn.backend import gpu_available
    if gpu_available():
        pytest.skip("a GPU is here: the script would measure")
    proc = subprocess.run([sys.executable, "scripts/bn_bandwidth.py"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("minidnn: error: bn_bandwidth.py needs a GPU")
    assert len(proc.stderr.strip().splitlines()) == 1


class _Statistics:
    """Kernels with statistics from elsewhere (as distributed/sync_batchnorm.py's), whose
    backward knows nothing of a ReLU: here the CPU's own."""

    def batchnorm_training_forward(self, *args, **kwargs):
        cpu_batchnorm.batchnorm_training_forward(*args, **kwargs)

    def batchnorm_backward(self, x, gy, mean, invstd, weight, gx, gweight, gbias):
        cpu_batchnorm.batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias)


def test_a_batch_norm_with_synchronized_statistics_masks_the_gradient_first():
    from minidnn.layers import StepContext
    from minidnn.layers.batchnorm import BatchNorm2d
    rng, x, w, b = _bn_inputs((3, 4, 5, 6), np.float32, seed=8)
    results = []
    for sync in (None, _Statistics()):
        layer = BatchNorm2d(name="bn")
        layer.setup([x.shape], np.float32)
        layer.params["weight"].data, layer.params["bias"].data = w.copy(), b.copy()
        for p in layer.params.values():
            p.grad = np.empty_like(p.data)
        for buffer in layer.buffers.values():
            buffer.data = buffer.initial_value(np.float32)
        layer.statistics_sync = sync
        ctx = StepContext(np, relu_in_bn=frozenset({"bn"}))
        aux = {"mean": np.empty(4, np.float32), "invstd": np.empty(4, np.float32)}
        y = np.empty_like(x)
        layer.forward([x], y, aux, ctx)
        gy = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
        gx = np.empty_like(x)
        layer.backward([x], None, gy, [gx], aux, ctx)
        results.append([gx.tobytes()] + [p.grad.tobytes() for p in layer.params.values()])
    assert results[0] == results[1]
