"""The packer (memory/layout.py: _place) gives the offsets the earlier one gave, kept here as
the reference: the greedy that, for each interval, masks every placed one by time and sweeps
the alive ones in address order with array operations. Plans print the static region's size,
so a faster packer must place every block exactly where that one did."""
import bisect

import numpy as np
import pytest

from minidnn import models
from minidnn.memory.allocator import ALIGNMENT, aligned
from minidnn.memory.layout import _place
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.step_model import StepModel

from test_planner_replay import _decisions


def _reference_place(need, start, end, alignment):
    """The packer before the neighbour lists (the reference)."""
    n = len(need)
    starts, ends, needs = start.tolist(), end.tolist(), need.tolist()
    order = sorted(range(n), key=lambda i: (-needs[i], starts[i]))
    offset = np.full(n, -1, dtype=np.int64)
    rows = np.empty((n, 4), dtype=np.int64)
    lo, hi, born, dies = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    los: list = []
    for p, i in enumerate(order):
        size, s, e = needs[i], starts[i], ends[i]
        alive = (born[:p] < e) & (dies[:p] > s)
        a_lo = lo[:p][alive]
        if a_lo.size == 0 or size <= a_lo[0]:
            at = 0
        else:
            reach = np.maximum.accumulate(hi[:p][alive])
            fits = reach[:-1] + size <= a_lo[1:]
            j = int(fits.argmax()) if fits.size else 0
            at = int(reach[j] if fits.size and fits[j] else reach[-1])
        offset[i] = at
        k = bisect.bisect_right(los, at)
        los.insert(k, at)
        rows[k + 1:p + 1] = rows[k:p]
        rows[k] = (at, (at + size + alignment - 1) // alignment * alignment, s, e)
    return offset


def _arrays(intervals):
    return (np.array([aligned(iv.nbytes) for iv in intervals], dtype=np.int64),
            np.array([iv.start for iv in intervals], dtype=np.int64),
            np.array([iv.end for iv in intervals], dtype=np.int64))


@pytest.mark.parametrize("name,batch,options", [
    ("vgg16", 8, dict(prefetch_lookahead=1)),
    ("resnet18", 8, dict(prefetch_lookahead=2, micro_batches=2)),
    ("googlenet", 8, dict(prefetch_lookahead=0)),
    ("vgg416", 2, dict(prefetch_lookahead=1)),
])
def test_real_step_blocks_pack_as_the_reference_packs_them(name, batch, options):
    net = models.build(name, num_classes=10, image_size=64)
    model = StepModel(net, batch, analytic_profile(net, batch, "h200"), **options)
    for offload, algos, recompute in _decisions(model, count=4, seed=5):
        algos = {n: algos.get(n, "fastest") for n in model.conv_names}
        intervals = model._walk(offload, algos, recompute).recording.intervals
        need, start, end = _arrays(intervals)
        assert _place(need, start, end, ALIGNMENT).tolist() == \
            _reference_place(need, start, end, ALIGNMENT).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_random_intervals_pack_as_the_reference_packs_them(seed):
    """Ties in size, start and end, long and short lives, empty and reversed intervals, and
    an alignment coarser than the sizes'."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    need = rng.integers(1, 6, n) * 256 * rng.choice([1, 3], n)
    start = rng.integers(-1, 40, n)
    end = start + rng.integers(-3, 30, n) if seed % 3 else rng.integers(-1, 40, n)
    for alignment in (256, 1024):
        assert _place(need, start, end, alignment).tolist() == \
            _reference_place(need, start, end, alignment).tolist()
