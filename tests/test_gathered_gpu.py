"""Gathered fully connected gradients (minidnn/gathered.py) on a CUDA GPU: steps replayed from
CUDA graphs, float32 and bf16 maps, against the unsplit step and the split step whose passes
each add their own products; bit for bit under --deterministic."""
from dataclasses import replace

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from minidnn import SGD  # noqa: E402
from minidnn.backend import Device, gpu_available  # noqa: E402
from minidnn.decide import decide  # noqa: E402
from minidnn.executor import Executor  # noqa: E402
from minidnn.spec import StepSpec  # noqa: E402
from test_gathered import BATCH, head_net  # noqa: E402

if not gpu_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.fixture(autouse=True)
def default_kernels_after():
    yield
    from minidnn import kernels
    mod = kernels.for_device(Device("gpu"))
    if hasattr(mod, "configure"):
        mod.configure()


def train(micro_batches: int, gather: bool = True, steps: int = 6, **settings):
    """(parameters after `steps` SGD steps on the GPU, the losses, the decision's gathered
    layers, the steps replayed from CUDA graphs)."""
    net = head_net()
    spec = StepSpec(batch=BATCH, micro_batches=micro_batches, **settings)
    decision = decide(net, spec, device="gpu")
    if not gather:
        decision = replace(decision, gathered=frozenset())
    rng = np.random.default_rng(0)
    with Executor(net, spec, decision, device="gpu", seed=0) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4,
                  allocator=ex.allocator, kernels=ex.kernels)
        # Two batches on the device in turn: a step replays the graph captured for its batch.
        batches = [(cupy.asarray(rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32)),
                    cupy.asarray(rng.integers(0, 10, BATCH))) for _ in range(2)]
        losses = []
        for s in range(steps):
            losses.append(float(ex.train_step(*batches[s % 2], opt)))
        replayed = (ex.graph_stats() or {}).get("replayed_steps", 0)
        del opt
    return net.state_dict(), losses, decision.gathered, replayed


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_gathered_split_step_matches_the_whole_batch_and_repeats(precision):
    whole, whole_losses, _, _ = train(1, precision=precision, math="fp32")
    split, losses, gathered, replayed = train(4, precision=precision, math="fp32")
    apart, apart_losses, _, _ = train(4, gather=False, precision=precision, math="fp32")
    assert gathered == {"fc1"} and replayed > 0
    tol = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=1e-3)
    for name, value in whole.items():
        np.testing.assert_allclose(split[name], value, **tol, err_msg=name)
        np.testing.assert_allclose(split[name], apart[name], **tol, err_msg=name)
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-3 if precision == "bf16" else 1e-5)
    again, again_losses, _, _ = train(4, precision=precision, math="fp32")
    assert again_losses == losses
    for name, value in split.items():
        assert np.array_equal(again[name], value), name


def test_under_deterministic_a_gathered_split_step_has_the_whole_batchs_bits():
    whole, whole_losses, _, _ = train(1, deterministic=True, math="fp32")
    for k in (2, 4):
        split, losses, gathered, _ = train(k, deterministic=True, math="fp32")
        assert gathered == {"fc1"}
        assert losses == whole_losses
        for name, value in whole.items():
            assert np.array_equal(split[name], value), (k, name)
