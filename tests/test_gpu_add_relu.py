"""The residual add with the ReLU after it folded in (minidnn/fusion.py) on the GPU: the
add_relu, relu_mask_copy and relu_mask_sum kernels (kernels/cuda_pointwise.py) against NumPy, bit for bit
(a sum and a selection are exact in float32; on bf16 maps the sum is rounded once), on odd
sizes and misaligned arrays, in place, both layouts; and a fused training step of a small
residual network giving the bits of the unfused one. Skipped without a CUDA GPU."""
import numpy as np
import pytest

from test_bf16_gpu import BF16, gpu, to_device  # noqa: F401, F811  (gpu: the fixture)
from test_gpu_batchnorm_fused import raw

pytestmark = pytest.mark.gpu

# (N, C, H, W): vectors in both layouts, odd sizes (single values), several blocks.
SHAPES = [(2, 8, 4, 4), (3, 5, 7, 11), (1, 3, 1, 1), (4, 16, 9, 9)]


def values(shape, dtype, seed):
    """Random values with exact zeros, negative zeros and sums that cancel among them."""
    v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = v.reshape(-1)
    flat[::7] = 0.0
    flat[3::11] = -0.0
    return v.astype(dtype)


def want_add_relu(a, b):
    """max(a + b, 0) as the contract says: the float32 sum stored in the maps' dtype (rounded
    once for bf16), then +0 where that stored value is not positive."""
    s = (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)
    return np.where(s.astype(np.float32) > 0, s, np.zeros((), a.dtype))


def want_mask(y, gy):
    return np.where(y.astype(np.float32) > 0, gy, np.zeros((), gy.dtype))


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_relu_and_its_backward_against_numpy(gpu, shape, layout, dtype):
    cp, _, _ = gpu
    from minidnn.kernels import cuda_pointwise as pw
    a, b = values(shape, dtype, 1), values(shape, dtype, 2)
    b.reshape(-1)[5::13] = -a.reshape(-1)[5::13]              # sums of exactly zero
    want = want_add_relu(a, b)
    da, db = to_device(cp, a, layout), to_device(cp, b, layout)
    out = to_device(cp, np.zeros(shape, dtype), layout)
    pw.add_relu(da, db, out)
    assert raw(cp, out).tobytes() == want.tobytes()
    pw.add_relu(da, db, da)                                   # in place over input 0
    assert raw(cp, da).tobytes() == want.tobytes()

    gy = values(shape, dtype, 3)
    masked = want_mask(want, gy)
    dgy = to_device(cp, gy, layout)
    gx1 = to_device(cp, np.ones(shape, dtype), layout)
    pw.relu_mask_copy(out, dgy, dgy, gx1)                     # gx0 is gy, as in a step
    assert raw(cp, dgy).tobytes() == masked.tobytes() == raw(cp, gx1).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1001, 3 * 7 * 11 * 13])
