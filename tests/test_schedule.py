"""Learning-rate schedules and label smoothing: values, errors, float64 gradient check."""
import math

import numpy as np
import pytest

from minidnn.errors import ConfigError
from minidnn.gradcheck import check_backward
from minidnn.layers.base import StepContext
from minidnn.layers.loss import SoftmaxCrossEntropy, example_losses
from minidnn.lr_schedule import LRSchedule


def test_constant_is_the_base_rate_after_a_linear_warm_up():
    s = LRSchedule("constant", 0.1, total_steps=20, warmup_steps=4)
    assert [s.lr_at(k) for k in range(5)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    assert s.lr_at(19) == 0.1
    assert LRSchedule("constant", 0.1, 20).lr_at(0) == 0.1


def test_cosine_starts_at_the_base_rate_after_warm_up_and_falls_towards_zero():
    s = LRSchedule("cosine", 0.2, total_steps=110, warmup_steps=10)
    assert s.lr_at(9) == pytest.approx(0.2)           # the last warm-up step
    assert s.lr_at(10) == pytest.approx(0.2)          # t = 0
    assert s.lr_at(60) == pytest.approx(0.1)          # half way: cos(pi / 2) = 0
    assert s.lr_at(109) == pytest.approx(0.1 * (1 + math.cos(math.pi * 99 / 100)))
    rates = [s.lr_at(k) for k in range(10, 110)]
    assert all(a > b for a, b in zip(rates, rates[1:]))   # strictly falling
    assert rates[-1] > 0


def test_step_divides_by_ten_at_half_and_three_quarters():
    s = LRSchedule("step", 1.0, total_steps=100)
    assert s.lr_at(49) == 1.0 and s.lr_at(50) == pytest.approx(0.1)
    assert s.lr_at(74) == pytest.approx(0.1) and s.lr_at(75) == pytest.approx(0.01)
    assert s.lr_at(99) == pytest.approx(0.01)


def test_schedule_errors():
    with pytest.raises(ConfigError, match="--lr-schedule must be one of constant, cosine, step"):
        LRSchedule("linear", 0.1, 10)
    with pytest.raises(ConfigError, match="warm-up .11 steps. must lie within the run's 10"):
        LRSchedule("cosine", 0.1, 10, warmup_steps=11)


def _loss_layer(eps, logits, labels):
    layer = SoftmaxCrossEntropy(label_smoothing=eps)
    layer.setup([logits.shape, labels.shape], logits.dtype)
    y = np.zeros((), logits.dtype)
    aux = {"prob": np.empty(logits.shape, logits.dtype)}
    layer.forward([logits, labels], y, aux, StepContext(np))
    return layer, float(y), aux


def test_label_smoothing_is_cross_entropy_against_the_smoothed_target():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 5)) * 3
    labels = rng.integers(0, 5, 6)
    eps = 0.2
    q = np.full((6, 5), eps / 5)
    q[np.arange(6), labels] += 1 - eps
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    expected = -(q * log_p).sum(axis=1)
    _, loss, _ = _loss_layer(eps, logits, labels)
    assert loss == pytest.approx(expected.mean(), rel=1e-12)
    assert example_losses(logits, labels, eps) == pytest.approx(expected, rel=1e-12)
    _, plain, _ = _loss_layer(0.0, logits, labels)
    assert plain == pytest.approx(-log_p[np.arange(6), labels].mean(), rel=1e-12)
    assert plain != pytest.approx(loss)


def test_label_smoothing_backward_passes_a_float64_gradient_check():
    labels = np.array([0, 3, 2, 4])
    check_backward(SoftmaxCrossEntropy(label_smoothing=0.1), [(4, 5), (4,)],
                   inputs=[None, labels])
    check_backward(SoftmaxCrossEntropy(label_smoothing=0.5), [(4, 5), (4,)],
                   inputs=[None, labels], seed=1)


def test_without_smoothing_the_gradient_is_p_minus_onehot():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 4)).astype(np.float32)
    labels = np.array([1, 0, 3])
    layer, _, aux = _loss_layer(0.0, logits, labels)
    g = np.empty_like(logits)
    layer.backward([None, labels], None, np.float32(1.0), [g, None], aux, StepContext(np))
    onehot = np.eye(4, dtype=np.float32)[labels]
    assert np.array_equal(g, (aux["prob"] - onehot) * (np.float32(1.0) / 3))


def test_label_smoothing_out_of_range_is_refused():
    with pytest.raises(ConfigError, match=r"label smoothing must be in \[0, 1\), got 1.0"):
        SoftmaxCrossEntropy(label_smoothing=1.0)
