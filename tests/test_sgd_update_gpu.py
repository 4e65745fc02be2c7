"""The fused SGD update (kernels/cuda_sgd.py) against the NumPy reference (kernels/cpu.py:
sgd_update), bit for bit: sizes that are and are not whole 16-byte vectors, aligned and
misaligned arrays, chunked parameters, mixed lists of float32 and float64 parameters,
channels-last ones, every weight-decay / momentum combination, several steps with the launch
table kept; and SGD on CuPy parameters against SGD on NumPy ones. Skipped without a CUDA GPU."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cs = pytest.importorskip("minidnn.kernels.cuda_sgd")

from minidnn.kernels import cpu  # noqa: E402
from minidnn.layers.base import Parameter  # noqa: E402
from minidnn.optim import SGD  # noqa: E402

SIZES = (1, 3, 4, 5, 1000, cs._CHUNK - 1, cs._CHUNK + 1, 1_000_003)
SETTINGS = [(0.0, 0.0), (0.9, 0.0), (0.0, 5e-4), (0.9, 5e-4)]   # (momentum, weight_decay)
LR = 0.05


def bits(a) -> bytes:
    a = cp.asnumpy(a) if isinstance(a, cp.ndarray) else a
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def on_device(host, offset=0, layout="nchw"):
    """A device copy of `host` starting `offset` values into a fresh allocation (offset 1
    misaligns it for the 16-byte vectors); 'nhwc': a 4-D array laid out channels-last."""
    buf = cp.empty(host.size + offset, host.dtype)
    flat = buf[offset:offset + host.size]
    if layout == "nhwc":
        n, c, h, w = host.shape
        out = flat.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    else:
        out = flat.reshape(host.shape)
    out[...] = cp.asarray(host)
    return out


def triples(specs, seed=0):
    """Host and device (w, g, v) for specs [(shape, dtype, offset, layout)]."""
    rng = np.random.default_rng(seed)
    host, device = [], []
    for shape, dtype, offset, layout in specs:
        arrays = [rng.standard_normal(shape).astype(dtype) for _ in range(3)]
        host.append(arrays)
        # Offset 2: g one value further in than w and v, so that their alignments differ.
        offsets = (offset, offset + 1, offset) if offset == 2 else (offset,) * 3
        device.append([on_device(a, o, layout) for a, o in zip(arrays, offsets)])
    return host, device


def run_steps(specs, momentum, weight_decay, steps=3, seed=0):
    host, device = triples(specs, seed)
    rng = np.random.default_rng(seed + 1)
    cache = {}
    for step in range(steps):
        cs.sgd_update([(w, g, v if momentum else None) for w, g, v in device], LR, momentum,
                      weight_decay, cache=cache)
        cpu.sgd_update([(w, g, v if momentum else None) for w, g, v in host], LR, momentum,
                       weight_decay)
        for (w, g, v), (dw, dg, dv) in zip(host, device):
            assert bits(dw) == bits(w), (w.shape, w.dtype, step)
            if momentum:
                assert bits(dv) == bits(v), (v.shape, v.dtype, step)
        for (_, g, _), (_, dg, _) in zip(host, device):     # new gradients
            g[...] = rng.standard_normal(g.shape)
            dg[...] = cp.asarray(g)
    return cache


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum, weight_decay", SETTINGS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_one_parameter_matches_reference(dtype, momentum, weight_decay, n, offset):
    run_steps([((n,), dtype, offset, "nchw")], momentum, weight_decay)


@pytest.mark.parametrize("momentum, weight_decay", SETTINGS)
def test_mixed_list_one_launch_per_dtype(momentum, weight_decay):
    specs = [((n,), (np.float32, np.float64)[i % 2], i % 3, "nchw")
             for i, n in enumerate(SIZES + SIZES[::-1])]
    specs += [((2, 6, 3, 5), np.float32, 0, "nhwc"), ((4, 3, 3, 3), np.float64, 0, "nhwc"),
              ((7, 5), np.float32, 0, "nchw"), ((0,), np.float32, 0, "nchw")]
    cache = run_steps(specs, momentum, weight_decay, steps=4)
    plan = cache[cs._CACHE_KEY]
    assert sorted(ctype for ctype, *_ in plan.launches) == ["double", "float"]
    assert plan.rest == []


def test_table_is_kept_until_an_array_moves():
    host, device = triples([((10,), np.float32, 0, "nchw"), ((33,), np.float32, 0, "nchw")])
    params = [tuple(t) for t in device]
    cache = {}
    cs.sgd_update(params, LR, 0.9, 0.0, cache=cache)
    plan = cache[cs._CACHE_KEY]
    cs.sgd_update(params, LR, 0.9, 0.0, cache=cache)
    assert cache[cs._CACHE_KEY] is plan
    moved = cp.array(params[1][0])
    cs.sgd_update([params[0], (moved,) + params[1][1:]], LR, 0.9, 0.0, cache=cache)
    assert cache[cs._CACHE_KEY] is not plan


def test_mixed_layouts_go_through_the_reference():
    """w channels-last, v NCHW: not one memory order, so the reference's operations (the
    same bits) update it."""
    rng = np.random.default_rng(3)
    shape = (2, 6, 3, 5)
    w, g, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    dw, dg, dv = on_device(w, 0, "nhwc"), on_device(g, 0, "nhwc"), on_device(v)
    cache = {}
    cs.sgd_update([(dw, dg, dv)], LR, 0.9, 5e-4, cache=cache)
    cpu.sgd_update([(w, g, v)], LR, 0.9, 5e-4)
    assert cache[cs._CACHE_KEY].rest == [0]
    assert bits(dw) == bits(w) and bits(dv) == bits(v)


def test_momentum_needs_buffers():
    w = cp.ones(3, cp.float32)
    with pytest.raises(ValueError, match="momentum"):
        cs.sgd_update([(w, w.copy(), None)], LR, 0.9, 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum, weight_decay", SETTINGS)
def test_sgd_on_gpu_matches_sgd_on_cpu(dtype, momentum, weight_decay):
    """SGD's default kernels for CuPy parameters are the fused ones, first step included."""
    rng = np.random.default_rng(4)
    shapes = ((64, 3, 3, 3), (64,), (1000, 17), (5,))
    host, dev = [], []
    for i, shape in enumerate(shapes):
        values = rng.standard_normal(shape).astype(dtype)
        for out, xp in ((host, np), (dev, cp)):
            p = Parameter(shape, "zeros")
            p.data, p.grad = xp.asarray(values.copy()), xp.zeros(shape, dtype)
            out.append((f"p{i}", p))
    opt_h = SGD(host, lr=LR, momentum=momentum, weight_decay=weight_decay)
    opt_d = SGD(dev, lr=LR, momentum=momentum, weight_decay=weight_decay)
    for _ in range(4):
        for (_, ph), (_, pd) in zip(host, dev):
            ph.grad[...] = rng.standard_normal(ph.grad.shape)
            pd.grad[...] = cp.asarray(ph.grad)
        opt_h.step()
        opt_d.step()
    assert cs._CACHE_KEY in opt_d._launches          # the fused kernel ran
    for (_, ph), (_, pd) in zip(host, dev):
        assert bits(pd.data) == bits(ph.data)
    for name, v in opt_h.velocity.items():
        assert bits(opt_d.velocity[name]) == bits(v)


