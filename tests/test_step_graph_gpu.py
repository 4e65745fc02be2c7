"""Steps replayed from CUDA graphs (minidnn/step_graph.py) on a GPU: the same losses and
parameters, bit for bit, as the same steps issued layer by layer, with dropout (its keys read
from device memory), micro-batches, batch norm, bf16 maps, a static layout under a budget,
two input batches in turn (one graph each), layer chunks, and maps offloaded to host memory
and prefetched back in a static layout (the copies captured on their own streams)."""
import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.backend import gpu_available
from minidnn.decide import build_executor

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("default_gpu_kernels_after")]
cupy = pytest.importorskip("cupy")
if not gpu_available():  # collected on a machine with CuPy but no GPU: conftest skips them
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def train(model, graphs, steps=7, batch=16, size=64, **options):
    """(losses read after the last step, state_dict, graphs captured) of `steps` steps on two
    device batches in turn."""
    net = models.build(model, num_classes=10, image_size=size)
    with build_executor(net, batch, device="gpu", seed=3, deterministic=True, graphs=graphs,
                        **options) as ex:
        opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4,
                  allocator=ex.allocator)
        rng = np.random.default_rng(0)
        with ex.device.compute:
            batches = [(cupy.asarray(rng.standard_normal((batch, 3, size, size), np.float32)),
                        cupy.asarray(rng.integers(0, 10, batch))) for _ in range(2)]
        # kept on the device and read at the end: each must still be its own step's loss
        pending = [ex.train_step(*batches[k % 2], opt) for k in range(steps)]
        losses = [float(loss) for loss in pending]
        captured = 0 if ex._graphs is None else ex._graphs.count
        given_up = None if ex._graphs is None else ex._graphs.given_up
    return losses, net.state_dict(), captured, given_up


@pytest.mark.parametrize("model, options", [
    ("alexnet", {}),
    ("alexnet", {"precision": "bf16"}),
    ("alexnet", {"memory_budget": "1GiB", "micro_batches": 2}),
    ("resnet18", {"micro_batches": 2, "split_batch_statistics": True}),
    ("alexnet", {"memory_budget": "1GiB", "policy": "all"}),
    ("alexnet", {"memory_budget": "1GiB", "policy": "all", "micro_batches": 2,
                 "precision": "bf16"}),
    ("resnet18", {"memory_budget": "1GiB", "policy": "all"}),
    ("alexnet", {"policy": "dyn", "chunks": (("conv1", "pool2", 2),)}),
    ("alexnet", {"memory_budget": "1GiB", "policy": "dyn", "micro_batches": 2,
                 "chunks": (("conv1", "pool1", 4),)}),
])
def test_a_replayed_step_is_the_step_issued_layer_by_layer(model, options):
    plain_losses, plain, plain_graphs, _ = train(model, False, **options)
    losses, state, captured, given_up = train(model, True, **options)
    assert plain_graphs == 0
    assert given_up is None
    assert captured == 2              # one graph per input batch
    assert losses == plain_losses
    for name, value in plain.items():
        assert np.array_equal(state[name], value), name


def test_host_batches_and_offload_from_the_arena_run_without_graphs():
    net = models.build("alexnet", num_classes=10, image_size=64)
    with build_executor(net, 8, device="gpu", policy="all") as ex:
        assert ex.manager.offload and ex.layout is None
        assert ex._graphs is None     # a free behind a copy would hold compute back
    net = models.build("alexnet", num_classes=10, image_size=64)
    with build_executor(net, 8, device="gpu") as ex:
        opt = SGD(ex.parameters(), lr=0.01, allocator=ex.allocator)
        x = np.zeros((8, 3, 64, 64), np.float32)
        for _ in range(4):
            ex.train_step(x, np.zeros(8, np.int64), opt)
        assert ex._graphs.count == 0  # a host batch is copied in by the host
