"""Micro-batches on a CUDA GPU: a split step matches the whole batch within float tolerance,
repeats bit for bit in the deterministic mode, and accumulates cuDNN's weight gradients
(written into temporaries, then added) under a budget with offload."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from minidnn import SGD  # noqa: E402
from minidnn.decide import build_executor  # noqa: E402
from minidnn.backend import Device, gpu_available  # noqa: E402
from test_micro_batches import small_net  # noqa: E402

if not gpu_available():  # collected on a machine with CuPy but no GPU: conftest skips them
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.fixture(autouse=True)
def default_kernels_after():
    yield
    from minidnn import kernels
    mod = kernels.for_device(Device("gpu"))
    if hasattr(mod, "configure"):
        mod.configure()


def train(micro_batches, policy="none", budget=None, steps=3):
    rng = np.random.default_rng(0)
    net = small_net(np.float32)
    with build_executor(net, 16, device="gpu", seed=0, micro_batches=micro_batches,
                        policy=policy, memory_budget=budget, deterministic=True,
                        math="fp32") as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4,
                  allocator=ex.allocator)
        losses = []
        for _ in range(steps):
            x = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
            losses.append(float(ex.train_step(x, rng.integers(0, 5, 16), opt)))
        del opt
    return net.state_dict(), losses


def test_a_split_step_on_the_gpu_matches_the_whole_batch_and_repeats():
    whole, whole_losses = train(1)
    split, split_losses = train(4)
    for name, value in whole.items():
        np.testing.assert_allclose(split[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(split_losses, whole_losses, rtol=1e-5)
    again, again_losses = train(4)
    assert again_losses == split_losses
    for name, value in split.items():
        assert np.array_equal(again[name], value), name


def test_a_split_step_with_offload_under_a_budget_is_the_split_step_without():
    plain, _ = train(2)
    offloaded, _ = train(2, policy="all", budget="512MiB")
    for name, value in plain.items():
        assert np.array_equal(offloaded[name], value), name
