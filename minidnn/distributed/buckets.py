"""Gradients grouped in buckets, each all-reduced as soon as backward has produced it.

Backward runs the layers in reverse order, so the last layers' gradients are final first.
The parameters are put in buckets in that order (about `bucket_bytes` each, as PyTorch's
DistributedDataParallel does). The buckets watch the executor's step (a StepObserver,
`Executor.add_observer`): after each layer's backward call, `layer_done(i)`. When every parameter of a bucket is final, its all-reduce starts (`reducer.start`:
on a communication stream on a GPU, on a worker thread on the CPU) and travels while
backward computes the earlier layers. `finish()`, called before the optimizer, starts any
bucket still waiting and waits for all of them.

A small first bucket gets the last layers' gradients moving early; the rest are larger, so
that few calls carry most of the bytes.
"""
from __future__ import annotations

import numpy as np

from ..memory.observer import StepObserver

#: Bytes per bucket (PyTorch DDP's default is 25 MiB) and of the first one (1 MiB, as DDP).
BUCKET_BYTES = 25 * 2**20
FIRST_BUCKET_BYTES = 1 * 2**20


class GradientBuckets(StepObserver):
    """Buckets of a network's parameter gradients (see the module docstring).

    net: the Network (its parameters must be on the device: `p.grad` set). reducer: has
    start(arrays, trace) and finish() (cpu_collective.CpuReducer, nccl.NcclReducer).
    tracer: a callable returning the trace.Tracer that records each bucket's all-reduce on
    the 'allreduce' track, or None (the executor's `lambda: ex.tracer`). passes: backward
    passes in a step (the executor's micro-batches). gathered: the node indices whose
    parameter gradients the step computes once more after its passes (the executor's
    gathered layers, minidnn/gathered.py): one more backward call each.

    After construction: `buckets`, a list of [(parameter name, Parameter)] in the order they
    are reduced. Watch a computing executor with it (`ex.add_observer(buckets)`), not a dry
    run: its backward calls start real all-reduces.
    """

    def __init__(self, net, reducer, bucket_bytes: int = BUCKET_BYTES,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES, tracer=None, passes: int = 1,
                 gathered=frozenset()):
        self.reducer = reducer
        # A step of k micro-batches runs every backward k times; a gradient is final only
        # after the last pass, so a bucket waits for k reports of each of its gradients (k + 1
        # for a gathered layer's, whose gradients its call after the passes writes).
        self.passes = int(passes)
        self.tracer = tracer or (lambda: None)
        self.buckets: list[list] = []
        self._expected: list[int] = []              # reports each bucket waits for
        self._of_node: dict[int, list[int]] = {}   # node index -> its buckets, once per param
        cap, size = first_bucket_bytes, 0
        for i in reversed(range(len(net.nodes))):
            node = net.nodes[i]
            for key, p in reversed(list(node.layer.params.items())):
                nbytes = int(np.prod(p.shape, dtype=np.int64)) * np.dtype(net.dtype).itemsize
                if not self.buckets or (size and size + nbytes > cap):
                    if self.buckets:
                        cap = bucket_bytes
                    self.buckets.append([])
                    self._expected.append(0)
                    size = 0
                self.buckets[-1].append((f"{node.name}.{key}", p))
                self._expected[-1] += self.passes + (1 if i in gathered else 0)
                size += nbytes
                self._of_node.setdefault(i, []).append(len(self.buckets) - 1)
        self._waiting: list[int] = []
        self.reset()

    def reset(self) -> None:
        """Every bucket waits for all its gradients again."""
        self._waiting = list(self._expected)

    def layer(self, phase: str, name: str, index: int, start, end) -> None:
        """The executor ran a layer call; a backward one may complete buckets."""
        if phase == "backward":
            self.layer_done(index)

    def layer_done(self, i: int) -> None:
        """Node i's backward has run: its parameters' gradients are final for this step."""
        for b in self._of_node.get(i, ()):
            self._waiting[b] -= 1
            if self._waiting[b] == 0:
                self._start(b)

    def _start(self, b: int) -> None:
        self._waiting[b] = -1   # started
        tracer = self.tracer()
        self.reducer.start([p.grad for _, p in self.buckets[b]],
                           (tracer, f"all-reduce bucket {b}") if tracer is not None else None)

    def finish(self) -> None:
        """Start any bucket not started (a layer whose backward did not report), then wait for
        all; ready for the next step."""
        for b, waiting in enumerate(self._waiting):
            if waiting >= 0:
                self._start(b)
        try:
            self.reducer.finish()
        finally:
            self.reset()
