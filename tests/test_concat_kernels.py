"""The CPU's concatenation ops (kernels/cpu.py), the reference the GPU's kernels are held to:
bits as NumPy's concatenate gives them, a skipped gradient left alone, any axis and layout."""
import numpy as np
import pytest

from minidnn.kernels import cpu


def laid_out(a, layout):
    """a (N, C, H, W) as the same values stored channels last for 'nhwc'."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) \
        if layout == "nhwc" else a


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("axis", [1, 2, -1])
def test_concat_ops_move_numpys_bits(axis, layout):
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 4, 5), (2, 3, 4, 5)]
    shapes[1] = tuple(s + (i == axis % 4) for i, s in enumerate(shapes[1]))
    xs = [laid_out(rng.standard_normal(s).astype(np.float32), layout) for s in shapes]
    want = np.concatenate(xs, axis=axis)
    y = laid_out(np.full(want.shape, np.nan, np.float32), layout)
    cpu.concat_forward(xs, y, axis)
    np.testing.assert_array_equal(y, want)

    gy = rng.standard_normal(want.shape).astype(np.float32)
    sizes = [s[axis] for s in shapes]
    kept = np.full(shapes[1], 7.0, np.float32)
    gx0 = laid_out(np.empty(shapes[0], np.float32), layout)
    cpu.concat_backward(gy, [gx0, None], sizes, axis)
    np.testing.assert_array_equal(gx0, np.split(gy, [sizes[0]], axis=axis)[0])
    gx1 = laid_out(kept.copy(), layout)
    cpu.concat_backward(gy, [None, gx1], sizes, axis)
    np.testing.assert_array_equal(gx1, np.split(gy, [sizes[0]], axis=axis)[1])
