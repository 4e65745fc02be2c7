"""Layer chunks: a run of consecutive layers executed piece by piece over the batch.

A chunk (first node, last node, pieces p) runs the layers first .. last p times, each time
on b = batch / p rows of the batch, forward and backward, while the rest of the network runs
the whole batch (moDNN's layer splitting; docs/splitting-the-batch.md section 6). Only one
piece's maps need to be on the device at a time, so when the memory manager offloads or
recomputes them, the run's working set at the peak shrinks to about a p-th.

It is a rewrite of the graph, not of the executor: `chunk_network` returns a new Network
whose nodes are

    ... nodes before the run (unchanged) ...
    first@0, ..., last@0            piece 0: Node.piece = (0, p)
    ...
    first@{p-1}, ..., last@{p-1}    piece p-1
    last                            BatchJoin of last@0 .. last@{p-1}: the whole batch again
    ... nodes after the run (unchanged: they read `last` as before) ...

The piece nodes share the original layers (the same objects: parameters, and the settings
the layers look up by their own name, conv plans or ReLU bit masks, are the run's), so the
liveness plan, the schedule, the memory manager and the static layout see ordinary nodes
and storages, one per (map, piece). Two things only they learn about: `first@j` reads rows
j*b .. (j+1)*b of the run's input (Network.input_rows; the plan's `rows`), and in backward
writes its input gradient straight into those rows of the whole gradient; and the executor
gives each piece node its rows' batch offset (dropout draws the whole batch's masks) and
adds the parameter gradients of every piece after the first into p.grad.

What changes bits against the unchunked step: only the order of the weight-gradient sums
(a weight's gradient is the sum of the p pieces' sums); forward outputs, the loss, input
gradients and dropout masks are the same bits.
"""
from __future__ import annotations

from .errors import ConfigError
from .layers.merge import BatchJoin
from .network import LABEL, Network, Node


def chunk_network(net: Network, chunks) -> Network:
    """`net` with each run of `chunks` executed in pieces (see above).

    Args:
        net: the network; it is not changed (its layers are shared, not copied).
        chunks: ((first node name, last node name, pieces), ...): runs of consecutive
            nodes, each node after `first` reading the one before it alone, `first` reading
            one tensor, no node outside the run reading a node of it but `last`, no loss
            and no layer with whole-batch statistics (BatchNorm) in it, pieces >= 2, runs
            not overlapping.

    Returns:
        A new Network (same input shape, classes, name and dtype) whose nodes are described
        above; shapes are not inferred yet.

    Raises ConfigError naming the run and what is wrong with it.
    """
    runs = sorted((_check_run(net, chunk) for chunk in chunks), key=lambda r: r[0])
    for (a0, a1, _), (b0, b1, _) in zip(runs, runs[1:]):
        if b0 <= a1:
            raise ConfigError(f"layer chunks {net.nodes[a0].name}..{net.nodes[a1].name} and "
                              f"{net.nodes[b0].name}..{net.nodes[b1].name} of network "
                              f"{net.name!r} overlap")
    out = Network(net.input_shape, num_classes=net.num_classes, name=net.name, dtype=net.dtype)
    starts = {r[0]: r for r in runs}
    k = 0
    while k < len(net.nodes):
        if k not in starts:
            out.add_node(net.nodes[k])
            k += 1
            continue
        start, stop, pieces = starts[k]
        run = net.nodes[start:stop + 1]
        for j in range(pieces):
            source = run[0].inputs[0]          # the run's input, whole; piece j reads its rows
            for node in run:
                out.add_node(Node(f"{node.name}@{j}", node.layer, [source], piece=(j, pieces)))
                source = f"{node.name}@{j}"
        last = run[-1].name
        # Named like the run's last node, so the nodes after the run read it unchanged.
        out.add_node(Node(last, BatchJoin(name=last), [f"{last}@{j}" for j in range(pieces)]))
        k = stop + 1
    return out


def as_chunks(chunks) -> tuple:
    """`chunks` as MemoryDecision.chunks holds them: a tuple of (first, last, pieces)
    tuples (a list of lists, from JSON or a caller, becomes one)."""
    return tuple(tuple(c) for c in chunks)


def describe(chunks) -> str:
    """'conv1_1..pool1 in 2 pieces' (and ', ...' for more chunks); '' for none."""
    return ", ".join(f"{first}..{last} in {pieces} pieces" for first, last, pieces in chunks)


def chains(net: Network) -> list[list[int]]:
    """The maximal runs of node indices of `net` that chunk_network accepts as one chunk
    (any sub-run of one is a chunk too), in node order."""
    consumers = net.consumers()
    out, run = [], None
    for i, node in enumerate(net.nodes):
        if _node_problem(node):
            run = None
        elif run is not None and not _link_problem(net.nodes[run[-1]], node, consumers):
            run.append(i)
        else:
            run = [i]
            out.append(run)
    return out


def _node_problem(node) -> str | None:
    """Why `node` cannot be a layer of a chunk (None: it can)."""
    if len(node.inputs) != 1 or node.inputs[0] == LABEL:
        return f"its first node must read one map, {node.name!r} reads {node.inputs}"
    if node.layer.kind == "loss":
        return f"the loss {node.name!r} cannot run in pieces"
    if node.layer.batch_statistics:
        return (f"{node.name!r} normalizes with the whole batch's statistics "
                f"({type(node.layer).__name__}); in pieces it would see smaller batches")
    if node.piece is not None:
        return f"{node.name!r} is already a piece of a layer chunk"
    return None


def _link_problem(before, node, consumers: dict) -> str | None:
    """Why `node` cannot follow `before` in a chunk (None: it can)."""
    if node.inputs != [before.name]:
        return f"not a chain: {node.name!r} reads {node.inputs}, not {before.name!r} alone"
    others = [c.name for c in consumers[before.name] if c is not node]
    if others:
        return (f"{before.name!r} is also read by {others}, outside the run (only the last "
                f"node's output may be)")
    return None


def _check_run(net: Network, chunk) -> tuple[int, int, int]:
    """(index of first, index of last, pieces) of one chunk of `net`; ConfigError when it
    cannot run in pieces."""
    if not isinstance(chunk, (tuple, list)) or len(chunk) != 3:
        raise ConfigError(f"a layer chunk is (first node, last node, pieces), got {chunk!r}")
    first, last, pieces = chunk
    if isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 2:
        raise ConfigError(f"layer chunk {first}..{last}: pieces must be an integer >= 2, "
                          f"got {pieces!r}")
    index = {node.name: i for i, node in enumerate(net.nodes)}
    for name in (first, last):
        if name not in index:
            raise ConfigError(f"layer chunk {first}..{last}: network {net.name!r} has no node "
                              f"{name!r}")
    start, stop = index[first], index[last]
    what = f"layer chunk {first}..{last} of network {net.name!r}"
    if stop < start:
        raise ConfigError(f"{what}: {last!r} comes before {first!r}")
    run = net.nodes[start:stop + 1]
    consumers = net.consumers()
    problems = [_link_problem(before, node, consumers) for before, node in zip(run, run[1:])]
    problems += [_node_problem(node) for node in run]
    problem = next((p for p in problems if p), None)
    if problem:
        raise ConfigError(f"{what}: {problem}")
    return start, stop, pieces
