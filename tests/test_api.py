"""The Python API as a reference check against another framework uses it: input gradients,
a training step without dropout, a dtype for built-in models, gradients that are copies, and
shapes that say which batch they are of."""
import numpy as np
import pytest

from minidnn import Executor, models
from minidnn.errors import ConfigError


def batch(n=4, size=12, classes=10, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, size, size)).astype(dtype), rng.integers(0, classes, n)


def loss_at(net, x, y):
    with Executor(net, len(y), device="cpu", seed=1) as ex:
        return float(ex.forward(x, y, train=True, dropout=False))


def test_input_gradient_matches_finite_differences_in_float64():
    """tiny_cnn has a dropout layer: with dropout off the step is a function of x alone."""
    net = models.build("tiny_cnn", num_classes=10, image_size=12, dtype="float64")
    net.init_params(0)
    x, y = batch()
    with Executor(net, 4, device="cpu", seed=1, input_grad=True) as ex:
        ex.forward(x, y, dropout=False)
        ex.backward()
        gx = ex.input_gradient()
    assert gx.shape == x.shape and gx.dtype == np.float64 and np.abs(gx).max() > 0
    d = np.random.default_rng(2).standard_normal(x.shape)
    eps = 1e-5
    numeric = (loss_at(net, x + eps * d, y) - loss_at(net, x - eps * d, y)) / (2 * eps)
    assert float((gx * d).sum()) == pytest.approx(numeric, rel=1e-6)


def test_input_gradient_needs_asking_for():
    net = models.build("mlp", num_classes=10, image_size=8)
    with Executor(net, 2, device="cpu") as ex:
        with pytest.raises(ConfigError, match="input_grad=True"):
            ex.input_gradient()


def test_dropout_off_for_a_training_step():
    net = models.build("tiny_cnn", num_classes=10, image_size=12)
    x, y = batch(dtype=np.float32)
    with Executor(net, 4, device="cpu", seed=3) as ex:
        evaluated = float(ex.forward(x, y, train=False))
        ex.step = 0
        dropped = float(ex.forward(x, y, train=True))
        ex.backward()
        ex.step = 1                                   # other masks, were dropout on
        kept = float(ex.forward(x, y, train=True, dropout=False))
        ex.backward()
        grads = ex.gradients()
        ex.step = 5
        ex.forward(x, y, train=True, dropout=False)
        ex.backward()
        assert all(np.array_equal(grads[k], v) for k, v in ex.gradients().items())
    assert kept == evaluated and dropped != evaluated


def test_build_takes_a_dtype():
    net = models.build("tiny_cnn", num_classes=10, image_size=12, dtype=np.float64)
    assert net.dtype == np.float64
    net.init_params(0)
    assert all(p.data.dtype == np.float64 for _, p in net.parameters())
    assert models.build("mlp", num_classes=3, image_size=8).dtype == np.float32
    with pytest.raises(ConfigError, match="float32 or float64"):
        models.build("mlp", num_classes=3, image_size=8, dtype="int8")


def test_gradients_are_copies_that_later_steps_do_not_change():
    net = models.build("mlp", num_classes=10, image_size=8)
    x, y = batch(size=8, dtype=np.float32)
    with Executor(net, 4, device="cpu") as ex:
        ex.forward(x, y)
        ex.backward()
        first = ex.gradients()
        saved = {k: v.copy() for k, v in first.items()}
        ex.forward(x[::-1].copy(), y[::-1].copy())
        ex.backward()
        assert all(np.array_equal(first[k], saved[k]) for k in saved)
        assert any(not np.array_equal(v, saved[k]) for k, v in ex.gradients().items())


def test_shapes_say_which_batch_and_a_summary_leaves_them():
    net = models.build("tiny_cnn", num_classes=10, image_size=12)
    with Executor(net, 8, device="cpu"):
        assert net.batch == 8 and net.shapes["data"][0] == 8
        assert "input (2, 3, 12, 12)" in net.summary(2)
        assert net.batch == 8 and net.shapes["data"][0] == 8
        at3 = net.shapes_at(3)
        assert at3["data"] == (3, 3, 12, 12) and net.shapes["data"][0] == 8
