"""Softmax cross-entropy, averaged over the batch. Inputs: logits (N, K) and labels (N,) int.

With label smoothing eps (PyTorch's `CrossEntropyLoss(label_smoothing=eps)`), the target of
example i is q_i = (1 - eps) * onehot(label_i) + eps / K instead of the one-hot vector:

    loss_i = -sum_k q_ik log p_ik = (1 - eps) * (-log p_i,label) + eps * mean_k(-log p_ik)

Forward keeps the softmax probabilities p as an aux buffer; backward is (p - q) / N.
Labels are checked on the host before they reach the device (see executor), so a label out of
range is a clear error rather than a silent wrong gradient.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .base import Layer
from .slices import pairwise_sum, row_slices


def check_label_smoothing(eps: float) -> float:
    """eps as a float; ConfigError unless 0 <= eps < 1."""
    eps = float(eps)
    if not 0.0 <= eps < 1.0:
        raise ConfigError(f"label smoothing must be in [0, 1), got {eps}")
    return eps


class SoftmaxCrossEntropy(Layer):
    kind = "loss"
    num_inputs = 2

    def __init__(self, label_smoothing: float = 0.0, name=None):
        super().__init__(name)
        self.label_smoothing = check_label_smoothing(label_smoothing)

    def infer(self, in_shapes):
        logits, labels = in_shapes
        if len(logits) != 2:
            raise self.shape_error("logits (N, classes)", logits)
        if tuple(labels) != (logits[0],):
            raise self.shape_error(f"labels of shape ({logits[0]},)", labels)
        self.num_classes = logits[1]
        return ()

    def aux_specs(self):
        return {"prob": (self.in_shapes[0], self.dtype)}

    def forward(self, xs, y, aux, ctx):
        """y: 0-d array, the mean loss.

        -log p_ik = log(sum_j exp(z_ij - m_i)) - (z_ik - m_i) with m_i = max_j z_ij: the
        log-sum-exp of the shifted logits, which grows with the gap between the largest logit
        and class k's one however large it is. (The log of the softmax probability would
        saturate once that probability underflows: at 87.3 in float32.)
        """
        xp = ctx.xp
        logits, labels = xs
        p = aux["prob"]
        n = logits.shape[0]
        eps = self.label_smoothing
        xp.subtract(logits, logits.max(axis=1, keepdims=True), out=p)
        picked = p[xp.arange(n), labels]          # a copy: z_label - m, before exp below
        if eps:
            picked = (1 - eps) * picked + eps * p.mean(axis=1)   # sum_k q_k (z_k - m)
        xp.exp(p, out=p)
        total = p.sum(axis=1)                     # >= 1: the largest term is exp(0)
        p /= total[:, None]
        losses = xp.log(total) - picked
        if ctx.batch_slice is None or n <= ctx.batch_slice:
            y[...] = losses.mean()
        else:   # deterministic: the slices' means as a tree, the bits of every split
            parts = row_slices(n, ctx.batch_slice)
            y[...] = pairwise_sum([losses[part].mean() for part in parts]) / len(parts)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        xp = ctx.xp
        labels = xs[1]
        g = gxs[0]
        n = g.shape[0]
        eps = self.label_smoothing
        g[...] = aux["prob"]
        if eps:
            g -= eps / g.shape[1]
        g[xp.arange(n), labels] -= 1 - eps
        g *= gy / n

    # Labels are read by backward; logits are not (the softmax is in aux).
    retain_inputs = (1,)

    def flops(self):
        return 5 * self.in_shapes[0][0] * self.in_shapes[0][1]


def example_losses(logits: np.ndarray, labels: np.ndarray, label_smoothing: float = 0.0):
    """The loss of each example as forward computes it, in float64 on the host.

    logits: (N, K); labels: (N,) int. Returns float64 (N,). For scoring a part of a batch (the
    last, partial batch of an evaluation), whose mean the layer cannot give.
    """
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    picked = z[np.arange(len(z)), np.asarray(labels)]
    if label_smoothing:
        picked = (1 - label_smoothing) * picked + label_smoothing * z.mean(axis=1)
    return np.log(np.exp(z).sum(axis=1)) - picked
