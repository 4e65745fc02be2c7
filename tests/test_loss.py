"""Softmax cross-entropy: the loss keeps growing where the true class's probability underflows."""
import numpy as np
import pytest

from minidnn.layers.base import StepContext
from minidnn.layers.loss import SoftmaxCrossEntropy


def loss_of(logits, labels):
    layer = SoftmaxCrossEntropy()
    layer.setup([logits.shape, labels.shape], logits.dtype)
    y = np.zeros((), logits.dtype)
    aux = {"prob": np.empty(logits.shape, logits.dtype)}
    layer.forward([logits, labels], y, aux, StepContext(np))
    return float(y), aux["prob"]


@pytest.mark.parametrize("dtype,gaps", [(np.float32, (50.0, 100.0, 200.0, 1000.0)),
                                        (np.float64, (100.0, 800.0, 5000.0))])
def test_the_loss_is_the_gap_when_the_true_class_is_far_below(dtype, gaps):
    """With logits (0, -gap) and label 1 the loss is log(1 + exp(-gap)) + gap: about the gap,
    past the 87 (float32) and 708 (float64) where the probability underflows."""
    for gap in gaps:
        logits = np.array([[0.0, -gap]], dtype)
        loss, prob = loss_of(logits, np.array([1]))
        assert loss == pytest.approx(gap, rel=1e-6), gap
        assert np.isfinite(prob).all() and prob[0, 0] == pytest.approx(1.0)


def test_the_loss_matches_the_textbook_formula_where_nothing_underflows():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 5))
    labels = rng.integers(0, 5, 8)
    loss, prob = loss_of(logits, labels)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(8), labels]).mean(), rel=1e-12)
    np.testing.assert_allclose(prob, p, rtol=1e-12)
