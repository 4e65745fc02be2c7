"""A fully connected layer's weight gradient added in its product (kernels/cuda_linear.py,
linear_backward(..., add=True): cuBLAS's beta = 1), against the product into a temporary
then added, as a micro-batch after a step's first took it before. Skipped without a GPU."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda = pytest.importorskip("minidnn.kernels.cuda")
from minidnn.kernels import mapformat  # noqa: E402

BF16 = mapformat.bfloat16()

# (rows, in, out): a classifier's small product and VGG-16's fc6 in a micro-batch of 32,
# whose long sums cuBLAS may split.
SHAPES = [(64, 512, 100), (32, 25088, 4096)]
# A product added in its epilogue may run on another kernel than the plain product, whose
# sums may be grouped otherwise: TF32 and bf16 products agree to their input rounding.
RTOL = {"fp32": 1e-5, "tf32": 3e-3, "bf16": 1e-2}


@pytest.fixture(autouse=True)
def math_mode():
    before = cuda.math_mode()
    yield
    cuda.configure(**before)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
def test_the_product_adds_the_weight_gradient_as_a_temporary_added_would(mode, shape):
    cuda.configure("fp32" if mode == "fp32" else "tf32", deterministic=False)
    rows, k, out = shape
    rng = np.random.default_rng(0)
    dtype = BF16 if mode == "bf16" else np.float32
    x = cp.asarray(rng.standard_normal((rows, k)).astype(dtype))
    gy = cp.asarray(rng.standard_normal((rows, out)).astype(dtype))
    w = cp.asarray(rng.standard_normal((out, k)).astype(np.float32))
    held = cp.asarray(rng.standard_normal((out, k)).astype(np.float32))
    gb, tmp_b = cp.empty(out, np.float32), cp.empty(out, np.float32)

    tmp = cp.empty_like(held)
    cuda.linear_backward(x, gy, w, tmp, tmp_b, None)
    apart = held.copy()
    cuda.add(apart, tmp, apart)
    runs = []
    for _ in range(2):
        added = held.copy()
        cuda.linear_backward(x, gy, w, added, gb, None, add=True)
        runs.append(cp.asnumpy(added))
    assert np.array_equal(runs[0], runs[1]), "the same bits run to run"
    assert np.array_equal(cp.asnumpy(gb), cp.asnumpy(tmp_b)), "the bias is overwritten"
    product = cp.asnumpy(tmp).astype(np.float64)
    scale = np.abs(product).max()
    np.testing.assert_allclose(runs[0], cp.asnumpy(apart), rtol=0, atol=RTOL[mode] * scale)
    assert not np.array_equal(runs[0], cp.asnumpy(held)), "the product was added"


def test_a_fresh_process_runs_its_float32_products_in_the_convolutions_math_mode():
    """Without configure() (a `minidnn train` without --math), the fully connected products
    sum as the convolutions do: TF32, the kernels' default (they ran strict FP32, several
    times slower, while the convolutions ran TF32)."""
    import subprocess
    import sys
    code = ("import minidnn.kernels.cuda as c, minidnn.kernels.cuda_linear as l; "
            "assert c.math_mode()['math'] == 'tf32'; "
            "assert l._float32_compute['type'] == l._COMPUTE_32F_FAST_TF32")
    subprocess.run([sys.executable, "-c", code], check=True)
