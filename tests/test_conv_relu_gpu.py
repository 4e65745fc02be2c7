"""A convolution that applies its bias and the ReLU after it (minidnn/fusion.py, conv_relu) on
the GPU: one cuDNN graph with the bias and the ReLU in the convolution's epilogue
(kernels/cudnn_conv.py, fprop_bias_relu) against the convolution and then the ReLU's pass
that adds the bias. The same arithmetic, but the fused graph runs on engines of its own, so
the two agree within the math mode's tolerance, not bit for bit; and a training step with
the fusion against the same step with --no-fuse. Skipped without a CUDA GPU."""
import numpy as np
import pytest

from minidnn.kernels import ConvSpec

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda = pytest.importorskip("minidnn.kernels.cuda")

RTOL = {"tf32": 2e-3, "fp32": 1e-5}
# (N, C, H, W, O, K, padding, stride): VGG-like, a strided first layer, a 1x1
CASES = [(4, 16, 14, 14, 32, 3, 1, 1), (2, 3, 31, 31, 16, 11, 2, 4), (3, 24, 7, 7, 40, 1, 0, 1)]


@pytest.fixture
def stream():
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        yield s
    s.synchronize()
    cuda.configure()


def laid_out(a, layout):
    d = cp.asarray(a)
    if layout == "nhwc":
        d = cp.ascontiguousarray(d.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return d


@pytest.mark.parametrize("math", ["tf32", "fp32"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_the_epilogue_gives_the_convolution_then_the_relu_pass(stream, case, layout, math):
    cuda.configure(math)
    n, c, h, w, o, k, pad, stride = case
    rng = np.random.default_rng(0)
    x = laid_out(rng.standard_normal((n, c, h, w)).astype(np.float32), layout)
    wt = cp.asarray((rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32))
    b = cp.asarray(rng.standard_normal(o).astype(np.float32))
    oh = (h + 2 * pad - k) // stride + 1
    spec = ConvSpec(stride=(stride, stride), padding=(pad, pad), key="conv_relu_test")
    fused = laid_out(np.full((n, o, oh, oh), np.nan, np.float32), layout)
    want = laid_out(np.full((n, o, oh, oh), np.nan, np.float32), layout)
    before = len(cuda._no_epilogue)
    cuda.conv2d_forward(x, wt, b, fused, spec, relu=True)
    cuda.conv2d_forward(x, wt, None, want, spec)
    cuda.relu_forward(want, want, b)
    got, ref = cp.asnumpy(fused), cp.asnumpy(want)
    assert np.isfinite(got).all() and (got >= 0).all()
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err < RTOL[math], f"max relative error {err:.3g}"
    if layout == "nhwc" and k == 3:    # the VGG case: cuDNN runs it fused (no fallback)
        assert len(cuda._no_epilogue) == before
        assert any(e.problem.op == "fprop_bias_relu" for e in cuda._cache().entries())


def test_a_step_whose_convolutions_apply_their_relus_trains_as_the_unfused_one():
    """tiny_cnn on float32 maps, channels last, strict FP32 sums, two steps: fused (conv_relu
    pairs) and with --no-fuse, from the same weights and batches: losses and weights agree
    within FP32 tolerance. (In TF32 the two steps' sums differ by about 1e-4, which this
    network's second step at lr 0.05 amplifies to about 1% of its loss.)"""
    from minidnn import models
    from test_fusion import _run
    settings = {"layout": "nhwc", "math": "fp32"}
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    losses, state, pairs, evaluated = _run(net, settings, 2, True, 16, "conv_relu",
                                           device="gpu")
    assert pairs
    plain_losses, plain_state, none, plain_evaluated = _run(
        models.build("tiny_cnn", num_classes=10, image_size=16), settings, 2, False, 16,
        "conv_relu", device="gpu")
    cuda.configure()
    assert none == {}
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    np.testing.assert_allclose(evaluated, plain_evaluated, rtol=1e-4)
    for key in state:
        scale = max(float(np.abs(plain_state[key]).max()), 1e-30)
        assert float(np.abs(state[key] - plain_state[key]).max()) <= 1e-4 * scale, key
