"""column_totals (kernels/cuda_pointwise.py): the sum over the rows of a (rows, C) array in its
fixed order, which finishes every per-channel sum of a column pass (a bias gradient) and the
bias gradient of a fully connected layer on float32 maps. Skipped without a GPU."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
pw = pytest.importorskip("minidnn.kernels.cuda_pointwise")


def in_its_order(g: np.ndarray) -> np.ndarray:
    """The kernel's order on the host, in g's dtype: lane y adds rows y, y + L, ... from 0,
    then the lanes' sums are added in lane order."""
    lanes = np.zeros((pw.TOTAL_LANES, g.shape[1]), g.dtype)
    for r in range(g.shape[0]):
        lanes[r % pw.TOTAL_LANES] += g[r]
    total = lanes[0].copy()
    for j in range(1, pw.TOTAL_LANES):
        total += lanes[j]
    return total


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2048, 512), (1000, 70), (5, 3), (256, 4096)])
def test_the_totals_are_the_rows_summed_in_the_fixed_order(dtype, shape):
    g = (np.random.default_rng(0).standard_normal(shape) * 10).astype(dtype)
    out = cp.full(shape[1], np.nan, dtype)
    pw.column_totals(cp.asarray(g), out)
    got = cp.asnumpy(out)
    assert np.array_equal(got, in_its_order(g))
    np.testing.assert_allclose(got, g.astype(np.float64).sum(axis=0),
                               rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-3)


def test_other_arrays_are_refused():
    with pytest.raises(ValueError, match="column_totals"):
        pw.column_totals(cp.zeros((4, 3), np.float32)[:, :2], cp.zeros(2, np.float32))
    with pytest.raises(ValueError, match="column_totals"):
        pw.column_totals(cp.zeros((4, 3), np.float32), cp.zeros(3, np.float64))
