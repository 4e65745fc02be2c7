"""A batch norm that reads its output gradient from a residual add's other input (minidnn/
fusion.py, bn_grad): the add writes its masked gradient once, to the gradient of the input
the batch norm does not write, and the batch norm, whose backward comes next, reads it from
there and writes its own gradient over the buffer it would have read. The pairs ResNets
have; the kernel's bits; a fused step's bits against the unfused one's, with identity and
projection blocks, under budgets, micro-batches, recomputation and deterministic slices."""
import numpy as np
import pytest

from minidnn import models
from minidnn.builder import NetBuilder
from minidnn.decide import decide
from minidnn.fusion import add_relu_pairs, bn_grad_pairs
from minidnn.kernels import cpu
from minidnn.memory.plan import LivenessPlan
from test_fused_add_sum import RESIDUAL_SETTINGS, recomputing_everything
from test_fusion import _run, counting

pytest.importorskip("ml_dtypes")


def projected_blocks():
    """A stem, a projection block (its add reads bn2 and the projection's batch norm, which
    runs right before the add) and an identity block (bn2 runs right before its add)."""
    b = NetBuilder("projected_blocks", image_size=8, num_classes=10)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu1")
    for k, src, width in ((1, "relu1", 16), (2, "out1", 16)):
        b.conv(f"b{k}.conv1", width, 3, padding=1, bias=False, src=src)
        b.batchnorm(f"b{k}.bn1")
        b.relu(f"b{k}.relu1")
        b.conv(f"b{k}.conv2", width, 3, padding=1, bias=False)
        b.batchnorm(f"b{k}.bn2")
        other = src
        if k == 1:
            b.conv("b1.proj", width, 1, bias=False, src=src)
            b.batchnorm("b1.proj_bn")
            other = "b1.proj_bn"
        b.add(f"b{k}.sum", [f"b{k}.bn2", other])
        b.relu(f"out{k}")
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 10)
    return b.finish()


PAIRS = {"b1.proj_bn": "b1.sum", "b2.bn2": "b2.sum"}


@pytest.mark.parametrize("model, blocks", [("resnet18", 8), ("resnet50", 16)])
def test_every_block_has_its_last_batch_norm_read_the_other_gradient(model, blocks):
    net = models.build(model, num_classes=10, image_size=32)
    plan = LivenessPlan(net, 2)
    pairs = bn_grad_pairs(plan)
    assert sorted(pairs.values()) == sorted(add_relu_pairs(plan).values())
    assert len(pairs) == blocks
    index = {n.name: i for i, n in enumerate(plan.nodes)}
    for bn, add in pairs.items():
        assert index[bn] == index[add] - 1 and plan.nodes[index[bn]].layer.kind == "batchnorm"
    assert decide(net, 2, device="cpu").bn_grad == pairs
    assert decide(net, 2, device="cpu", fuse=False).bn_grad == {}


def test_the_batch_norm_must_run_right_before_the_add():
    """A projection block's bn2 is not the call before its add (the projection's batch norm
    is): the projection's batch norm reads on, bn2 reads its own copy."""
    assert bn_grad_pairs(LivenessPlan(projected_blocks(), 2)) == PAIRS


def test_the_kernel_gives_the_bits_of_the_two_output_one():
    import ml_dtypes
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16):
        y, gy, g2 = (rng.standard_normal((2, 3, 5, 7)).astype(dtype) for _ in range(3))
        y.ravel()[::5] = 0
        g2.ravel()[:6] = -gy.ravel()[:6]
        gx0, gx1 = np.empty_like(gy), np.empty_like(gy)
        cpu.relu_mask_sum_copy(y, gy, g2, gx0, gx1)
        one = gy.copy()
        cpu.relu_mask_sum(y, one, g2, one)                 # in place into gy
        assert one.tobytes() == gx0.tobytes()


@pytest.mark.parametrize("kwargs", RESIDUAL_SETTINGS, ids=str)
def test_a_fused_step_gives_the_bits_of_the_unfused_one(kwargs, monkeypatch):
    calls = counting(monkeypatch, cpu, ("relu_mask_sum", "relu_mask_sum_copy", "relu_mask_copy"))
    fused = _run(projected_blocks(), kwargs, 2, True, 8, "bn_grad")
    assert fused[2] == PAIRS
    passes = 2 * kwargs.get("micro_batches", 1)
    # The first block's add sums the second block's conv1 gradient (add_sum); the second's
    # has no sum. Each writes one gradient, but bf16 maps are widened for the add on the CPU,
    # which then writes both (and the memory manager sums first).
    if kwargs.get("precision") == "bf16":
        assert calls == {"relu_mask_sum": 0, "relu_mask_sum_copy": 0,
                         "relu_mask_copy": 2 * passes}
    else:
        assert calls == {"relu_mask_sum": passes, "relu_mask_sum_copy": 0, "relu_mask_copy": 0}
    plain = _run(projected_blocks(), kwargs, 2, False, 8, "bn_grad")
    assert plain[2] == {}
    assert fused[0] == plain[0] and fused[3] == plain[3]
    for k in fused[1]:
        assert fused[1][k].tobytes() == plain[1][k].tobytes(), k


def test_recomputing_every_candidate_keeps_the_bits():
    """Recomputations run between an add's backward and its batch norm's: they write maps,
    not the gradient handed on."""
    assert recomputing_everything(projected_blocks(), True, "bn_grad") == \
        recomputing_everything(projected_blocks(), False, "bn_grad")
