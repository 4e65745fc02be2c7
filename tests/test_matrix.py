"""The combination matrix on the CPU (tests/matrix_cells.py says what a cell is and what it
must show): a sample of cells drawn with a fixed seed in every run, the whole product only
under the `slow` marker with MINIDNN_FULL_MATRIX=1 (it takes many minutes on 2 cores)."""
import os

import pytest

from matrix_cells import Runner, all_cells, check_cell, sample_cells

SAMPLE = sample_cells(count=30, two_rank_count=3, seed=29)
FULL = os.environ.get("MINIDNN_FULL_MATRIX", "") not in ("", "0")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIDNN_CACHE", str(folder / "cache"))   # the profiles dyn measures
        yield Runner(folder)


@pytest.mark.parametrize("cell", SAMPLE, ids=lambda c: c.id)
def test_a_sampled_cell_runs_as_planned_or_is_refused_before_step_one(runner, cell):
    check_cell(runner, cell)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the whole product: set MINIDNN_FULL_MATRIX=1")
@pytest.mark.parametrize("cell", all_cells(), ids=lambda c: c.id)
def test_every_cell_runs_as_planned_or_is_refused_before_step_one(runner, cell):
    check_cell(runner, cell)