def test_misaligned_odd_arrays_run_one_value_a_thread(gpu, n, dtype):
    cp, _, _ = gpu
    from minidnn.kernels import cuda_pointwise as pw
    from test_pointwise_gpu import on_device
    a, b, gy = (values((n,), dtype, s) for s in (4, 5, 6))
    da, db, dgy = on_device(a, 1), on_device(b, 1), on_device(gy, 1)
    assert pw._vector((da, db), n) == 1
    out, gx0, gx1 = on_device(np.zeros(n, dtype), 1), on_device(gy, 1), \
        on_device(np.zeros(n, dtype), 1)
    pw.add_relu(da, db, out)
    want = want_add_relu(a, b)
    assert cp.asnumpy(out).tobytes() == want.tobytes()
    pw.relu_mask_copy(out, dgy, gx0, gx1)                     # gx0 a buffer of its own
    masked = want_mask(want, gy)
    assert cp.asnumpy(gx0).tobytes() == masked.tobytes() == cp.asnumpy(gx1).tobytes()
    assert cp.asnumpy(dgy).tobytes() == gy.tobytes()          # gy itself untouched


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_gpu_step_gives_the_bits_of_the_unfused_one(gpu, precision, layout):
    """tests/test_fused_bn_relu.py's stem and residual block trained two steps on the GPU
    with deterministic algorithms and evaluated, fused (the add applies relu3) and not: the
    same bits."""
    from test_fused_bn_relu import small_resnet
    from test_fusion import _run
    settings = {"precision": precision, "layout": layout, "deterministic": True}
    losses, state, pairs, evaluated = _run(small_resnet(), settings, 2, True, 8, "add_relu",
                                           device="gpu")
    assert pairs == {"relu3": "sum"}
    plain_losses, plain_state, none, plain_evaluated = _run(
        small_resnet(), settings, 2, False, 8, "add_relu", device="gpu")
    assert none == {} and losses == plain_losses and evaluated == plain_evaluated
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_mask_of_a_sum_against_numpy(gpu, shape, layout, dtype):
    """relu_mask_sum_copy (a gradient sum the add takes over, minidnn/fusion.py): the sum
    stored as add stores it (rounded once for bf16), then the mask; in place into gy, and
    misaligned odd arrays one value a thread."""
    cp, _, _ = gpu
    from minidnn.kernels import cuda_pointwise as pw
    from test_pointwise_gpu import on_device
    y, gy, g2 = values(shape, dtype, 7), values(shape, dtype, 8), values(shape, dtype, 9)
    g2.reshape(-1)[4::9] = -gy.reshape(-1)[4::9]              # sums of exactly zero
    total = (gy.astype(np.float32) + g2.astype(np.float32)).astype(dtype)
    want = want_mask(y, total)
    dy, dgy, dg2 = (to_device(cp, a, layout) for a in (y, gy, g2))
    gx1 = to_device(cp, np.ones(shape, dtype), layout)
    pw.relu_mask_sum_copy(dy, dgy, dg2, dgy, gx1)
    assert raw(cp, dgy).tobytes() == want.tobytes() == raw(cp, gx1).tobytes()
    n = y.size
    flat = [on_device(a.reshape(-1), 1) for a in (y, gy, g2)]
    out0, out1 = on_device(np.zeros(n, dtype), 1), on_device(np.zeros(n, dtype), 1)
    pw.relu_mask_sum_copy(*flat, out0, out1)
    assert cp.asnumpy(out0).tobytes() == want.reshape(-1).tobytes() == \
        cp.asnumpy(out1).tobytes()
    # relu_mask_sum, its one-output form (bn_grad): in place into gy, then misaligned
    dy, dgy, dg2 = (to_device(cp, a, layout) for a in (y, gy, g2))
    pw.relu_mask_sum(dy, dgy, dg2, dgy)
    assert raw(cp, dgy).tobytes() == want.tobytes()
    flat = [on_device(a.reshape(-1), 1) for a in (y, gy, g2)]
    pw.relu_mask_sum(*flat, out0)
    assert cp.asnumpy(out0).tobytes() == want.reshape(-1).tobytes()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_gpu_step_whose_add_sums_gives_the_bits_of_the_unfused_one(gpu, precision, layout):
    """Two residual blocks (tests/test_fused_add_sum.py): the first block's add takes over
    the sum of its output's gradient parts; two steps and an evaluation against --no-fuse,
    deterministic algorithms: the same bits."""
    from test_fused_add_sum import two_blocks
    from test_fusion import _run
    settings = {"precision": precision, "layout": layout, "deterministic": True}
    losses, state, pairs, evaluated = _run(two_blocks(), settings, 2, True, 8, "add_sum",
                                           device="gpu")
    assert pairs == {"b1.sum": "b2.conv1"}
    plain_losses, plain_state, none, plain_evaluated = _run(
        two_blocks(), settings, 2, False, 8, "add_sum", device="gpu")
    assert none == {} and losses == plain_losses and evaluated == plain_evaluated
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_gpu_step_whose_batch_norms_read_the_other_gradient_gives_the_unfused_bits(
        gpu, precision, layout):
    """A projection block and an identity block (tests/test_fused_bn_grad.py): each add
    writes one gradient, which the batch norm before it reads on (bn_grad), and takes that
    batch norm's sums of it (bn_sums: whole-batch statistics, inputs kept; the projection
    block's add in place into gy); two steps and an evaluation against --no-fuse,
    deterministic algorithms: the same bits."""
    from test_fused_bn_grad import PAIRS, projected_blocks
    from test_fusion import _run
    settings = {"precision": precision, "layout": layout, "deterministic": True}
    losses, state, pairs, evaluated = _run(projected_blocks(), settings, 2, True, 8,
                                           "bn_sums", device="gpu")
    assert pairs == PAIRS
    plain_losses, plain_state, none, plain_evaluated = _run(
        projected_blocks(), settings, 2, False, 8, "bn_sums", device="gpu")
    assert none == {} and losses == plain_losses and evaluated == plain_evaluated
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k

