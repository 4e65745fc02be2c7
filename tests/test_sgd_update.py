"""SGD's update as a kernel op (kernels/cpu.py: sgd_update), on the CPU: bit for bit the
formulas SGD.step applied one array operation at a time before the update was a kernel op,
over several steps, float32 and float64, with and without weight decay and momentum, with and
without an allocator, channels-last parameters, the first step's momentum and checkpoints.
The CUDA kernel is checked against this reference in test_sgd_update_gpu.py."""
import types

import numpy as np
import pytest

from minidnn.kernels import cpu
from minidnn.kernels.mapformat import is_channels_last
from minidnn.layers.base import Parameter
from minidnn.memory.allocator import CountingAllocator, SimpleAllocator
from minidnn.optim import SGD

SHAPES = ((3,), (7, 5), (4, 3, 2, 5), (1,), (1000,))
SETTINGS = [(0.0, 0.0), (0.9, 0.0), (0.0, 5e-4), (0.9, 5e-4)]   # (momentum, weight_decay)
LR = 0.05
STEPS = 4


def old_step(params, velocity, lr, momentum, weight_decay):
    """SGD.step as it was written before sgd_update: params [(name, w, g)] of NumPy arrays,
    velocity {name: v} (filled on the first step)."""
    for name, w, g in params:
        scalar = w.dtype.type
        tmp = None
        if weight_decay:
            tmp = w * scalar(weight_decay)
            tmp += g
            g = tmp
        if momentum:
            v = velocity.get(name)
            if v is None:
                v = velocity[name] = np.array(g, copy=True)
            else:
                v *= scalar(momentum)
                v += g
            g = v
        if tmp is None:
            tmp = g * scalar(lr)
        else:
            np.multiply(g, scalar(lr), out=tmp)
        w -= tmp


def bits(a) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def make_params(dtype, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    out = []
    for i, shape in enumerate(shapes):
        p = Parameter(shape, "zeros")
        p.data = rng.standard_normal(shape).astype(dtype)
        p.grad = np.zeros(shape, dtype)
        out.append((f"p{i}", p))
    return out


def draw_grads(params, rng):
    for _, p in params:
        p.grad[...] = (rng.standard_normal(p.grad.shape) * 0.1).astype(p.grad.dtype)


def run_both(dtype, momentum, weight_decay, allocator=None, steps=STEPS):
    """(new params, new optimizer, old params, old velocity) after `steps` steps on equal grads."""
    new = make_params(dtype)
    old = [(name, p.data.copy()) for name, p in new]
    opt = SGD(new, lr=LR, momentum=momentum, weight_decay=weight_decay, allocator=allocator)
    velocity = {}
    rng = np.random.default_rng(1)
    for _ in range(steps):
        draw_grads(new, rng)
        opt.step()
        old_step([(name, w, p.grad) for (name, w), (_, p) in zip(old, new)], velocity, LR,
                 momentum, weight_decay)
    return new, opt, old, velocity


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum, weight_decay", SETTINGS)
@pytest.mark.parametrize("with_allocator", [False, True])
def test_step_matches_old_formulas_bit_for_bit(dtype, momentum, weight_decay, with_allocator):
    allocator = SimpleAllocator(np) if with_allocator else None
    new, opt, old, velocity = run_both(dtype, momentum, weight_decay, allocator)
    for (name, p), (_, w) in zip(new, old):
        assert p.data.dtype == np.dtype(dtype)
        assert bits(p.data) == bits(w), name
    assert set(opt.velocity) == set(velocity)
    for name, v in velocity.items():
        assert opt.velocity[name].dtype == np.dtype(dtype)
        assert bits(opt.velocity[name]) == bits(v), name
    if momentum:
        assert len(velocity) == len(new)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum, weight_decay", SETTINGS)
def test_reference_op_matches_old_formulas(dtype, momentum, weight_decay):
    """cpu.sgd_update on its own, from a given momentum buffer (no first step)."""
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    gs = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    vs = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    old_w = [w.copy() for w in ws]
    velocity = {i: v.copy() for i, v in enumerate(vs)}
    for _ in range(3):
        cpu.sgd_update(list(zip(ws, gs, vs if momentum else [None] * len(ws))), LR, momentum,
                       weight_decay, cache={})
        old_step([(i, w, g) for i, (w, g) in enumerate(zip(old_w, gs))], velocity, LR,
                 momentum, weight_decay)
    for i, w in enumerate(ws):
        assert bits(w) == bits(old_w[i])
        if momentum:
            assert bits(vs[i]) == bits(velocity[i])


def test_reference_op_needs_buffers_with_momentum():
    w = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="momentum"):
        cpu.sgd_update([(w, w.copy(), None)], LR, 0.9, 0.0)


