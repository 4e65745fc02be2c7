"""bf16 steps under budgets on the GPU, where the step's memory model must count the CuPy
temporaries the kernels make (on the CPU they lie outside the arena, so only a GPU shows
them). Each trains a small member of a family at the least budget dyn names for it (the
refusal of 4 KiB): a step the plan says fits must run, its measured peak within the budget.

* A convolution's backward on bf16 maps writes its weight gradient in bf16 first
  (planner/costs.gradient_copy_bytes): uncounted, ResNet-50 with split batch statistics at its
  least budget (64 micro-batches of 4) failed asking for layer4.2.conv2's 4.5 MiB copy.
* VGG-16 bf16 at 3 GiB (8 micro-batches, conv1_1..pool1 in 2 pieces) failed on a 144 KiB
  allocation between layer calls (conv1_2's weight in float32): after training, with the
  arena full (the static region, the captured step's blocks), a weight laid out channels
  last was brought to the host through a C-ordered copy on the device (CuPy's asnumpy of a
  strided view); backend.to_numpy now copies it as its bytes lie. An allocation named by
  nothing now says the code that asked (memory/arena.caller); a test lists any made in a
  steady step of such a run.
* A vDNN policy (none, all, conv) trains at the least budget it is refused with.
* Steps replayed from CUDA graphs keep their blocks between replays (memory/graph_pool.py); a
  traced last step and an evaluation run plainly and take blocks of their own. Kept, the
  graphs' blocks made VGG-16 bf16 at 3.44 GiB (8 passes of 32) fail its traced 8th step
  asking for fc6's 196 MiB with 28.65 MiB free, and OverFeat and ResNet-50 at their least
  budgets alike; they now go back to the arena first (Executor._leave_graphs).
"""
import os

import pytest

from minidnn.backend import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a GPU")]

MODELS = os.path.join(os.path.dirname(__file__), "matrix_models")


def run(tmp_path, model: str, budget, policy="dyn", steps=4, eval_every=0, data="synthetic",
        **settings):
    """`minidnn train` of a small model in bf16 on the GPU (synthetic data, 4 steps, ReLU bit
    masks, policy dyn unless given): its report, or the error it ended with."""
    from minidnn.train import TrainConfig, train
    cfg = TrainConfig(model=os.path.join(MODELS, model), image_size=32, batch=32, steps=steps,
                      device="gpu", data=data, eval_every=eval_every, eval_batches=1,
                      progress=False, precision="bf16", policy=policy, relu_bits=True,
                      memory_budget=budget, report=str(tmp_path / f"{budget}.json"),
                      **settings)
    return train(cfg, log=lambda *_: None)


def least_budget(tmp_path, model: str, **settings) -> int:
    from minidnn.planner import InfeasibleBudgetError
    with pytest.raises(InfeasibleBudgetError) as refused:
        run(tmp_path, model, 4096, **settings)
    return int(refused.value.minimum)


@pytest.mark.parametrize("model, settings", [
    ("tiny_resnet.py", dict(micro_batches=8, split_batch_statistics=True)),
    ("tiny_vgg.py", dict(micro_batches=4, chunks=(("conv1_1", "pool1", 2),))),
    ("tiny_googlenet.py", {}),
], ids=["resnet-split-statistics", "vgg-micro-batches-chunks", "googlenet"])
def test_a_bf16_step_trains_at_its_least_budget(tmp_path, monkeypatch, model, settings):
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    least = least_budget(tmp_path, model, **settings)
    report = run(tmp_path, model, least, **settings)
    assert report["steps"] == 4
    assert report["peak_device_bytes"] <= least


@pytest.mark.parametrize("policy", ["none", "all", "conv"])
def test_a_vdnn_policy_trains_at_the_least_budget_its_refusal_names(tmp_path, monkeypatch,
                                                                     policy):
    """The vDNN policies are weighed before step one (decide.weighed): their least budget,
    the planned peak of their one decision with its convolutions' workspaces planned, trains
    on the GPU, and 1% less is refused before step one."""
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    least = least_budget(tmp_path, "tiny_googlenet.py", policy=policy)
    report = run(tmp_path, "tiny_googlenet.py", least, policy=policy)
    assert report["steps"] == 4 and report["peak_device_bytes"] <= least
    from minidnn.planner import InfeasibleBudgetError
    with pytest.raises(InfeasibleBudgetError):
        run(tmp_path, "tiny_googlenet.py", int(least * 0.99), policy=policy)


