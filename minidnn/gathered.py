"""A fully connected layer's parameter gradients once a step, over the rows of every pass.

A step split into k passes (micro-batches, executor.py) runs each layer's backward k times.
For a fully connected layer each of those calls would compute the weight gradient of its
pass's rows and add it to p.grad: the whole gradient read and written k times for a product
over a k-th of the batch. VGG-16's fc6 holds 392 MiB of float32 gradient; in 8 passes of 32
on an H200 its weight-gradient products took 0.24 ms each, 1.9 ms a step.

Gathered instead, each pass's backward of the layer computes its input gradient only and
copies the two arrays the weight gradient reads, its input x (rows, in) and its output
gradient gy (rows, out), into their rows of two buffers of the whole step's batch, held
through the step; after the last pass one call of the layer's backward over those buffers
writes the weight and bias gradients: the call an unsplit step makes. So the layer's
parameter gradients have the unsplit step's order of sums (one product over the batch; under
deterministic mode its fixed slices, layers/slices.py, as before), not the sum of k
products, and the same bits as the unsplit step's wherever the gathered rows are.

Like splitting the batch itself, this decides the order of a sum, not a fusion of passes:
it holds with `--no-fuse` too, so that fused and unfused steps of one split keep the same
bits. The decision (`gathered_layers`, made in decide.py, and by the step model for the
memory it counts) takes every fully connected layer of a split step whose two buffers are
smaller than its weight, but none in a layer chunk's pieces. The call after the passes is
one more backward call of the layer to the executor's observers, so data parallelism's
buckets send its gradients after it (distributed/buckets.py). An API caller may run a
decision without it (`dataclasses.replace(decision, gathered=frozenset())`).
"""
from __future__ import annotations

import math

from .memory.allocator import aligned


def gathered_layers(plan, micro_batches: int, spec) -> frozenset:
    """The names of the fully connected nodes of `plan` (a liveness plan of the step's
    network, at any batch) whose parameter gradients a step of `micro_batches` passes
    computes once, for a step of `spec` (its batch: a rank's): see the module doc."""
    if micro_batches <= 1:
        return frozenset()
    return frozenset(node.name for node in plan.nodes
                     if node.layer.kind == "linear" and node.piece is None
                     and _held(plan, node, spec.batch) < weight_bytes(node.layer))


def gathered_bytes(plan, names, rows: int) -> int:
    """Bytes the gathered nodes `names` of `plan` hold through a step of `rows` images."""
    return sum(_held(plan, plan.net.node(name), rows) for name in names)


def _held(plan, node, rows: int) -> int:
    return held_bytes(node.layer, rows, plan.maps.map_dtype(node.layer.dtype))


def weight_bytes(layer) -> int:
    """Bytes of a layer's weight (and so of its gradient)."""
    return math.prod(layer.params["weight"].shape) * layer.dtype.itemsize


def held_bytes(layer, rows: int, dtype) -> int:
    """Bytes of the two buffers a gathered layer holds through a step of `rows` images: its
    input (rows, in) and its output gradient (rows, out), in the maps' dtype, one aligned
    allocator block each."""
    itemsize = dtype.itemsize
    return aligned(rows * layer.in_features * itemsize) + \
        aligned(rows * layer.out_features * itemsize)