@pytest.mark.parametrize("with_allocator", [False, True])
def test_channels_last_parameter_keeps_its_layout_in_momentum(with_allocator):
    """A conv weight laid out channels-last (as the executor places it with NHWC maps) gets a
    momentum buffer in the same layout, and the same bits as the C-ordered parameter."""
    shape, dtype = (6, 3, 2, 5), np.float32
    rng = np.random.default_rng(3)
    values = rng.standard_normal(shape).astype(dtype)
    last = Parameter(shape, "zeros")
    last.data = np.ascontiguousarray(values.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    last.grad = np.empty((6, 2, 5, 3), dtype).transpose(0, 3, 1, 2)
    plain = Parameter(shape, "zeros")
    plain.data, plain.grad = values.copy(), np.empty(shape, dtype)
    allocator = SimpleAllocator(np) if with_allocator else None
    opts = [SGD([("w", p)], lr=LR, momentum=0.9, weight_decay=5e-4, allocator=allocator)
            for p in (last, plain)]
    for _ in range(STEPS):
        g = rng.standard_normal(shape).astype(dtype)
        for p, opt in zip((last, plain), opts):
            p.grad[...] = g
            opt.step()
    assert is_channels_last(opts[0].velocity["w"]) and not opts[0].velocity["w"].flags.c_contiguous
    assert bits(last.data) == bits(plain.data)
    assert bits(opts[0].velocity["w"]) == bits(opts[1].velocity["w"])


def test_kernels_given_make_one_call_per_step_with_a_kept_cache():
    calls = []

    def sgd_update(params, lr, momentum, weight_decay, cache=None):
        calls.append((len(params), cache))
        cpu.sgd_update(params, lr, momentum, weight_decay, cache)

    kernels = types.SimpleNamespace(sgd_update=sgd_update)
    params = make_params(np.float32)
    opt = SGD(params, lr=LR, momentum=0.9, kernels=kernels)
    rng = np.random.default_rng(4)
    for _ in range(3):
        draw_grads(params, rng)
        opt.step()
    # The first step has no momentum buffers yet: v = g is built in each buffer, then one
    # call without momentum and without the cache (its launch table is of other arrays).
    assert [n for n, _ in calls] == [len(params)] * 3
    assert calls[0][1] is None
    assert calls[1][1] is calls[2][1] is opt._launches


def test_default_kernels_are_the_reference_for_numpy_parameters():
    from minidnn.optim import _default_kernels
    assert _default_kernels(np.zeros(2)) is cpu


def test_checkpoint_resumes_the_same_bits():
    """state_dict / load_state_dict around the fused steps: a resumed optimizer continues
    exactly as the one that kept running."""
    dtype, momentum, weight_decay = np.float32, 0.9, 5e-4
    a = make_params(dtype)
    b = make_params(dtype)
    opt_a = SGD(a, lr=LR, momentum=momentum, weight_decay=weight_decay)
    rng = np.random.default_rng(5)
    for _ in range(2):
        draw_grads(a, rng)
        opt_a.step()
    state = opt_a.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state["velocity"].values())
    for (_, pa), (_, pb) in zip(a, b):
        pb.data[...] = pa.data
    opt_b = SGD(b, lr=1.0, momentum=0.5, allocator=SimpleAllocator(np))
    opt_b.load_state_dict(state)
    for _ in range(3):
        draw_grads(a, rng)
        for (_, pa), (_, pb) in zip(a, b):
            pb.grad[...] = pa.grad
        opt_a.step()
        opt_b.step()
    for (_, pa), (_, pb) in zip(a, b):
        assert bits(pa.data) == bits(pb.data)
    for name in opt_a.velocity:
        assert bits(opt_a.velocity[name]) == bits(opt_b.velocity[name])


def test_counting_allocator_takes_receipts_for_momentum():
    """The dry run's allocator hands out receipts, not arrays: the optimizer still counts its
    buffers and makes them up front."""
    params = make_params(np.float32, shapes=((4, 3, 2, 5), (7,)))
    counting = CountingAllocator()
    SGD(params, lr=LR, momentum=0.9, allocator=counting)
    assert counting.in_use >= sum(p.data.nbytes for _, p in params)
