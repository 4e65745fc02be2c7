"""The memory manager on a CUDA GPU: lossless offload under every policy, and the stream/event
ordering that keeps a buffer from being reused while a copy still reads or writes it.

The ordering tests are built so that a missing wait corrupts data: the copies move 256 MiB
(several milliseconds over PCIe) while the compute stream runs work that would overwrite the
same block, so any missing event dependency shows up as wrong bytes, not as a lucky pass.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from minidnn import Network, SGD  # noqa: E402
from minidnn.backend import Device, gpu_available  # noqa: E402
from minidnn.layers import (Add, Conv2d, Dropout, Flatten, Linear, MaxPool2d,  # noqa: E402
                            ReLU)
from minidnn.memory.layout import DynamicBlocks  # noqa: E402
from minidnn.memory.manager import FeatureMap, Mover  # noqa: E402
from minidnn.memory.plan import StoragePlan  # noqa: E402
from minidnn.decide import build_executor

if not gpu_available():  # collected on a machine with CuPy but no GPU: conftest skips them
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

BIG = 256 * 1024**2        # bytes per copy in the ordering tests: ~5 ms at 55 GB/s
ORIGINAL, OTHER = 0x5A, 0xC3


@pytest.fixture
def gpu():
    dev = Device("gpu")
    yield dev
    dev.synchronize()


@pytest.fixture(autouse=True)
def deterministic_kernels():
    """The equivalence test needs deterministic convolutions; put the default mode back after."""
    yield
    from minidnn import kernels
    mod = kernels.for_device(Device("gpu"))
    if hasattr(mod, "configure"):
        mod.configure()


def _arena(dev, budget):
    from minidnn.memory.arena import Arena
    return Arena(dev, budget)


def _host(dev):
    from minidnn.memory.host import HostSlab
    return HostSlab(dev)


def _map(nbytes):
    return FeatureMap(StoragePlan(0, nbytes, "feature", tensors=["x"]))


def _slow_fill(dev, buf, value, times=200):
    """Keep the compute stream busy on `buf` for a while, ending with `value`."""
    with dev.compute:
        for k in range(times):
            buf.fill((value + 1 + k) % 256)
        buf.fill(value)


# ---- ordering ------------------------------------------------------------------------------------
def test_offload_waits_for_the_producer_and_its_block_waits_for_the_copy(gpu):
    arena = _arena(gpu, BIG + 4096)      # room for exactly one such buffer
    host = _host(gpu)
    mover = Mover(gpu, DynamicBlocks(arena), host)
    fm = _map(BIG)
    fm.device = arena.alloc(BIG)
    first = fm.device.data.ptr
    _slow_fill(gpu, fm.device, ORIGINAL)          # the producer, still running on compute
    mover.offload(fm, time=0)                     # must copy what the producer wrote last
    mover.release_device(fm)                      # free(after=offload done): no host wait
    reused = arena.alloc(BIG)                     # the only block: handed out after the copy
    assert reused.data.ptr == first
    with gpu.compute:
        reused.fill(OTHER)                        # compute overwrites the block at once
    gpu.synchronize()
    host_copy = fm.host[:BIG]
    assert (host_copy == ORIGINAL).all(), \
        f"{int((host_copy != ORIGINAL).sum())} bytes of the offloaded copy were overwritten"
    arena.free(reused)
    mover.release_host(fm)
    arena.close()


def test_prefetch_waits_for_compute_on_its_block_and_compute_waits_for_the_prefetch(gpu):
    arena = _arena(gpu, BIG + 4096)
    host = _host(gpu)
    mover = Mover(gpu, DynamicBlocks(arena), host)
    fm = _map(BIG)
    fm.host = host.alloc(BIG)
    fm.host[:BIG] = ORIGINAL                      # the offloaded bytes
    busy = arena.alloc(BIG)
    _slow_fill(gpu, busy, OTHER)                  # compute still writing this block...
    arena.free(busy)                              # ...released in compute order
    mover.fetch(fm, time=0, where="test")         # gets that very block
    assert fm.device.data.ptr == busy.data.ptr
    mover.wait(fm)                                # compute waits for the copy
    with gpu.compute:
        seen = cupy.empty(BIG, dtype=cupy.uint8)
        seen[...] = fm.device                     # what the next layer would read
    gpu.synchronize()
    assert int((fm.device != ORIGINAL).sum()) == 0, "compute overwrote the prefetched block"
    assert int((seen != ORIGINAL).sum()) == 0, "compute read the block before the prefetch"
    mover.release_device(fm)
    mover.release_host(fm)
    arena.close()


def test_host_block_is_not_reused_while_a_copy_reads_it(gpu):
    arena = _arena(gpu, 2 * BIG + 4096)
    host = _host(gpu)
    mover = Mover(gpu, DynamicBlocks(arena), host)
    a = _map(BIG)
    a.host = host.alloc(BIG)
    a.host[:BIG] = ORIGINAL
    blocker = arena.alloc(BIG)
    _slow_fill(gpu, blocker, OTHER)               # the prefetch waits behind this
    mover.fetch(a, time=0, where="test")          # reads a.host later, on the prefetch stream
    mover.release_host(a)                         # free(after=prefetch done)
    b = _map(BIG)
    b.host = host.alloc(BIG)                      # must not be a.host's block while it is read
    b.host[:BIG] = OTHER
    mover.wait(a)
    gpu.synchronize()
    assert int((a.device != ORIGINAL).sum()) == 0
    mover.release_device(a)
    arena.free(blocker)
    arena.close()


# ---- whole steps ------------------------------------------------------------------------------------
def dag_net() -> Network:
    net = Network((3, 16, 16), num_classes=10, name="dag")
    net.add(Conv2d(8, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(8, 3, padding=1), inputs="relu1", name="conva")
    net.add(ReLU(), name="relua")
    net.add(Conv2d(8, 1), inputs="relu1", name="convb")
    net.add(Add(), inputs=["relua", "convb"], name="join")
    net.add(MaxPool2d(2), name="pool")
    net.add(Dropout(0.25), name="drop")
    net.add(Flatten(), name="flat")
    net.add(Linear(10), name="fc")
    net.add_loss()
    return net


def _train(policy, steps=3, budget="1GiB", lookahead=1, layout=None, state=False,
           precision="fp32"):
    """(checksum, memory stats, arena in_use after each step) of a few deterministic steps
    (and the state dict after them, with state=True)."""
    rng = np.random.default_rng(0)
    with build_executor(dag_net(), 8, device="gpu", seed=0, policy=policy, memory_budget=budget,
                        prefetch_lookahead=lookahead, deterministic=True, layout=layout,
                        precision=precision, math="fp32" if state else None) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        levels = []
        for _ in range(steps):
            x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 10, 8), opt)
            levels.append(ex.settled_in_use())
        stats = ex.memory_stats()
        del opt  # its momentum buffers live in the arena
        ex.close()
        if state:
            return ex.net.param_checksum(), stats, levels, ex.net.state_dict()
        return ex.net.param_checksum(), stats, levels


def test_bf16_maps_on_the_gpu_follow_float32():
    """precision='bf16' on the GPU (layers/precision.py widens and rounds with CuPy's bf16
    arrays) in both layouts: float32 state, parameters near the float32 run's, and half the
    bytes offloaded where the maps are float."""
    want = _train("all", layout="nchw", state=True)
    for layout in ("nchw", "nhwc"):
        got = _train("all", layout=layout, state=True, precision="bf16")
        assert got[1]["offloaded_bytes"] < 0.6 * want[1]["offloaded_bytes"]
        for name, w in want[3].items():
            assert got[3][name].dtype == np.float32
            np.testing.assert_allclose(got[3][name], w, rtol=3e-2, atol=3e-2, err_msg=name)


def test_channels_last_trains_as_nchw():
    """Three steps with channels-last maps give the parameters of NCHW
    maps within strict-FP32 rounding (the dropout mask is the same: it is drawn in logical
    order), under every policy; the branch's gradient sum works in either layout, and the
    state dict keeps PyTorch's OIHW weights."""
    nchw = _train("none", layout="nchw", state=True)[3]
    for policy in ("none", "all"):
        got = _train(policy, layout="nhwc", state=True)[3]
        for name, want in nchw.items():
            assert got[name].shape == want.shape and got[name].flags.c_contiguous
            np.testing.assert_allclose(got[name], want, rtol=2e-4, atol=2e-5,
                                       err_msg=f"{policy} {name}")


