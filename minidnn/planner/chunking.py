"""Layer chunks in the plan: which runs of layers the planner weighs running in pieces, and
what the calls of a chunked step cost.

A layer chunk (minidnn/chunks.py) runs a chain of layers piece by piece over a pass's batch,
so that a call inside it works on a p-th of the batch: its input, output, gradients and
workspace shrink about p-fold (the maps kept for backward do not: every piece's are kept),
while the rest of the network keeps the pass's whole batch. The price: each piece call runs at a
p-th of the batch (less efficient on a GPU), and a join copies the pieces into one map of
the whole batch, forward and backward.

Which runs are weighed (`candidates`): the CHUNK_CHAINS chains of layers that hold the
largest maps (a chain: layers each reading the one before alone, as a chunk must be), each
from its first layer to each of its first CHUNK_ENDS layers that shrink their map (a
pooling, a strided convolution: there the maps that follow are smaller, and a chunk ending
there leaves the smaller maps whole; the chain's last layer where none does), in
CHUNK_PIECES pieces. The largest maps make the largest working sets, which set the least
budget; the planner keeps a chunk only where it lowers that (planner/split.py).

What the chunked step's calls cost (`chunk_profile`): piece j of layer L costs what L costs
at the piece's batch (the Profile at that batch: the analytic model's, or the measured one
scaled, planner/split.py); the join costs what a ReLU of the network costs per value moved
(both read one map and write one: the largest ReLU of the profile, its time scaled by the
join's values); every other layer
costs what it costs at the pass's batch.
"""
from __future__ import annotations

import dataclasses

from ..chunks import as_chunks, chains, chunk_network, describe
from ..layers.merge import BatchJoin
from .costs import LayerCost, Profile, numel

# Pieces a chunk is weighed in, and how many ends of a run (see the module docstring).
CHUNK_PIECES = (2, 4)
CHUNK_CHAINS = 2
CHUNK_ENDS = 2
# Chunked options planned in full per plan_split (planner/split.py): the others are only
# measured for their least budget. (A chunked step has a map per piece, so the planner
# plans it in bulk, as a very deep network: search.Planner.)
CHUNK_PLANS = 2
# A chunk is planned only where it lowers its count's least budget by this fraction at least.
CHUNK_GAIN = 0.05


def candidates(net, pass_batch: int) -> list[tuple]:
    """The chunk decisions to weigh for a pass of `pass_batch` images (see the module
    docstring): a list of `chunks` tuples (((first, last, pieces),), ...), each one chunk,
    pieces dividing the pass batch; the chains with the largest maps first."""
    shapes = net.shapes_at(pass_batch)

    def size(i):
        return numel(shapes[net.nodes[i].name])

    runs = sorted((run for run in chains(net) if len(run) > 1),
                  key=lambda run: -max(size(i) for i in run))[:CHUNK_CHAINS]
    found = []
    for run in runs:
        ends = [i for i in run if size(i) < numel(shapes[net.nodes[i].inputs[0]])]
        for end in ends[:CHUNK_ENDS] or [run[-1]]:
            for pieces in CHUNK_PIECES:
                if pass_batch % pieces == 0:
                    found.append(((net.nodes[run[0]].name, net.nodes[end].name, pieces),))
    return found


def chunk_profile(profile: Profile, net, chunks, piece_profile) -> Profile:
    """The Profile of `net` run with layer chunks `chunks`, named by the chunked network's
    nodes (see the module docstring).

    Args:
        profile: `net`'s Profile at the pass's batch.
        net: the network, unchunked.
        chunks: ((first node, last node, pieces), ...) as MemoryDecision.chunks.
        piece_profile: pieces -> the Profile of `net` at pass batch / pieces.

    Returns:
        A Profile whose layers are the chunked network's nodes ('conv1@0', ..., and the join
        named like the run's last node); its key_fields record the chunks (StepModel checks
        them).
    """
    chunks = as_chunks(chunks)
    graph = chunk_network(net, chunks)
    shapes = net.shapes_at(profile.batch)
    relus = [(numel(shapes[n.name]), profile.layer(n.name)) for n in net.nodes
             if n.layer.kind == "relu" and n.name in profile.layers]
    layers = dict(profile.layers)     # a run's layers stay listed: check_matches reads them
    for node in graph.nodes:
        if node.piece is not None:
            layers[node.name] = piece_profile(node.piece[1]).layer(node.layer.name)
        elif isinstance(node.layer, BatchJoin):
            layers[node.name] = _join_cost(numel(shapes[node.name]), relus,
                                           profile.layer(node.name))
        else:
            layers[node.name] = profile.layer(node.name)
    note = (f"layer chunks {describe(chunks)}: each piece costs its layer at the piece's "
            f"batch, each join what a ReLU costs per value moved")
    return dataclasses.replace(profile, layers=layers, notes=profile.notes + [note],
                               key_fields=dict(profile.key_fields, chunks=repr(chunks)))


def _join_cost(values: int, relus: list, last: LayerCost) -> LayerCost:
    """A join of `values` values: a ReLU's forward time per value (relus: [(values, its
    LayerCost)], the largest used), forward and backward alike; without a ReLU in the
    network, the run's last layer's forward (`last`)."""
    if relus:
        count, relu = max(relus, key=lambda r: r[0])
        seconds = relu.time("forward") * values / count
        host = relu.host("forward")
    else:
        seconds, host = last.time("forward"), last.host("forward")
    return LayerCost(forward_s={"fastest": seconds}, backward_s={"fastest": seconds},
                     host_s={"forward": host, "backward": host})
