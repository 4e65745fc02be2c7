"""Whole runs on a CUDA GPU: a measured profile (--policy dyn), train and resume, tracing,
SyntheticImages.device_batches; and an offload followed at once by its prefetch on 256 MiB
buffers, which reads the offloaded bytes only if the prefetch waits for that offload.

Skipped without a GPU; MINIDNN_REQUIRE_GPU=1 (the GPU scripts) makes every skip a failure.
"""
import json

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from minidnn.backend import Device, gpu_available  # noqa: E402
from minidnn.train import TrainConfig, train  # noqa: E402

if not gpu_available():  # collected on a machine with CuPy but no GPU: conftest skips them
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BIG = 256 * 1024**2
ORIGINAL, STALE = 0x5A, 0xC3


def quiet(*args):
    pass


def small(**overrides):
    cfg = dict(model="tiny_cnn", batch=16, image_size=16, steps=6, device="gpu", lr=0.05,
               eval_every=0, eval_batches=2, progress=False, log_every=2, deterministic=True)
    cfg.update(overrides)
    return TrainConfig(**cfg)


@pytest.fixture
def gpu():
    dev = Device("gpu")
    yield dev
    dev.synchronize()


def test_an_offload_followed_at_once_by_its_prefetch_reads_the_offloaded_bytes(gpu):
    """Two maps are offloaded, then the second is fetched back at once. Its offload starts
    only after the first one's (~5 ms of copying on the offload stream), so a prefetch that
    did not wait for it would copy the host block before it is written: the stale bytes."""
    from minidnn.memory.arena import Arena
    from minidnn.memory.host import HostSlab
    from minidnn.memory.layout import DynamicBlocks
    from minidnn.memory.manager import FeatureMap, Mover
    from minidnn.memory.plan import StoragePlan
    arena = Arena(gpu, 4 * BIG + 4096)
    host = HostSlab(gpu, chunk_bytes=2 * BIG)
    stale = host.alloc(2 * BIG)                   # the host blocks the offloads will get
    stale[:] = STALE
    host.free(stale)
    mover = Mover(gpu, DynamicBlocks(arena), host)
    first, second = (FeatureMap(StoragePlan(k, BIG, "feature", tensors=[f"m{k}"]))
                     for k in range(2))
    for fm in (first, second):
        fm.device = arena.alloc(BIG)
        with gpu.compute:
            fm.device.fill(ORIGINAL)
        mover.offload(fm, time=0)
        mover.release_device(fm)
    mover.fetch(second, time=1, where="test")     # at once: no host wait anywhere
    mover.wait(second)
    with gpu.compute:
        seen = second.device.copy()               # what backward would read
    gpu.synchronize()
    assert int((seen != ORIGINAL).sum()) == 0, \
        f"{int((seen != ORIGINAL).sum())} bytes came from the host block before the offload"
    for fm in (first, second):
        mover.release_device(fm)
        mover.release_host(fm)
    arena.close()
    host.close()


def test_a_measured_profile_plans_dyn_and_the_run_stays_in_its_budget(tmp_path, monkeypatch):
    """--policy dyn measures the network on the device (cached under MINIDNN_CACHE) and plans
    for the budget; a second run reads the profile from the cache. The budget is the
    unconstrained run's peak: the plan must count every block, the dropout's draws among
    them (layers/draws.py)."""
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    free = train(small(steps=3), log=quiet)
    budget = int(free["peak_device_bytes"])
    report = train(small(steps=4, policy="dyn", memory_budget=budget), log=quiet)
    profiles = list((tmp_path / "cache" / "profiles").iterdir())
    assert profiles, "no profile was measured"
    assert report["memory"]["policy"] == "dyn" and report["peak_device_bytes"] <= budget
    assert all(np.isfinite(report["loss"]))
    again = train(small(steps=4, policy="dyn", memory_budget=budget), log=quiet)
    assert list((tmp_path / "cache" / "profiles").iterdir()) == profiles
    assert again["param_checksum"] == report["param_checksum"]


def test_train_and_resume_on_the_gpu_are_bit_identical(tmp_path):
    ckpt = str(tmp_path / "run.npz")
    straight = train(small(steps=8), log=quiet)
    train(small(steps=4, checkpoint=ckpt), log=quiet)
    resumed = train(small(steps=8, checkpoint=ckpt, resume=True), log=quiet)
    assert resumed["start_step"] == 4
    assert resumed["param_checksum"] == straight["param_checksum"]
    assert resumed["loss"] == straight["loss"][4:]


