"""Gathered fully connected gradients (minidnn/gathered.py) on a CUDA GPU: steps replayed from
CUDA graphs, float32 and bf16 maps, against the unsplit step and the split step whose passes
each add their own products; bit for bit under --deterministic."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from minidnn import SGD  # noqa: E402
from test_gathered import BATCH, head_executor, step_gradients  # noqa: E402
# The GPU's module checks (skipped without one) and its fixture restoring the kernels' math.
from test_micro_batches_gpu import default_kernels_after  # noqa: E402,F401


def train(micro_batches: int, gather: bool = True, steps: int = 6, **settings):
    """(parameters after `steps` SGD steps on the GPU, the losses, the decision's gathered
    layers, the steps replayed from CUDA graphs)."""
    rng = np.random.default_rng(0)
    ex = head_executor(micro_batches, gather, "gpu", **settings)
    with ex:
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
    return ex.net.state_dict(), losses, ex.decision.gathered, replayed   # on the host


def test_a_gathered_split_step_matches_the_whole_batch_with_replayed_steps():
    """float32 maps, steps replayed from CUDA graphs: a split step gathering fc1 trains as
    the whole batch does, and as the split step whose passes add their own products, within
    float32 rounding (outside --deterministic cuDNN's weight gradients may sum in any order,
    so runs are not compared bit for bit here)."""
    whole, whole_losses, _, _ = train(1, math="fp32")
    split, losses, gathered, replayed = train(4, math="fp32")
    apart, apart_losses, _, _ = train(4, gather=False, math="fp32")
    assert gathered == {"fc1"} and replayed > 0
    for name, value in whole.items():
        np.testing.assert_allclose(split[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(split[name], apart[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
    np.testing.assert_allclose(apart_losses, whole_losses, rtol=1e-5)


def test_bf16_gathered_gradients_match_the_whole_batchs():
    """bf16 maps: one step's gradients, gathered or each pass adding its own, against the
    whole batch's, within a few roundings of bf16 maps (2**-6 of each gradient's largest
    value; a pass missing or counted twice is a quarter of it); and a gathered split run
    replays its steps."""
    _, whole = step_gradients(1, device="gpu", precision="bf16", math="fp32")
    for gather in (True, False):
        _, split = step_gradients(4, gather, "gpu", precision="bf16", math="fp32")
        for name, value in whole.items():
            scale = float(np.abs(value).max())
            assert float(np.abs(split[name] - value).max()) <= 2**-6 * scale, (gather, name)
    _, losses, gathered, replayed = train(4, precision="bf16", math="fp32")
    _, apart_losses, _, _ = train(4, gather=False, precision="bf16", math="fp32")
    assert gathered == {"fc1"} and replayed > 0
    np.testing.assert_allclose(losses, apart_losses, rtol=1e-2)


def test_under_deterministic_a_gathered_split_step_has_the_whole_batchs_bits():
    whole, whole_losses, _, _ = train(1, deterministic=True, math="fp32")
    for k in (2, 4):
        split, losses, gathered, _ = train(k, deterministic=True, math="fp32")
        assert gathered == {"fc1"}
        assert losses == whole_losses
        for name, value in whole.items():
            assert np.array_equal(split[name], value), (k, name)
