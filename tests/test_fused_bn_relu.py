"""The ReLU after a batch norm folded into it (minidnn/fusion.py) on bf16 maps: the batch norm
stores narrow(max(v, 0)), which is max(narrow(v), 0) bit for bit, so a fused step gives the
bits of the unfused one (on the CPU, bf16 maps are emulated with ml_dtypes)."""
import numpy as np
import pytest

from minidnn import SGD
from minidnn.builder import NetBuilder
from minidnn.decide import build_executor
from minidnn.fusion import bn_relu_pairs
from minidnn.kernels.mapformat import MapFormat
from minidnn.memory.plan import LivenessPlan

pytest.importorskip("ml_dtypes")


def small_resnet():
    """A stem and one residual block, 8x8 images: conv -> bn -> relu pairs and a ReLU after
    the residual add (which stays a layer of its own)."""
    b = NetBuilder("small_resnet", image_size=8, num_classes=5)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu1")
    b.conv("conv2", 8, 3, padding=1, bias=False)
    b.batchnorm("bn2")
    b.relu("relu2")
    b.conv("conv3", 8, 3, padding=1, bias=False)
    b.batchnorm("bn3")
    b.add("sum", ["bn3", "relu1"])
    b.relu("relu3")
    b.global_avgpool("pool")
    b.flatten("flat")
    b.linear("fc", 5)
    return b.finish()


def train(settings, fuse, steps=2):
    """(losses, state_dict, the decision's bn_relu, an evaluation's loss) after `steps`
    training steps of batch 4."""
    net = small_resnet()
    net.init_params(0)
    ex = build_executor(net, 4, device="cpu", seed=1, fuse=fuse, **settings)
    opt = SGD(ex.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(2)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
        losses.append(float(ex.train_step(x, rng.integers(0, 5, 4), opt)))
    pairs = dict(ex.decision.bn_relu)
    evaluated = float(ex.forward(x, rng.integers(0, 5, 4), train=False))
    ex.close()
    state = {k: np.array(v) for k, v in net.state_dict().items()}
    return losses, state, pairs, evaluated


def test_bf16_maps_fuse_the_same_pairs_as_fp32_ones():
    net = small_resnet()
    fp32 = bn_relu_pairs(LivenessPlan(net, 2))
    assert fp32 == {"relu1": "bn1", "relu2": "bn2"}     # relu3 follows the add
    assert bn_relu_pairs(LivenessPlan(net, 2, maps=MapFormat("nchw", "bf16"))) == fp32


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_bf16_step_gives_the_bits_of_the_unfused_one(layout):
    settings = {"precision": "bf16", "layout": layout}
    losses, state, pairs, evaluated = train(settings, fuse=True)
    assert pairs == {"relu1": "bn1", "relu2": "bn2"}
    plain_losses, plain_state, none, plain_evaluated = train(settings, fuse=False)
    assert none == {}
    assert losses == plain_losses and evaluated == plain_evaluated
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k


def test_the_fused_bf16_forward_stores_max_of_the_rounded_value():
    """Values whose float32 v rounds to -0 or to +0 in bf16 and ordinary ones: the batch
    norm's fused store equals the ReLU run on its unfused bf16 output, bit for bit."""
    import ml_dtypes
    from minidnn.kernels import cpu, cpu_batchnorm
    bf16 = ml_dtypes.bfloat16
    tiny = np.float32(2.0 ** -135)                     # below half bf16's least subnormal
    x = np.array([-3, -tiny, tiny, 0, 1e-3, 7, -1e-40, 1e-40], np.float32).reshape(1, 2, 2, 2)
    mean, invstd = np.zeros(2, np.float32), np.ones(2, np.float32)
    w, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    fused, plain = np.empty_like(x), np.empty_like(x)
    cpu_batchnorm.batchnorm_forward(x, mean, invstd, w, b, fused, relu=True)
    cpu_batchnorm.batchnorm_forward(x, mean, invstd, w, b, plain)
    stored = plain.astype(bf16)
    relu = np.empty_like(stored)
    cpu.relu_forward(stored, relu)
    assert fused.astype(bf16).view(np.uint16).tolist() == relu.view(np.uint16).tolist()