def test_policies_give_bit_identical_parameters_on_gpu():
    results = {key: _train(*key) for key in [("none", 3), ("all", 3), ("conv", 3)]}
    sums = {k: r[0] for k, r in results.items()}
    assert len(set(sums.values())) == 1, sums
    assert results[("all", 3)][1]["offloaded_bytes"] > results[("conv", 3)][1]["offloaded_bytes"] > 0
    lazy = _train("all", 3, lookahead=0)
    assert lazy[0] == sums[("none", 3)]
    assert lazy[1]["on_demand_fetches"] > 0


def test_budget_and_no_leak_on_gpu():
    budget = 256 * 1024**2
    _, stats, levels = _train("all", steps=5, budget=budget)
    assert stats["peak_device_bytes"] <= budget
    assert stats["offloaded_bytes"] == stats["prefetched_bytes"] > 0
    # Step 1 allocates momentum (and the kernels may cache per-layer state); then steady.
    assert len(set(levels[1:])) == 1, levels


def test_planned_workspaces_give_the_same_bits_and_need_no_allocation():
    """Every convolution call's workspace as a planned block of the static layout (as dyn
    plans them): the same parameters to the bit as workspaces allocated by the kernels, no
    convolution falls back to a leaner plan, and the blocks are in the layout."""
    from minidnn.memory.policy import MemoryDecision, get_policy
    from minidnn.planner.dyn import FixedDecision
    from minidnn.kernels import cuda
    convs = [n.name for n in dag_net().nodes if n.layer.kind == "conv"]
    probe = build_executor(dag_net(), 8, device="cpu", compute=False)
    offload = get_policy("all").decide(probe.plan).offload
    workspace = {(c, p): 16 * 1024**2 for c in convs for p in ("forward", "backward")}
    planned = FixedDecision(MemoryDecision(offload=offload, workspace=workspace))
    cuda.reset_workspace_fallbacks()
    with_blocks = _train(planned)
    assert not cuda.workspace_fallbacks
    assert with_blocks[1]["layout_bytes"] >= 16 * 1024**2
    assert with_blocks[0] == _train("all")[0]


