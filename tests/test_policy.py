"""Memory policies: the registry, what none / all / conv choose, and a policy plugged in."""
import numpy as np
import pytest

from minidnn import Network, SGD
from minidnn.errors import ConfigError
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import (MemoryDecision, OffloadAll, Policy, get_policy,
                                   offload_candidates, policy_names, register_policy)
from minidnn.decide import build_executor


def chain() -> Network:
    """data -> conv1 -> relu1 (in place) -> pool1 -> conv2 -> relu2 -> flat -> fc -> loss"""
    return Network.sequential((3, 8, 8), [
        Conv2d(4, 3, padding=1, name="conv1"), ReLU(name="relu1"), MaxPool2d(2, name="pool1"),
        Conv2d(6, 3, padding=1, name="conv2"), ReLU(name="relu2"), Flatten(name="flat"),
        Linear(5, name="fc")], num_classes=5)


def plan_of(net, batch=2, fuse=True):
    return LivenessPlan(net, batch, fuse=fuse)


def names_of(plan, sids):
    return {plan.storages[s].tensors[0] for s in sids}


def test_registry_lists_the_built_in_policies():
    assert {"none", "all", "conv"} <= set(policy_names())
    assert get_policy("all").name == "all"
    p = OffloadAll()
    assert get_policy(p) is p


def test_unknown_policy_is_a_config_error_listing_the_names():
    with pytest.raises(ConfigError) as err:
        get_policy("vdnn_everything")
    msg = str(err.value)
    assert "vdnn_everything" in msg
    for name in ("none", "all", "conv"):
        assert name in msg
    with pytest.raises(ConfigError):
        build_executor(chain(), 2, device="cpu", policy="bogus")


def test_none_offloads_nothing():
    assert get_policy("none").decide(plan_of(chain())).offload == frozenset()


def test_all_offloads_every_feature_map_backward_reads_except_the_ones_needed_at_once():
    plan = plan_of(chain())
    chosen = names_of(plan, get_policy("all").decide(plan).offload)
    # conv1 reads data; relu1 (over conv1's storage) keeps nothing, pool1 applies its mask
    # (minidnn/fusion.py); pool1's argmax; pool1 is read by conv2; relu2 (over conv2) by
    # relu2's backward and by fc through the in-place flatten.
    assert chosen == {"data", "pool1:argmax", "pool1", "conv2"}
    unfused = plan_of(chain(), fuse=False)     # relu1 read by its own backward
    assert names_of(unfused, get_policy("all").decide(unfused).offload) == chosen | {"conv1"}
    # Labels and the loss's softmax are read by the very next layer call: never moved.
    for s in plan.storages:
        if s.tensors[0] in ("label", "loss", "loss:prob"):
            assert s.id not in get_policy("all").decide(plan).offload
    # Gradients are never offloaded.
    assert all(plan.storages[s].kind != "grad" for s in get_policy("all").decide(plan).offload)


def test_conv_offloads_only_convolution_inputs():
    plan = plan_of(chain())
    chosen = names_of(plan, get_policy("conv").decide(plan).offload)
    assert chosen == {"data", "pool1"}
    assert get_policy("conv").decide(plan).offload <= get_policy("all").decide(plan).offload


def test_candidates_need_a_gap_between_forward_and_backward_use():
    plan = plan_of(chain())
    for s in offload_candidates(plan):
        assert s.first_backward_use - s.last_forward_use >= 2
        assert s.kind in ("input", "feature", "aux")


def test_min_bytes_leaves_small_maps_on_the_device():
    plan = plan_of(chain())
    sizes = sorted(plan.storages[s].nbytes for s in OffloadAll().decide(plan).offload)
    threshold = sizes[len(sizes) // 2]
    small_out = OffloadAll(min_bytes=threshold).decide(plan).offload
    assert small_out and all(plan.storages[s].nbytes >= threshold for s in small_out)
    assert len(small_out) < len(sizes)


def test_a_new_policy_plugs_in_by_name_without_touching_layers():
    @register_policy
    class OffloadLargest(Policy):
        """Offload just the largest candidate, and run conv1 with the lean algorithm."""
        name = "test-largest"

        def decide(self, plan, budget=None):
            best = max(offload_candidates(plan), key=lambda s: s.nbytes)
            return MemoryDecision(offload=frozenset([best.id]),
                                  conv_algo={"conv1": "min_workspace"})

    assert "test-largest" in policy_names()
    net = chain()
    ex = build_executor(net, 2, device="cpu", policy="test-largest")
    assert ex.decision.conv_algo == {"conv1": "min_workspace"}
    assert net.node("conv1").layer.algo == "fastest"   # the executor leaves layers alone
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, 2)
    opt = SGD(ex.parameters(), lr=0.1)
    ex.train_step(x, y, opt)
    st = ex.memory_stats()
    largest = max(s.nbytes for s in offload_candidates(ex.plan))
    assert st["policy"] == "test-largest"
    assert st["offloaded_bytes"] == st["prefetched_bytes"] == largest


def test_decision_offload_bytes():
    plan = plan_of(chain())
    d = get_policy("conv").decide(plan)
    assert d.offload_bytes(plan) == sum(plan.storages[s].nbytes for s in d.offload) > 0


def test_manager_refuses_to_offload_a_gradient():
    ex = build_executor(chain(), 2, device="cpu", compute=False)
    grad = next(s.id for s in ex.plan.storages if s.kind == "grad")
    with pytest.raises(ValueError, match="cannot be offloaded"):
        ex.manager.set_offload({grad})
