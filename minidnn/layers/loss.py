"""Softmax cross-entropy, averaged over the batch. Inputs: logits (N, K) and labels (N,) int.

Forward keeps the softmax probabilities as an aux buffer; backward is (p - onehot) / N.
Labels are checked on the host before they reach the device (see executor), so a label out of
range is a clear error rather than a silent wrong gradient.
"""
from __future__ import annotations

from .base import Layer


class SoftmaxCrossEntropy(Layer):
    kind = "loss"
    num_inputs = 2

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

        loss_i = log(sum_k exp(z_ik - m_i)) - (z_i,label - m_i) with m_i = max_k z_ik: the
        log-sum-exp of the shifted logits, which grows with the gap between the largest logit
        and the true class's one however large it is. (The log of the softmax probability
        would saturate once that probability underflows: at 87.3 in float32.)
        """
        xp = ctx.xp
        logits, labels = xs
        p = aux["prob"]
        n = logits.shape[0]
        xp.subtract(logits, logits.max(axis=1, keepdims=True), out=p)
        picked = p[xp.arange(n), labels]          # a copy: z_label - m, before exp below
        xp.exp(p, out=p)
        total = p.sum(axis=1)                     # >= 1: the largest term is exp(0)
        p /= total[:, None]
        y[...] = (xp.log(total) - picked).mean()

    def backward(self, xs, y, gy, gxs, aux, ctx):
        xp = ctx.xp
        labels = xs[1]
        g = gxs[0]
        n = g.shape[0]
        g[...] = aux["prob"]
        g[xp.arange(n), labels] -= 1
        g *= gy / n

    # Labels are read by backward; logits are not (the softmax is in aux).
    retain_inputs = (1,)

    def flops(self):
        return 5 * self.in_shapes[0][0] * self.in_shapes[0][1]
