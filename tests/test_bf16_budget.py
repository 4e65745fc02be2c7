"""Mixed precision under a budget keeps the plan's promise: every float32 copy a bf16 step
makes is declared, planned and counted.

On the CPU no kernel takes bf16 maps, so every layer but the ones that only move values
(Concat, BatchJoin) widens its maps to float32 (layers/precision.py). Those copies are
declared (temporary_bytes, from the liveness plan's call_maps), carved out of the call's
scratch block, which the static layout plans and the planner's dry run walks, so the CPU
arena counts them as a GPU's does. A copy taken anywhere else would be invisible to the
budget; the spy below fails the test on any such copy.

Tolerance of the measured peak against the predicted one: 1%. The step model counts the
momentum buffers without their alignment and leaves out the input batch the CPU's step
uploads into the arena: about 10 KiB here (0.2-0.8% measured) against steps of 1.4-4.4 MB.
"""
import numpy as np
import pytest

from minidnn import SGD
from minidnn.builder import NetBuilder
from minidnn.decide import build_executor, decide
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels import mapformat
from minidnn.layers import precision as mixed
from minidnn.memory.plan import LivenessPlan
from minidnn.models import googlenet, resnet
from minidnn.planner.costs import LayerCost, Profile
from minidnn.planner.dyn import DynPolicy

BATCH, SIZE = 8, 32
TOLERANCE = 0.01