def test_no_allocation_of_a_steady_bf16_step_is_named_by_nothing(tmp_path, monkeypatch):
    """Every block larger than one 256-byte block (each pass's copy of its 0-d loss takes
    one) that a steady step of a split, chunked bf16 VGG takes from the arena is made inside
    a layer call, the optimizer or a named buffer: one made between calls is outside what
    the step model walks (the failure lists each with the code that asked)."""
    from minidnn.memory import arena as arena_module
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    settings = dict(micro_batches=4, chunks=(("conv1_1", "pool1", 2),), graphs=False)
    seen = []
    take = arena_module.Arena._take

    def noting(self, nbytes, where):
        if not (where or self.current_where) and getattr(self, "_steady", False) and \
                nbytes > 256:
            seen.append((nbytes, arena_module.caller()))
        return take(self, nbytes, where)

    monkeypatch.setattr(arena_module.Arena, "_take", noting)
    from minidnn import executor as executor_module
    step = executor_module.Executor.train_step

    def steady_step(self, *args, **kw):      # steps after the first (plans measured)
        self.allocator._steady = self.step >= 1
        return step(self, *args, **kw)

    monkeypatch.setattr(executor_module.Executor, "train_step", steady_step)
    run(tmp_path, "tiny_vgg.py", 64 * 2**20, **settings)
    assert not seen, f"allocations between layer calls: {seen}"


def test_a_channels_last_weight_comes_to_the_host_without_a_device_copy():
    """After training, the checksum and the executor's release bring every weight to the host.
    A channels-last weight (a strided view) copied by CuPy would first be made C-ordered on
    the device: VGG-16 bf16 at 3 GiB failed on conv1_2's 144 KiB that way, the arena full.
    backend.to_numpy copies it as its bytes lie: nothing is allocated on the device."""
    import cupy as cp
    import numpy as np
    from minidnn.backend import Device, to_numpy
    from minidnn.memory.arena import Arena
    arena = Arena(Device("gpu"), 2**20)
    with arena, arena.route_cupy():          # CuPy's allocations come from the arena too
        buf = arena.alloc(64 * 3 * 3 * 64 * 4)
        w = buf.view(cp.float32).reshape(64, 3, 3, 64).transpose(0, 3, 1, 2)  # (O, C, H, W)
        w[...] = cp.arange(w.size, dtype=cp.float32).reshape(w.shape)
        allocs = arena.allocs
        host = to_numpy(w)
        assert arena.allocs == allocs
        assert host.flags.c_contiguous
        np.testing.assert_array_equal(host, np.arange(w.size, dtype=np.float32).reshape(
            64, 64, 3, 3))


@pytest.mark.parametrize("model, settings", [
    ("tiny_vgg.py", dict(micro_batches=4)),
    ("tiny_resnet.py", dict(micro_batches=8, split_batch_statistics=True)),
], ids=["vgg-micro-batches", "resnet-split-statistics"])
def test_an_evaluation_and_a_traced_step_fit_beside_captured_steps(tmp_path, monkeypatch,
                                                                    model, settings):
    """At its least budget a run replays its steps from CUDA graphs, evaluates every 3 steps
    and traces its last: each evaluation and the traced step run plainly, in the blocks the
    graphs gave back, and later steps are captured again. With the graphs' blocks kept, the
    same run exceeds its budget."""
    from minidnn.errors import MemoryBudgetError
    from minidnn.executor import Executor
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    again = dict(steps=8, eval_every=3, data="shapes", trace=str(tmp_path / "t.json"),
                 **settings)
    least = least_budget(tmp_path, model, data="shapes", **settings)
    report = run(tmp_path, model, least, **again)
    assert report["steps"] == 8 and report["peak_device_bytes"] <= least
    assert [e["step"] for e in report["eval"]] == [3, 6, 8]
    assert len(report["step_graphs"]["captured_at"]) >= 2, report["step_graphs"]
    assert (tmp_path / "t.json").exists()
    monkeypatch.setattr(Executor, "_leave_graphs", lambda self: None)
    with pytest.raises(MemoryBudgetError):
        run(tmp_path, model, least, **again)