def test_a_gpu_trace_holds_compute_and_both_copy_streams(tmp_path):
    pytest.importorskip("matplotlib")
    trace, plot = tmp_path / "t.json", tmp_path / "m.png"
    train(small(steps=3, policy="all", trace=str(trace), plot=str(plot)), log=quiet)
    events = json.loads(trace.read_text())["traceEvents"]
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"compute stream"} <= threads and len(threads) >= 3, threads   # and the copies'
    timed = [e for e in events if e.get("ph") == "X"]
    assert any(e["name"] == "pool1" for e in timed)    # its offload, under `all`
    assert all(e["dur"] >= 0 for e in timed) and any(e["dur"] > 0 for e in timed)
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_a_held_trace_times_the_device_not_the_host(tmp_path):
    """tiny_cnn at batch 16: the host issues each call more slowly than the GPU runs it, so a
    plain trace's spans measure the host; held, each span is the device's time, far less."""
    spans = {}
    for held in (False, True):
        trace = tmp_path / f"t{held}.json"
        train(small(steps=3, graphs=False, trace=str(trace), trace_held=held), log=quiet)
        data = json.loads(trace.read_text())
        calls = [e for e in data["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1]
        assert calls and all(e["dur"] > 0 for e in calls)
        spans[held] = sum(e["dur"] for e in calls)
        if held:
            assert data["otherData"]["held"] is True
            assert all("held" in e["args"] for e in calls)
            assert sum(not e["args"]["held"] for e in calls) == data["otherData"]["unheld_calls"]
            assert data["otherData"]["unheld_calls"] < len(calls) / 4
        else:
            assert "otherData" not in data
    assert spans[True] < 0.8 * spans[False], spans


def test_synthetic_device_batches_are_on_the_gpu_and_repeat_by_seed(gpu):
    from minidnn.data import SyntheticImages
    data = SyntheticImages(num_classes=7, image_shape=(3, 8, 8), seed=3)
    a = data.device_batches(4, gpu, count=3)
    b = data.device_batches(4, gpu, count=3)
    assert len(a) == 3
    for (x, y), (x2, y2) in zip(a, b):
        assert isinstance(x, cupy.ndarray) and x.shape == (4, 3, 8, 8) and x.dtype == np.float32
        assert isinstance(y, cupy.ndarray) and y.shape == (4,) and y.dtype == np.int64
        assert int(y.min()) >= 0 and int(y.max()) < 7
        assert bool((x == x2).all()) and bool((y == y2).all())
    assert not bool((a[0][0] == a[1][0]).all())          # the batches differ
    report = train(small(model="mlp", data="synthetic", num_classes=7, image_size=8, steps=3),
                   log=quiet)
    assert report["steps"] == 3 and all(np.isfinite(report["loss"]))


# ---- a fault test: the copy streams made slow ---------------------------------------------------
SPIN = r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
'''


def test_copy_streams_delayed_on_purpose_give_the_same_bits(monkeypatch):
    """Every offload and prefetch is preceded, on its own stream, by a kernel that spins for
    about 2 ms: each copy then finishes long after compute would have read or reused its
    buffers, if any wait were missing. The parameters must still equal a run without offload,
    to the bit (deterministic algorithms), under every policy and lookahead."""
    from minidnn import SGD
    from minidnn.decide import build_executor
    from minidnn.memory import manager as manager_module
    from test_memory_gpu import dag_net
    spin = cupy.RawKernel(SPIN, "spin")
    rate_khz = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["clockRate"]
    cycles = np.int64(rate_khz * 2)                       # ~2 ms
    copy = manager_module.Mover._copy
    delayed = []

    def slow_copy(self, dst, src, nbytes, kind, stream):
        if isinstance(stream, cupy.cuda.Stream):   # not the static layout's dry recording
            spin((1,), (1,), (cycles,), stream=stream)
        delayed.append(kind)
        copy(self, dst, src, nbytes, kind, stream)

    def checksum(policy, lookahead, budget=None):
        rng = np.random.default_rng(0)
        with build_executor(dag_net(), 8, device="gpu", seed=0, policy=policy,
                            memory_budget=budget, prefetch_lookahead=lookahead,
                            deterministic=True) as ex:
            opt = SGD(ex.parameters(), lr=0.05, momentum=0.9)
            for _ in range(4):
                x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
                ex.train_step(x, rng.integers(0, 10, 8), opt)
            del opt
            ex.close()
            return ex.net.param_checksum()

    reference = checksum("none", 1)
    monkeypatch.setattr(manager_module.Mover, "_copy", slow_copy)
    for policy, lookahead, budget in (("all", 0, None), ("all", 1, None), ("all", 3, None),
                                      ("conv", 1, None), ("all", 1, "1GiB")):
        assert checksum(policy, lookahead, budget) == reference, (policy, lookahead, budget)
    assert len(set(delayed)) == 2                        # both directions were delayed


# ---- deterministic mode under every budget ----------------------------------------------------
@pytest.mark.slow
def test_vgg16_gives_the_same_bits_under_every_policy_and_budget_in_deterministic_mode():
    """VGG-16 at batch 64 and 224 pixels, 3 steps: no budget, ReLU masks, all and conv in
    5 GiB, all with ReLU masks in 4 GiB, each policy at the least budget it names if it
    refuses that one before step one. In deterministic mode each convolution runs the same
    plan whatever the budget (the best-ranked memory-optimal one), so the parameters agree to
    the bit; before, the budgeted runs took other plans and differed from step 1."""
    from minidnn import SGD, models
    from minidnn.decide import build_executor
    from minidnn.planner.planning import PolicyBudgetError

    def checksum(policy, budget=None, relu_bits=False):
        net = models.build("vgg16", num_classes=1000, image_size=224)
        rng = np.random.default_rng(0)
        settings = dict(device="gpu", seed=0, policy=policy, relu_bits=relu_bits,
                        deterministic=True)
        try:
            ex = build_executor(net, 64, memory_budget=budget, **settings)
        except PolicyBudgetError as refused:     # before step one: its least budget trains
            ex = build_executor(net, 64, memory_budget=refused.minimum, **settings)
        with ex:
            opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
            losses = []
            for _ in range(3):
                x = rng.standard_normal((64, 3, 224, 224)).astype(np.float32)
                losses.append(float(ex.train_step(x, rng.integers(0, 1000, 64), opt)))
            del opt
            ex.close()
            return net.param_checksum(), losses

    reference = checksum("none")
    for policy, budget, relu_bits in (("none", None, True), ("all", "5GiB", False),
                                      ("conv", "5GiB", False), ("all", "4GiB", True)):
        assert checksum(policy, budget, relu_bits) == reference, (policy, budget, relu_bits)


@pytest.mark.slow
def test_the_benchmarked_combination_at_full_size_gives_the_same_bits():
    """VGG-16 at batch 256 and 224 pixels with what the benchmarks run together: conv1_1's
    output recomputed, every other map backward reads offloaded, ReLU bit masks, every
    convolution's workspace a planned block of the static layout, prefetch lookahead 2; three
    deterministic steps give the parameters of a run that keeps everything, with nothing
    fetched on demand and no convolution falling back to a leaner plan."""
    from minidnn import SGD, models
    from minidnn.decide import build_executor
    from minidnn.kernels import cuda
    from minidnn.memory.policy import (MemoryDecision, get_policy, recompute_candidates,
                                       relu_bits_for)
    from minidnn.planner.dyn import FixedDecision

    def run(policy, budget=None, relu_bits=False):
        net = models.build("vgg16", num_classes=1000, image_size=224)
        rng = np.random.default_rng(0)
        with build_executor(net, 256, device="gpu", seed=0, policy=policy,
                            memory_budget=budget, relu_bits=relu_bits,
                            deterministic=True) as ex:
            opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
            for _ in range(3):
                x = rng.standard_normal((256, 3, 224, 224)).astype(np.float32)
                ex.train_step(x, rng.integers(0, 1000, 256), opt)
            stats = ex.memory_stats()
            del opt
            ex.close()
            return net.param_checksum(), stats

    net = models.build("vgg16", num_classes=1000, image_size=224)
    bits = relu_bits_for(net)
    probe = build_executor(net, 256, device="cpu", compute=False, relu_bits=True)
    plan = probe.plan
    probe.close()
    conv1_1 = plan.storage_of("conv1_1").id
    candidates = frozenset([s.id for s in recompute_candidates(plan)])
    assert conv1_1 in candidates
    recompute = frozenset({conv1_1})
    offload = frozenset(get_policy("all").decide(plan).offload - recompute)
    convs = [n.name for n in net.nodes if n.layer.kind == "conv"]
    workspace = {(c, p): 256 * 1024**2 for c in convs for p in ("forward", "backward")}
    decision = MemoryDecision(offload=offload, recompute=recompute, workspace=workspace,
                              prefetch_lookahead=2, relu_bits=bits)
    kept = run("none", relu_bits=True)
    cuda.reset_workspace_fallbacks()
    combined = run(FixedDecision(decision), budget="12GiB", relu_bits=True)
    assert not cuda.workspace_fallbacks
    assert combined[0] == kept[0]
    stats = combined[1]
    assert stats["offloaded_bytes"] > 0 and stats["on_demand_fetches"] == 0
    assert stats["peak_device_bytes"] <= 12 * 1024**3


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_host_batches_enter_channels_last_maps_without_a_device_temporary(precision,
                                                                          monkeypatch):
    """A host batch, in NCHW memory order or already in the maps' channels-last order
    (BatchLoader(layout='nhwc')), is copied into the channels-last input buffer with
    the values a device batch gives (the same logits, bit for bit), and takes no block of the
    batch's size from the arena: reordered on the device it took one no plan counted, and a
    run under a budget as tight as its own peak failed in evaluation."""
    from minidnn import models
    from minidnn.decide import build_executor
    from minidnn.memory import arena
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    ex = build_executor(net, 8, device="gpu", layout="nhwc", precision=precision,
                        deterministic=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    _, want = ex.evaluate(cupy.asarray(x), cupy.asarray(y))
    taken = []
    malloc = arena.Arena._cupy_malloc
    monkeypatch.setattr(arena.Arena, "_cupy_malloc",
                        lambda self, n: (taken.append(n), malloc(self, n))[1])
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for host in (x, last):
        _, got = ex.evaluate(host, y)
        assert got.tobytes() == want.tobytes()
    assert not {x.size * 4, x.size * 2} & set(taken), taken   # the batch in float32 or bf16
    ex.close()
