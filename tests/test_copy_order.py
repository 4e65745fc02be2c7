"""The step's event order on the CPU, with copy streams that really lag behind compute.

On the CPU every stream is a stand-in whose work is done when it is issued, so a missing wait
can never show. Here the two copy streams keep their work in a queue: the offload stream runs
only when something waits for one of its events (as late as CUDA may run it), the prefetch
stream at once, after the events it waits for (as early as CUDA may). A prefetch that did not
wait for the offload that fills its host copy would read that copy before it is written.
Also here: the three claims of the planner and the manager that only a wrong number betrays
(a prefetch window that stops at a prefetch that does not fit, the duplex bandwidth in the
step's lower bound, the sign of the step time in the greedy search).
"""
import dataclasses

import numpy as np
import pytest

from minidnn import SGD
from minidnn.decide import build_executor
from minidnn.backend import Device
from minidnn.errors import MemoryBudgetError
from minidnn.memory import manager as manager_module

from test_manager import BATCH, batch, dag_net


class QueuedEvent:
    """An event recorded on a QueuedStream: done once that stream has run past it."""

    def __init__(self):
        self.stream = None
        self._done = True              # never recorded: nothing to wait for

    def record(self, stream=None):
        self._done = False
        self.stream = stream
        stream.push(("record", self))

    @property
    def done(self):
        return self._done

    def synchronize(self):
        if not self._done:
            self.stream.run(until=self)


class QueuedStream:
    """A stream whose work runs in issue order, when `run` is called (eager: at once)."""

    def __init__(self, name, eager):
        self.name, self.eager, self.queue = name, eager, []

    def push(self, item):
        self.queue.append(item)
        if self.eager:
            self.run()

    def wait_event(self, event):
        self.push(("wait", event))

    def enqueue(self, work):
        self.push(("work", work))

    def run(self, until=None):
        while self.queue:
            what, x = self.queue.pop(0)
            if what == "wait":
                x.synchronize()
            elif what == "work":
                x()
            else:
                x._done = True
                if x is until:
                    return

    def synchronize(self):
        self.run()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def lagging_device():
    """A CPU device whose compute runs at once, whose offload stream lags as far as it may and
    whose prefetch stream runs as early as it may."""
    dev = Device("cpu")
    dev.compute = QueuedStream("compute", eager=True)
    dev.offload = QueuedStream("offload", eager=False)
    dev.prefetch = QueuedStream("prefetch", eager=True)
    dev.event = QueuedEvent
    dev.synchronize = lambda: [s.synchronize() for s in (dev.offload, dev.prefetch)]
    return dev


@pytest.fixture
def queued_copies(monkeypatch):
    """The manager's copies go onto their stream's queue and read their source when they run."""
    def copy(self, dst, src, nbytes, kind, stream):
        def work():
            dst[:nbytes] = src[:nbytes]
        stream.enqueue(work)
    monkeypatch.setattr(manager_module.Mover, "_copy", copy)


def checksum_after_steps(device, policy, lookahead, steps=2):
    with build_executor(dag_net(), BATCH, device=device, seed=0, policy=policy,
                        prefetch_lookahead=lookahead) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for step in range(steps):
            ex.train_step(*batch(step), opt)
        stats = ex.memory_stats()
        return ex.net.param_checksum(), stats


@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_a_prefetch_waits_for_the_offload_that_filled_its_host_copy(queued_copies, lookahead):
    reference, _ = checksum_after_steps("cpu", "none", lookahead)
    lagging, stats = checksum_after_steps(lagging_device(), "all", lookahead)
    assert stats["offloaded_bytes"] > 0 and stats["prefetched_bytes"] > 0
    assert lagging == reference


def test_the_queued_streams_do_lag():
    """Without a wait the offload stream's work has not run: the test above can fail."""
    dev = lagging_device()
    out = []
    dev.offload.enqueue(lambda: out.append("offload"))
    dev.prefetch.enqueue(lambda: out.append("prefetch"))
    assert out == ["prefetch"]
    done = dev.event()
    done.record(dev.offload)
    dev.prefetch.wait_event(done)
    assert out == ["prefetch", "offload"] and done.done


