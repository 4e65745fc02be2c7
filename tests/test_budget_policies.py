"""A vDNN policy (none, all, conv) under too small a budget is refused before step one, with
one line naming the least budget under that policy: the peak the step model plans for the
policy's one decision with the planner's reserve on top, rounded as `--memory-budget` takes
it (search.budget_to_give).
`minidnn plan --policy P` names the same figure, that budget trains, and 1% less is refused.
On the CPU, as the matrix's cells (tests/matrix_cells.py)."""
import pytest

from matrix_cells import Cell, Runner, least_named, plan_json, with_reserve

from minidnn.errors import MemoryBudgetError, parse_bytes
from minidnn.planner.search import budget_to_give


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policies")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIDNN_CACHE", str(folder / "cache"))
        yield Runner(folder)


@pytest.mark.parametrize("cell", [
    Cell("googlenet", "fp32", "nchw", "conv", "least", "whole", 1),
    Cell("vgg", "bf16", "nhwc", "all", "least", "micro2", 1, "bits"),
    Cell("resnet", "fp32", "nchw", "none", "least", "whole", 1),
], ids=lambda c: c.id)
def test_a_vdnn_policy_names_its_least_budget_which_trains_while_one_percent_less_is_refused(
        runner, cell):
    refused = runner.run(cell, cell.policy, 4096)
    assert refused.before_step_one, refused.error
    assert isinstance(refused.error, MemoryBudgetError)
    message = str(refused.error)
    assert f"under policy {cell.policy}" in message and "\n" not in message
    need = runner.predicted_peak(cell, None)          # `minidnn plan --policy P`'s peak
    least = with_reserve(need)
    plan = plan_json(runner.plan_args(cell, cell.policy) + ["--prefetch-lookahead", "1"])
    assert plan["minimum_budget_bytes"] == least_named(refused.error) == least
    named = least_named(message)                      # the figure as the line prints it
    assert named == parse_bytes(budget_to_give(least)) >= least
    trained = runner.run(cell, cell.policy, named)
    assert trained.error is None, trained.error
    assert trained.report["peak_device_bytes"] == need
    below = runner.run(cell, cell.policy, int(named * 0.99))
    assert below.error is not None and below.before_step_one, below.error
