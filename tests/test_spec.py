"""StepSpec: one value names a step's combination, checked once; a decision records it and an
executor refuses a decision made for another spec."""
import pytest

from minidnn import models
from minidnn.decide import build_executor, decide
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.spec import StepSpec


def mlp():
    return models.build("mlp", num_classes=10, image_size=8)


def test_the_spec_parses_and_checks_its_fields_once():
    spec = StepSpec(batch=8, memory_budget="1GiB", micro_batches=2)
    assert spec.memory_budget == 2**30 and spec.static_layout       # planned under a budget
    assert not StepSpec(batch=8).static_layout
    assert StepSpec(batch=8, chunks=[("a", "b", 2)]).chunks == (("a", "b", 2),)
    for bad, match in ((dict(prefetch_lookahead=-1), "prefetch_lookahead"),
                       (dict(micro_batches=3), "must divide the batch 8"),
                       (dict(precision="fp16"), "precision must be one of"),
                       (dict(layout="chwn"), "layout must be one of"),
                       (dict(batch_offset=4, global_batch=8), "do not lie in a global batch"),
                       (dict(batch=0), "batch must be an integer >= 1")):
        with pytest.raises(ConfigError, match=match):
            StepSpec(**{"batch": 8, **bad})


def test_a_decision_records_its_spec_and_an_executor_refuses_another():
    net = mlp()
    spec = StepSpec(batch=8, policy="all", memory_budget="1GiB")
    decision = decide(net, spec, device="cpu")
    assert decision.spec is spec
    with Executor(net, spec, decision, device="cpu") as ex:
        assert ex.spec is spec and ex.decision is decision
    with pytest.raises(ConfigError, match=r"memory_budget 1073741824 vs 2147483648"):
        Executor(net, spec.replace(memory_budget="2GiB"), decision, device="cpu")
    with pytest.raises(ConfigError, match="not beside it"):
        build_executor(net, spec, device="cpu", policy="none")


def test_forced_chunks_need_a_planning_policy_and_a_network_that_runs_them():
    net = models.build("tiny_cnn", num_classes=10, image_size=32)
    with pytest.raises(ConfigError, match="layer chunks are planned"):
        decide(net, StepSpec(batch=8, policy="all", chunks=(("conv1", "relu1", 2),)))
    with pytest.raises(ConfigError):
        StepSpec(batch=8, chunks=(("conv1", "nothing", 2),)).check_network(net)