def bn_resnet():
    """A stem with BatchNorm, a basic block and a bottleneck block (residual adds)."""
    b = NetBuilder("bn_resnet", SIZE, 5)
    b.conv("conv1", 16, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu")
    resnet.basic_block(b, "layer1.0", 16, 1)
    resnet.bottleneck_block(b, "layer2.0", 8, 2)
    b.global_avgpool("avgpool")
    b.flatten("flatten")
    b.linear("fc", 5)
    return b.finish()


def lrn_inception():
    """GoogLeNet's stem ideas (LRN after a ReLU, max pooling) and two inception modules."""
    b = NetBuilder("lrn_inception", SIZE, 5)
    b.conv("conv1", 16, 3, padding=1)
    b.relu("conv1.relu")
    b.lrn("norm1", size=5, alpha=1e-4, beta=0.75, k=1.0)
    b.maxpool("pool1", 2)
    googlenet.inception(b, "inception_a", 8, 8, 12, 4, 6, 6)
    googlenet.inception(b, "inception_b", 12, 8, 12, 4, 4, 4)
    b.global_avgpool("avgpool")
    b.flatten("flatten")
    b.linear("fc", 5)
    return b.finish()


def small_vgg():
    """Two VGG stages; the first runs as a layer chunk of 2 pieces."""
    b = NetBuilder("small_vgg", SIZE, 5)
    b.conv("conv1_1", 16, 3, padding=1)
    b.relu("relu1_1")
    b.conv("conv1_2", 16, 3, padding=1)
    b.relu("relu1_2")
    b.maxpool("pool1", 2)
    b.conv("conv2_1", 32, 3, padding=1)
    b.relu("relu2_1")
    b.maxpool("pool2", 2)
    b.flatten("flatten")
    b.linear("fc", 5)
    return b.finish()


NETS = {"bn_resnet": (bn_resnet, None), "lrn_inception": (lrn_inception, None),
        "small_vgg": (small_vgg, (("conv1_1", "pool1", 2),))}


@pytest.fixture
def spy(monkeypatch):
    """Every float32 copy precision.py widens a bf16 map into, or rounds from."""
    seen = []
    for name in ("bf16_to_float", "float_to_bf16"):
        original = getattr(cpu_kernels, name)

        def watch(src, dst, original=original, name=name):
            seen.append(dst if name == "bf16_to_float" else src)
            original(src, dst)
        monkeypatch.setattr(cpu_kernels, name, watch)
    return seen


def cpu_like_profile(net, batch) -> Profile:
    """Costs for the planner without measuring this CPU (the memory it plans comes from the
    dry walk of the step, not from the costs): every call 1 ms, copies at 1 GB/s, the CPU's
    synchronous host."""
    net.infer_shapes(batch)
    layers = {n.name: LayerCost({"fastest": 1e-3}, {"fastest": 1e-3}, {"fastest": 0},
                                {"fastest": 0}, {"forward": 0.0, "backward": 0.0})
              for n in net.nodes}
    return Profile(source="test", device_name="cpu", math="fp32", network=net.name,
                   batch=batch, memory_bytes=2**30, d2h_bw=1e9, h2d_bw=1e9, duplex_bw=1.8e9,
                   layers=layers, synchronous=True, temporaries_in_arena=False)


def policy_for(net) -> DynPolicy:
    return DynPolicy(profile=cpu_like_profile(net, BATCH), input_batches=0)


def plan_and_train(make, chunks, budget, steps=2):
    """A bf16 dyn run of `make`'s network at `budget` on the CPU: (predicted Evaluation,
    measured memory stats, the executor's arena)."""
    net = make()
    net.init_params(0)
    policy = policy_for(net)
    rng = np.random.default_rng(0)
    with build_executor(net, BATCH, device="cpu", policy=policy, memory_budget=budget,
                        precision="bf16", relu_bits=True, chunks=chunks) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((BATCH, 3, SIZE, SIZE)).astype(np.float32)
            assert np.isfinite(float(ex.train_step(x, rng.integers(0, 5, BATCH), opt)))
        return policy.result.best, ex.memory_stats(), ex.allocator


@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.parametrize("tight", [False, True])
def test_a_planned_bf16_step_fits_and_counts_its_widened_copies(name, tight, spy):
    """At 2% above the peak planned without a limit (nothing moved), and halfway between
    that peak and the least budget (maps offloaded or recomputed): the run fits, and its
    peak is the predicted one."""
    make, chunks = NETS[name]
    net = make()
    policy = policy_for(net)
    decide(net, BATCH, policy=policy, memory_budget=1 << 30, precision="bf16", relu_bits=True, chunks=chunks,
           device="cpu")
    peak, least = policy.result.best.required_bytes, policy.result.minimum_budget
    budget = (peak + least) // 2 if tight else int(peak * 1.02)
    seen = spy
    predicted, stats, arena = plan_and_train(make, chunks, budget)
    assert seen, "the CPU widens bf16 maps (no kernel takes them)"
    outside = [a.shape for a in seen if not arena.owns(a.__array_interface__["data"][0])]
    assert not outside, f"float32 copies outside the budgeted arena: {outside[:5]}"
    assert stats["peak_device_bytes"] <= budget
    measured, want = stats["peak_device_bytes"], predicted.required_bytes
    assert abs(measured - want) <= TOLERANCE * want, (measured, want)


def test_widened_copies_are_part_of_the_planned_peak():
    """The same bf16 step planned with its copies counted needs more than its maps alone:
    a float32 copy of a map is twice the map's bytes."""
    net = bn_resnet()
    plan = LivenessPlan(net, BATCH, maps=mapformat.MapFormat("nchw", "bf16"))
    i = next(k for k, n in enumerate(plan.nodes) if n.name == "bn1")
    maps = plan.call_maps(i, "forward")
    assert [m[0] for m in maps] == [(BATCH, 16, SIZE, SIZE)] * 2
    per_map = BATCH * 16 * SIZE * SIZE * 4
    layer = net.node("bn1").layer
    assert mixed.temporary_bytes(layer, cpu_kernels.BF16_OPS, maps, "forward") == 2 * per_map
    backward = plan.call_maps(i, "backward")    # x, gy, gx
    assert mixed.temporary_bytes(layer, frozenset(), backward, "backward") == 3 * per_map
    # On the GPU BatchNorm takes bf16 maps itself: nothing to widen.
    assert mixed.temporary_bytes(layer, mapformat.BF16_OPS["gpu"], maps, "forward") == 0
    fp32 = LivenessPlan(net, BATCH)
    assert mixed.temporary_bytes(layer, frozenset(), fp32.call_maps(i, "forward"),
                                 "forward") == 0


def test_the_device_kinds_bf16_ops_are_the_kernel_modules():
    assert cpu_kernels.BF16_OPS == mapformat.BF16_OPS["cpu"]
    cuda = pytest.importorskip("minidnn.kernels.cuda", exc_type=ImportError)
    assert cuda.BF16_OPS == mapformat.BF16_OPS["gpu"]


def test_a_plan_for_the_gpu_widens_what_the_gpu_widens():
    """Planned on this CPU for an H200: BatchNorm and a residual add take bf16 maps there
    (no copies in their calls' blocks); the loss does not."""
    net = bn_resnet()
    policy = DynPolicy(gpu="h200", input_batches=0)
    build_executor(net, BATCH, device="cpu", policy=policy, memory_budget="1GiB",
                   precision="bf16", compute=False)
    model = policy.result.model
    index = {n.name: i for i, n in enumerate(model.nodes)}
    assert (index["bn1"], "forward") not in model.scratch
    assert (index["bn1"], "backward") not in model.scratch
    add = next(n.name for n in model.nodes if n.layer.kind == "add")
    assert (index[add], "forward") not in model.scratch
    loss = model.nodes[-1].name
    logits = model.plan.tensors[model.nodes[-1].inputs[0]]
    float32_logits = mixed.ALIGN * -(-4 * int(np.prod(logits.shape)) // mixed.ALIGN)
    assert model.scratch[(index[loss], "forward")] == float32_logits
    # The matrix product takes bf16 maps, but computes its output in float32 first (the
    # bias added there, one rounding): that buffer is its forward call's block, and its
    # backward (the bias gradient summed from the bf16 gradient as it is read) has none.
    fc = model.nodes[-1].inputs[0]
    assert model.nodes[index[fc]].layer.kind == "linear"
    assert model.scratch[(index[fc], "forward")] == float32_logits
    assert (index[fc], "backward") not in model.scratch


def test_a_call_given_too_small_a_block_refuses_to_widen():
    net = bn_resnet()
    net.init_params(0)
    layer = net.node("bn1").layer
    rng = np.random.default_rng(0)
    bf16 = mapformat.bfloat16()
    x = rng.standard_normal((BATCH, 16, SIZE, SIZE)).astype(bf16)
    y = np.zeros_like(x)
    aux = {k: np.zeros(s, d) for k, (s, d) in layer.aux_specs().items()}
    from minidnn.layers import StepContext
    ctx = StepContext(np, kernels=cpu_kernels)
    ctx.scratch = np.zeros(x.size * 4, np.uint8)      # room for one float32 copy of two
    with pytest.raises(RuntimeError, match="too small"):
        mixed.forward(layer, [x], y, aux, ctx)
    ctx.scratch = np.zeros(2 * x.size * 4, np.uint8)  # the declared size
    mixed.forward(layer, [x], y, aux, ctx)
    assert ctx.scratch.nbytes == 2 * x.size * 4 and np.any(y.astype(np.float32) != 0)
