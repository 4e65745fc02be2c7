"""One walk of a step for both the static layout and the timed log (planner/recorded.py): the
blocks it records pack to the layout the executor's own record walk gives, and its log, with
the planned blocks' waits put in afterwards, is the log of a step walked at the packed
addresses."""
import pytest

from minidnn import models
from minidnn.memory.layout import StaticLayout, live_peak
from minidnn.memory.record import record_intervals
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.recording import Recorder
from minidnn.planner.step_model import StepModel

from test_planner_replay import _canonical, _decisions, _logs


def _model(name, **options):
    net = models.build(name, num_classes=10, image_size=64)
    return StepModel(net, 8, analytic_profile(net, 8, "h200"), **options)


def _settings(model, algos):
    return {n: algos.get(n, "fastest") for n in model.conv_names}


def _ranks(intervals) -> list:
    """Each interval's (sid, k, bytes, rank of its start, rank of its end), with every end
    after the last start counted as one rank: only the order of positions matters to a
    layout, and no block is taken after the step's end."""
    last_start = max(iv.start for iv in intervals)
    times = sorted({iv.start for iv in intervals} |
                   {iv.end for iv in intervals if iv.end <= last_start})
    rank = {t: r for r, t in enumerate(times)}
    return [(iv.sid, iv.k, iv.nbytes, rank[iv.start],
             rank.get(iv.end, len(times))) for iv in intervals]


@pytest.mark.parametrize("name,lookahead", [("vgg16", 1), ("resnet18", 2), ("googlenet", 0),
                                            ("alexnet", 1)])
def test_the_walk_records_the_blocks_of_the_record_walk(name, lookahead):
    model = _model(name, prefetch_lookahead=lookahead)
    keep = (model.net.loss_node.name, model.net.output)
    for offload, algos, recompute in _decisions(model, count=4, seed=3):
        algos = _settings(model, algos)
        walked = model._walk(offload, algos, recompute).recording.intervals
        workspace = {(model.index[n], phase): b
                     for (n, phase), b in model.workspace_blocks(algos, recompute).items()}
        recorded = record_intervals(model.plan, offload, lookahead, keep, workspace,
                                    recompute, model.scratch)
        assert _ranks(walked) == _ranks(recorded)
        assert live_peak(walked) == live_peak(recorded)
        a, b = StaticLayout(walked), StaticLayout(recorded)
        assert a.size == b.size
        assert [iv.offset for iv in walked] == [iv.offset for iv in recorded]


@pytest.mark.parametrize("name,options", [
    ("vgg16", dict(prefetch_lookahead=1)),
    ("resnet18", dict(prefetch_lookahead=2, micro_batches=2)),
    ("googlenet", dict(prefetch_lookahead=0)),
])
def test_the_spliced_log_is_that_of_a_walk_at_the_packed_addresses(name, options, monkeypatch):
    model = _model(name, **options)
    waited = 0
    for offload, algos, recompute in _decisions(model, count=4, seed=4):
        algos = _settings(model, algos)
        # The executor records and packs its own layout, and walks two steps at it.
        device = model._device()
        ex = model.dry_executor(device, offload, model.workspace_blocks(algos, recompute),
                                recompute, static_layout=True)
        device.log.clear()
        rec = Recorder(device.log, ex.manager, model.index)
        ex.watch(rec)
        for _ in range(model.steps):
            ex.simulate_step()
            rec.optimizer_and_step_end()
        timed = _logs(model, (offload, algos, recompute), monkeypatch)
        assert _canonical(timed) == _canonical(device.log)
        waited += sum(type(op).__name__ == "Wait" for op in timed)
    assert waited > 0
