"""Check a layer's backward against float64 central differences (Chainer's check_backward).

For a random output weighting gy, the layer's analytic gradients must match

    d/dt sum(gy * f(x + t d))  ~  (L(x + eps d) - L(x - eps d)) / (2 eps)

along random directions d, for every input and every parameter. Backward is called the way
the memory manager calls it: with None for the inputs and output it did not declare as
retained, so a layer that reads what it did not ask to keep fails here. In-place layers are
also run with the output written over the input (and the input gradient over the output
gradient) and must give the same numbers.
"""
from __future__ import annotations

import numpy as np

from .kernels import cpu as cpu_kernels
from .layers.base import Layer, StepContext


def _forward(layer, xs, ctx):
    y = np.empty(layer.out_shape, dtype=np.float64)
    aux = {k: np.zeros(s, dtype=d) for k, (s, d) in layer.aux_specs().items()}
    layer.forward([x.copy() for x in xs], y, aux, ctx)
    return y, aux


def check_backward(layer: Layer, in_shapes, inputs=None, seed: int = 0, eps: float = 1e-6,
                   rtol: float = 1e-5, atol: float = 1e-8, directions: int = 3,
                   train: bool = True) -> None:
    """Raise AssertionError when the layer's backward disagrees with finite differences.

    in_shapes: input shapes including the batch; inputs: optional arrays (integer inputs such as
    labels must be given); float inputs default to standard normal values.
    """
    rng = np.random.default_rng(seed)
    layer.setup(in_shapes, np.float64)
    for p in layer.params.values():
        # Perturb the initial value so zero-initialized biases are exercised too.
        p.data = p.initial_value(rng, np.float64) + 0.1 * rng.standard_normal(p.shape)
        p.grad = np.full(p.shape, np.nan)
    for b in layer.buffers.values():  # running statistics that forward may update
        b.data = b.initial_value(np.float64)
    if inputs is None:
        inputs = [None] * len(in_shapes)
    xs = [rng.standard_normal(s) if x is None else np.asarray(x) for x, s in zip(inputs, in_shapes)]
    ctx = StepContext(np, kernels=cpu_kernels, train=train, step=0, seed=seed)
    differentiable = [np.issubdtype(x.dtype, np.floating) for x in xs]

    y, aux = _forward(layer, xs, ctx)
    gy = rng.standard_normal(y.shape)
    gxs = [np.full(x.shape, np.nan) if d else None for x, d in zip(xs, differentiable)]
    layer.backward([x.copy() if k in layer.retain_inputs else None for k, x in enumerate(xs)],
                   y.copy() if layer.retain_output else None, gy.copy(), gxs, aux, ctx)
    pgrads = {k: p.grad.copy() for k, p in layer.params.items()}

    def loss(xs_):
        return float(np.sum(gy * _forward(layer, xs_, ctx)[0]))

    name = f"{type(layer).__name__} {layer.name!r}"
    for k, x in enumerate(xs):
        if not differentiable[k]:
            continue
        assert np.all(np.isfinite(gxs[k])), f"{name}: input {k} gradient not fully written"
        for _ in range(directions):
            d = rng.standard_normal(x.shape)
            plus = [v + eps * d if j == k else v for j, v in enumerate(xs)]
            minus = [v - eps * d if j == k else v for j, v in enumerate(xs)]
            numeric = (loss(plus) - loss(minus)) / (2 * eps)
            analytic = float(np.sum(gxs[k] * d))
            assert abs(numeric - analytic) <= atol + rtol * max(abs(numeric), abs(analytic)), \
                f"{name}: input {k} gradient {analytic!r} vs finite difference {numeric!r}"
    for pname, p in layer.params.items():
        assert np.all(np.isfinite(pgrads[pname])), f"{name}: grad of {pname} not fully written"
        base = p.data.copy()
        for _ in range(directions):
            d = rng.standard_normal(p.shape)
            p.data = base + eps * d
            lp = loss(xs)
            p.data = base - eps * d
            lm = loss(xs)
            p.data = base
            numeric = (lp - lm) / (2 * eps)
            analytic = float(np.sum(pgrads[pname] * d))
            assert abs(numeric - analytic) <= atol + rtol * max(abs(numeric), abs(analytic)), \
                f"{name}: {pname} gradient {analytic!r} vs finite difference {numeric!r}"

    if layer.inplace and layer.out_shape and xs[0].size == y.size:
        _check_inplace(layer, xs, y, gy, gxs, aux, ctx, name)


def _check_inplace(layer, xs, y, gy, gxs, aux, ctx, name):
    """Run forward writing over input 0 and backward writing over gy; compare bit for bit."""
    x0 = xs[0].copy()
    y_alias = x0.reshape(layer.out_shape)
    aux2 = {k: np.zeros(s, dtype=d) for k, (s, d) in layer.aux_specs().items()}
    layer.forward([x0] + [x.copy() for x in xs[1:]], y_alias, aux2, ctx)
    assert np.array_equal(y_alias, y), f"{name}: in-place forward differs from out-of-place"
    g = gy.copy()
    g_alias = g.reshape(xs[0].shape)
    layer.backward([x.copy() if k in layer.retain_inputs else None for k, x in enumerate(xs)],
                   y.copy() if layer.retain_output else None, g, [g_alias] + gxs[1:], aux2, ctx)
    assert np.array_equal(g_alias, gxs[0]), f"{name}: in-place backward differs from out-of-place"
