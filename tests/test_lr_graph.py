"""A learning-rate schedule and CUDA-graph replay: the rate is read from device memory, so the
optimizer's graph key does not change with it, the rate is written before every replay, and a
scheduled run's bits stay those of the update that took the rate as an argument. The GPU test
trains with a schedule from a data loader's batches and checks that the steps are replayed
from one graph, to the bits of the same run without graphs."""
import types

import numpy as np
import pytest

from minidnn.kernels.cpu import SGD_RATE
from minidnn.layers.base import Parameter
from minidnn.lr_schedule import LRSchedule
from minidnn.optim import SGD
from minidnn.step_graph import WARMUP, DeviceInputs
from minidnn.train import TrainConfig, train
from test_fashion_mnist import make_data
from test_step_graph import DeviceArray, Executor, fake_cupy  # noqa: F401 (a fixture)

SCHEDULE = LRSchedule("cosine", 0.05, total_steps=10, warmup_steps=3)


class DeviceRate:
    """What SGD sees of the GPU kernels' kernels/cuda_sgd.DeviceRate: write(lr) and alone."""

    def __init__(self, alone=True):
        self.alone, self.written = alone, []

    def write(self, lr):
        self.written.append(lr)


def device_sgd(lr=0.1):
    """An SGD over two parameters at fixed device addresses (stand-ins), with momentum."""
    params = [(f"p{i}", types.SimpleNamespace(data=DeviceArray(100 * i),
                                              grad=DeviceArray(100 * i + 50)))
              for i in range(2)]
    opt = SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4)
    opt.velocity = {name: DeviceArray(1000 + 100 * i) for i, (name, _) in enumerate(params)}
    return opt


def test_the_graph_key_leaves_out_a_rate_that_the_update_reads_from_device_memory():
    opt = device_sgd()
    rate = opt._launches[SGD_RATE] = DeviceRate(alone=True)
    key = opt.graph_key()
    opt.set_lr(0.01)
    assert opt.graph_key() == key
    opt.write_lr()
    assert rate.written == [0.01]
    opt.momentum = 0.5                       # the other settings are still the graph's
    assert opt.graph_key() != key


def test_the_rate_stays_in_the_key_where_the_update_takes_the_hosts_number():
    opt = device_sgd()                       # no device rate: the CPU's reference update
    key = opt.graph_key()
    opt.set_lr(0.01)
    assert opt.graph_key() != key
    opt.write_lr()                           # nothing to write, and no error
    opt._launches[SGD_RATE] = DeviceRate(alone=False)   # a parameter took the reference
    key = opt.graph_key()
    opt.set_lr(0.02)
    assert opt.graph_key() != key


class KeyedOptimizer:
    """An optimizer whose graph does not depend on its rate, recording the rates written."""

    def __init__(self):
        self.lr, self.written = None, []

    def graph_key(self):
        return ()

    def write_lr(self):
        self.written.append(self.lr)


def test_a_schedule_replays_one_graph_with_each_steps_rate_written_before_it(fake_cupy):
    ex = Executor()
    graphs = ex.graphs()
    x, y, opt = DeviceArray(1000), DeviceArray(2000, (4,), np.int64), KeyedOptimizer()
    for step in range(SCHEDULE.total_steps):
        opt.lr = SCHEDULE.lr_at(step)
        graphs.step(x, y, opt, True, step)
    assert graphs.count == 1 and graphs.captured_at == [WARMUP]
    assert graphs.replays == SCHEDULE.total_steps - WARMUP
    assert opt.written == [SCHEDULE.lr_at(s) for s in range(WARMUP, SCHEDULE.total_steps)]


def old_step(w, g, v, lr, momentum, weight_decay):
    """SGD's update written out with each operation rounded in float32 (PyTorch's formula),
    the rate taken as a host number: v is None on the first step (v = g)."""
    f = np.float32
    d = w * f(weight_decay) + g
    v = d.copy() if v is None else v * f(momentum) + d
    return w - v * f(lr), v


def test_a_scheduled_update_is_the_old_formula_bit_for_bit():
    rng = np.random.default_rng(1)
    p = Parameter((5, 7), "zeros")
    p.data = rng.standard_normal((5, 7)).astype(np.float32)
    opt = SGD([("w", p)], lr=SCHEDULE.base_lr, momentum=0.9, weight_decay=5e-4)
    w, v = p.data.copy(), None
    for step in range(SCHEDULE.total_steps):
        p.grad = rng.standard_normal((5, 7)).astype(np.float32)
        opt.set_lr(SCHEDULE.lr_at(step))
        w, v = old_step(w, p.grad, v, SCHEDULE.lr_at(step), 0.9, 5e-4)
        opt.step()
        assert p.data.tobytes() == w.tobytes(), step