def test_recomputed_maps_give_the_same_bits_on_gpu():
    """Maps dropped after forward and rebuilt in backward by running their layers again
    (deterministic plans), alone and next to offloaded ones: the parameters to the bit of a
    run that keeps everything, and nothing fetched on demand."""
    from minidnn.memory.policy import (MemoryDecision, get_policy, recompute_candidates,
                                       recompute_inputs)
    from minidnn.planner.dyn import FixedDecision
    plan = build_executor(dag_net(), 8, device="cpu", compute=False).plan
    recompute = frozenset([s.id for s in recompute_candidates(plan)])
    assert {plan.storages[s].tensors[0] for s in recompute} >= {"conv1"}
    reads = {t for s in recompute for t in recompute_inputs(plan, s)}
    offload = frozenset(get_policy("all").decide(plan).offload - recompute)
    assert offload & reads       # some maps a recomputation reads come back from the host
    kept = _train("none")
    rebuilt = _train(FixedDecision(MemoryDecision(recompute=recompute)))
    mixed = _train(FixedDecision(MemoryDecision(offload=offload, recompute=recompute)))
    assert rebuilt[0] == kept[0] and mixed[0] == kept[0]
    assert rebuilt[1]["avg_feature_map_bytes"] < kept[1]["avg_feature_map_bytes"]
    assert rebuilt[1]["offloaded_bytes"] == 0 and mixed[1]["offloaded_bytes"] > 0
    assert mixed[1]["on_demand_fetches"] == 0


def test_input_gradients_over_inputs_give_the_same_bits_on_gpu(monkeypatch):
    """VGG-11 with ReLU bit masks: every convolution after a pool or a ReLU writes its input
    gradient over its input (weight gradient first, on one stream). The parameters match a
    run where each gradient has a buffer of its own, to the bit, under none and all."""
    from minidnn import models
    from minidnn.layers.conv import Conv2d as ConvClass

    def run(policy, allow):
        monkeypatch.setattr(ConvClass, "grad_over_input", allow)
        rng = np.random.default_rng(1)
        with build_executor(models.build("vgg11", num_classes=10, image_size=32), 8, device="gpu",
                      seed=0, policy=policy, memory_budget="1GiB", relu_bits=True,
                      deterministic=True) as ex:
            opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
            for _ in range(2):
                x = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)
                ex.train_step(x, rng.integers(0, 10, 8), opt)
            shared = len(ex.plan.grad_over_input)
            del opt
            ex.close()
            return ex.net.param_checksum(), shared

    own = {policy: run(policy, True) for policy in ("none", "all")}
    apart = run("none", False)
    assert apart[1] == 0 and own["none"][1] > 0
    assert own["none"][0] == own["all"][0] == apart[0]
