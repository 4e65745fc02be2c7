"""The combination matrix on the CPU (tests/matrix_cells.py says what a cell is and what it
must show): a sample of cells drawn with a fixed seed in every run, the whole product only
under the `slow` marker with MINIDNN_FULL_MATRIX=1 (about 800 cells: many minutes on 2
cores). The cells that fail today are marked strict expected failures with their cause."""
import os

import pytest

from matrix_cells import Cell, Runner, all_cells, check_cell, least_named, sample_cells

FULL = os.environ.get("MINIDNN_FULL_MATRIX", "") not in ("", "0")


def known_failure(cell: Cell) -> str | None:
    """Why a cell fails today (None: it must pass). Every cell passes; a cell that is found
    to fail is marked here, a strict expected failure with its cause, until it is fixed."""
    return None


def cells_with_marks(cells):
    marks = []
    for cell in cells:
        reason = known_failure(cell)
        marks.append(pytest.param(cell, id=cell.id, marks=() if reason is None else
                                  pytest.mark.xfail(strict=True, reason=reason)))
    return marks


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIDNN_CACHE", str(folder / "cache"))   # the profiles dyn measures
        yield Runner(folder)


@pytest.mark.parametrize("cell", cells_with_marks(sample_cells(count=18, two_rank_count=2,
                                                               seed=29)))
def test_a_sampled_cell_runs_as_planned_or_is_refused_before_step_one(runner, cell):
    check_cell(runner, cell)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the whole product: set MINIDNN_FULL_MATRIX=1")
@pytest.mark.parametrize("cell", cells_with_marks(all_cells()))
def test_every_cell_runs_as_planned_or_is_refused_before_step_one(runner, cell):
    check_cell(runner, cell)


def test_a_vdnn_policy_below_what_it_needs_is_refused_before_step_one(runner):
    cell = Cell("googlenet", "fp32", "nchw", "conv", "least", "whole", 1)
    need = runner.least_budget(cell)
    assert runner.run(cell, "conv", need).error is None        # what it needs trains
    below = runner.run(cell, "conv", int(need * 0.99))
    assert below.error is not None and below.before_step_one, below.error


def test_the_least_budget_named_on_the_command_line_is_plans_and_trains(runner):
    """`minidnn train` refuses too small a budget with one line naming the least budget,
    `minidnn plan` names the same, and that budget trains."""
    cell = Cell("vgg", "fp32", "nchw", "dyn", "least", "whole", 1)
    refused = runner.run(cell, "dyn", 4096)
    assert refused.before_step_one
    message = str(refused.error)
    named = least_named(message)          # the figure as the line prints it
    assert named >= least_named(refused.error) == runner.least_from_plan(cell)
    assert runner.run(cell, "dyn", named).error is None


def test_one_percent_below_the_least_budget_on_the_command_line_is_refused(runner):
    cell = Cell("vgg", "fp32", "nchw", "dyn", "least", "whole", 1)
    refused = runner.run(cell, "dyn", 4096)
    named = least_named(str(refused.error))
    below = runner.run(cell, "dyn", int(named * 0.99))
    assert below.error is not None and below.before_step_one