def scheduled_run(**overrides):
    cfg = dict(model="tiny_cnn", batch=16, image_size=16, steps=10, device="cpu", lr=0.05,
               momentum=0.9, weight_decay=1e-4, eval_every=0, eval_batches=2, progress=False,
               log_every=4, lr_schedule="cosine", lr_warmup_steps=3)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def reference_step(self):
    """SGD.step as the update that took the rate as a host number made it (old_step), each
    parameter alone."""
    for name, p in self.params:
        w, v = old_step(p.data, p.grad, self.velocity.get(name), self.lr, self.momentum,
                        self.weight_decay)
        p.data[...] = w
        self.velocity[name] = v


def test_a_scheduled_run_keeps_its_bits(monkeypatch):
    """A whole scheduled run ends with the parameters the update that took the rate as an
    argument left (both runs here: the bits of NumPy's kernels differ from one NumPy build,
    and machine, to another, so a checksum written down once is no reference)."""
    report = train(scheduled_run(), log=lambda *_: None)
    constant = train(scheduled_run(lr_schedule="constant", lr_warmup_steps=0),
                     log=lambda *_: None)
    monkeypatch.setattr(SGD, "step", reference_step)
    reference = train(scheduled_run(), log=lambda *_: None)
    assert report["param_checksum"] == reference["param_checksum"]
    assert constant["param_checksum"] != reference["param_checksum"]   # the schedule counts


class HostCopies(np.ndarray):
    """A NumPy array with CuPy's `set(host, stream)`, recording the streams copied on."""

    def set(self, host, stream=None):
        self[...] = host
        self.streams = getattr(self, "streams", []) + [stream]


def test_device_inputs_copy_each_batch_to_the_same_arrays_on_the_compute_stream():
    class Stream:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    device = types.SimpleNamespace(
        compute=Stream(),
        xp=types.SimpleNamespace(
            empty=lambda shape, dtype: np.empty(shape, dtype).view(HostCopies)))
    inputs = DeviceInputs(device, (4, 1, 3, 3))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(3):
        x = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
        y = rng.integers(0, 10, 4)
        dx, dy = inputs(x, y)
        seen.add((id(dx), id(dy)))
        assert np.array_equal(dx, x) and np.array_equal(dy, y)
    assert seen == {(id(inputs.x), id(inputs.labels))}
    assert inputs.x.streams == [device.compute] * 3
    odd = np.zeros((3, 1, 3, 3), np.float32)        # another shape: passed on as it is
    assert inputs(odd, y[:3])[0] is odd


@pytest.mark.gpu
@pytest.mark.usefixtures("default_gpu_kernels_after")
def test_a_scheduled_gpu_run_replays_its_graph_to_the_bits_of_plain_steps(tmp_path):
    folder = make_data(tmp_path / "fmnist")
    cfg = dict(model="tiny_cnn", data=f"fashion-mnist:{folder}", batch=8, epochs=3,
               device="gpu", lr=0.05, lr_schedule="cosine", lr_warmup_steps=3,
               label_smoothing=0.1, augment="crop,flip", deterministic=True, progress=False,
               log_every=2)
    replayed = train(TrainConfig(**cfg), log=lambda *_: None)
    plain = train(TrainConfig(graphs=False, **cfg), log=lambda *_: None)
    stats = replayed["step_graphs"]
    assert stats["given_up"] is None and stats["captured"] == 1     # one graph for the run
    assert stats["replayed_steps"] == replayed["steps"] - WARMUP     # every step after warm-up
    assert plain["step_graphs"] is None
    assert replayed["loss"] == plain["loss"]
    assert replayed["param_checksum"] == plain["param_checksum"]
    assert [r["accuracy"] for r in replayed["epochs"]] == [r["accuracy"] for r in plain["epochs"]]


@pytest.mark.gpu
def test_a_captured_fused_update_replays_with_the_rate_written_before_each_launch():
    cp = pytest.importorskip("cupy")
    from minidnn.kernels import cpu, cuda_sgd
    rng = np.random.default_rng(2)
    host = [tuple(rng.standard_normal(n).astype(dtype) for _ in range(3))
            for n, dtype in ((5, np.float32), (1000, np.float32), (77, np.float64))]
    stream = cp.cuda.Stream(non_blocking=True)
    cache = {}
    with stream:
        device = [tuple(cp.asarray(a) for a in triple) for triple in host]
        cuda_sgd.sgd_update(device, 0.1, 0.9, 5e-4, cache=cache)   # plain: table and rate made
        cpu.sgd_update(host, 0.1, 0.9, 5e-4)
        stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        cuda_sgd.sgd_update(device, 0.1, 0.9, 5e-4, cache=cache)
        graph = stream.end_capture()
        assert cache[SGD_RATE].alone
        for lr in SCHEDULE.lr_at(0), SCHEDULE.lr_at(5), 0.2:
            cache[SGD_RATE].write(lr)
            graph.launch(stream)
            cpu.sgd_update(host, lr, 0.9, 5e-4)
    stream.synchronize()
    for on_device, on_host in zip(device, host):
        for a, b in zip(on_device, on_host):
            assert cp.asnumpy(a).tobytes() == b.tobytes()
