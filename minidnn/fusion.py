"""Fusing a convolution's bias into the ReLU after it: one pass over the map instead of two.

A convolution with a bias writes conv(x, w), then adds the bias in a second pass over its
output; the ReLU after it reads that output once more. When the ReLU is the output's only
reader and overwrites it in place, the bias add can move into the ReLU's own pass,
y = max(conv(x, w) + b, 0): the same float additions in the same order, so the same bits
(on the H200, VGG-16 b256 TF32 spent 6.5 ms of a 132 ms step in the separate bias adds).

What may move: the convolution's output is read by that ReLU alone (not the network's output,
no second reader) and the ReLU runs in place on it (memory/plan.LivenessPlan.inplace), so no
one ever sees the map without its bias; recomputing the ReLU recomputes the convolution first,
with the same deferral. Not under bf16 maps: there the convolution's output is rounded to
bf16 before the ReLU would add the bias, which would round twice.

The decision is MemoryDecision.bias_relu ({ReLU node name: convolution node name}); the
executor hands the layers their parts of it through StepContext (bias_deferred, relu_bias).
"""
from __future__ import annotations

from .memory.plan import LivenessPlan


def bias_relu_pairs(plan: LivenessPlan) -> dict:
    """{ReLU node name: convolution node name} of every ReLU that may add the bias of the
    convolution it reads (the conditions above), for a step planned as `plan`."""
    if plan.maps.precision != "fp32":
        return {}
    net = plan.net
    readers = net.consumers()
    producers = {n.name: n for n in plan.nodes}
    pairs = {}
    for i, node in enumerate(plan.nodes):
        if node.layer.kind != "relu" or len(node.inputs) != 1 or not plan.inplace.get(i):
            continue
        src = node.inputs[0]
        producer = producers.get(src)          # None: the network's input
        if producer is None or src == net.output:
            continue
        conv = producer.layer
        if conv.kind == "conv" and conv.bias and [n.name for n in readers[src]] == [node.name]:
            pairs[node.name] = src
    return pairs