# ---- the prefetch window -----------------------------------------------------------------------------
def test_a_prefetch_window_stops_at_the_first_prefetch_that_does_not_fit(monkeypatch):
    """vDNN's window brings maps back nearest first; once one does not fit the budget, the
    farther ones must wait too (they would take the memory the nearer one needs first)."""
    ex = build_executor(dag_net(), BATCH, device="cpu", seed=0, policy="all",
                        prefetch_lookahead=100)
    mm = ex.manager
    fetch = mm._fetch
    refused, fetched = [], []

    def tight_fetch(fm, where, on_demand):
        if not on_demand and not refused:          # the first prefetch finds no room
            refused.append(mm.time)
            raise MemoryBudgetError(fm.nbytes, 0, 0, where)
        fetched.append((mm.time, on_demand))
        return fetch(fm, where, on_demand)
    monkeypatch.setattr(mm, "_fetch", tight_fetch)
    opt = SGD(ex.parameters(), lr=0.05, allocator=ex.allocator)
    ex.train_step(*batch(0), opt)
    stats = ex.memory_stats()
    ex.close()
    assert refused and stats["deferred_prefetches"] == 1
    # The window of that call held more maps (lookahead 100), and none of them was fetched.
    assert not [t for t, on_demand in fetched if t == refused[0] and not on_demand]
    assert [t for t, on_demand in fetched if t > refused[0] and not on_demand]


# ---- the planner's numbers ---------------------------------------------------------------------------
def test_the_lower_bound_respects_the_duplex_bandwidth():
    """Each way alone at 1 GB/s, both at once 1.5 GB/s in total: 1 GB each way takes at least
    2 GB / 1.5 GB/s = 1.33 s, not the 1 s each direction would take on its own."""
    from test_planner import conv_chain, flat_profile
    from minidnn.planner.search import Planner
    net = conv_chain()
    prof = dataclasses.replace(flat_profile(net, 8, bw=1e9), duplex_bw=1.5e9)
    model = Planner(net, 8, prof, budget=None, input_batches=0).model
    ev = model.evaluate(frozenset(), model.algos("fastest"))
    moved = dataclasses.replace(ev, offloaded_bytes=10**9, prefetched_bytes=10**9, compute_s=0.5)
    assert model.lower_bound_s(moved) == pytest.approx(2 / 1.5)
    one_way = dataclasses.replace(moved, prefetched_bytes=0)
    assert model.lower_bound_s(one_way) == pytest.approx(1.0)          # d2h alone
    busy = dataclasses.replace(moved, compute_s=3.0)
    assert model.lower_bound_s(busy) == pytest.approx(3.0)             # compute bound


def test_the_greedy_search_takes_the_move_that_adds_the_least_step_time(monkeypatch):
    """Two moves save the same bytes and either meets the budget: a memory-optimal plan for
    conv3 (2 ms more) and offloading conv1's output (5.4 ms more, its copies exposed). The
    greedy search must take the cheaper one, whatever order the moves come in."""
    import math
    from test_planner import conv_chain, flat_profile
    from minidnn.planner.search import Planner
    net = conv_chain()
    prof = flat_profile(net, 64, layer_s=1e-3, bw=1e9, ws=64 * 2**20)

    def planner(budget):
        return Planner(net, 64, prof, budget=budget, input_batches=0, recompute=False)
    probe = planner(None)
    start = probe.model.evaluate(frozenset(), probe.model.algos("fastest"))
    sid = probe.plan.storage_of("conv1").id
    moves = [("offload", sid), ("algo", "conv3")]
    offload, leaner = (probe._apply(start, [mv]) for mv in moves)
    assert offload.required_bytes == leaner.required_bytes < start.required_bytes
    assert leaner.step_time_s < offload.step_time_s
    p = planner(math.ceil(leaner.required_bytes / (1 - probe.reserve)) + 1)
    for order in (moves, moves[::-1]):
        monkeypatch.setattr(Planner, "_moves", lambda self, ev, everywhere, o=order: list(o))
        chosen = p.greedy()
        assert chosen.fits and chosen.step_time_s == pytest.approx(leaner.step_time_s)
        assert chosen.conv_algo["conv3"] != "fastest" and sid not in chosen.offload