def test_the_first_step_takes_no_temporary_from_the_arena(monkeypatch):
    """The first step with momentum and weight decay builds each momentum buffer in place and
    updates through the fused kernel: no block of a parameter's size is taken from the
    executor's arena (the step model counts no optimizer temporary: planner/step_model.py).
    A temporary of `w * wd` or `lr * v` would be fc's 4 MiB weight; the kernel's launch table
    and learning rate take a few hundred bytes."""
    from minidnn.decide import build_executor
    from minidnn.layers import Conv2d, Flatten, Linear, ReLU
    from minidnn.memory import arena as arena_module
    from minidnn.network import Network

    net = Network.sequential((3, 32, 32), [
        Conv2d(8, 3, padding=1, name="conv"), ReLU(name="relu"), Flatten(name="flat"),
        Linear(128, name="fc")], num_classes=128)
    taken = []
    take = arena_module.Arena._take

    def noting(self, nbytes, where):
        taken.append(nbytes)
        return take(self, nbytes, where)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    with build_executor(net, 4, device="gpu", seed=0, graphs=False) as ex:
        opt = SGD(ex.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4,
                  allocator=ex.allocator, kernels=ex.kernels)
        ex.forward(x, rng.integers(0, 128, 4))
        ex.backward()
        monkeypatch.setattr(arena_module.Arena, "_take", noting)
        opt.step()
        monkeypatch.undo()
        assert set(opt.velocity) == {name for name, _ in ex.parameters()}
        del opt
    assert taken and max(taken) < 64 * 1024, taken
