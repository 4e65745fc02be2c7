"""The GPU's counter-based random numbers (kernels/cuda_random.py) against their NumPy
reference, bit for bit, and what dropout takes from them. Skipped without a CUDA GPU."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
rnd = pytest.importorskip("minidnn.kernels.cuda_random")


@pytest.mark.parametrize("n", [1, 255, 256, 4096 * 256 + 17, 3_000_001])
def test_the_gpu_draws_are_the_numpy_reference_bit_for_bit(n):
    key = rnd.fold_key([11, 3, 7])
    got = rnd.CounterUniform(key).random((n,))
    want = rnd.draws(key, n)
    assert got.dtype == np.float32
    assert np.array_equal(cp.asnumpy(got).view(np.uint32), want.view(np.uint32))
    assert float(got.min()) >= 0.0 and float(got.max()) < 1.0


def test_draws_look_uniform_and_keys_differ():
    a = cp.asnumpy(rnd.counter_generator([0, 1, 2]).random((1_000_000,)))
    b = cp.asnumpy(rnd.counter_generator([0, 1, 3]).random((1_000_000,)))
    assert abs(a.mean() - 0.5) < 2e-3 and abs(a.var() - 1 / 12) < 1e-3
    counts = np.histogram(a, bins=16, range=(0, 1))[0]
    assert counts.min() > 0.98 * 1_000_000 / 16 and counts.max() < 1.02 * 1_000_000 / 16
    assert abs(np.corrcoef(a, b)[0, 1]) < 5e-3 and abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5e-3


def test_out_is_filled_in_place_and_checked():
    gen = rnd.CounterUniform(5)
    out = cp.empty((3, 4), np.float32)
    assert gen.random((3, 4), out=out) is out
    assert np.array_equal(cp.asnumpy(out).ravel(), rnd.draws(5, 12))
    with pytest.raises(ValueError):
        gen.random((4, 3), out=out)
    with pytest.raises(TypeError):
        gen.random((3,), dtype=np.float64)


def test_making_a_generator_allocates_nothing_on_the_device():
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    gens = [rnd.counter_generator([0, s, 1]) for s in range(10)]
    assert pool.used_bytes() == before and len(gens) == 10
