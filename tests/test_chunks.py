"""Layer chunks: a run of layers executed piece by piece over the batch (minidnn/chunks.py),
on the CPU. Against the unchunked step: the same forward, loss, input gradient and dropout
masks bit for bit; weight gradients summed in another order (float64: within 1e-12)."""
from dataclasses import replace

import numpy as np
import pytest

from minidnn.chunks import chunk_network
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.kernels.mapformat import MapFormat
from minidnn.layers import Add, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU
from minidnn.layers.dropout import Dropout as DropoutLayer
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import (NO_DECISION, OffloadAll, offload_candidates,
                                   recompute_candidates)
from minidnn.network import Network

BATCH = 8


def make_net(kind: str, dtype=np.float64, image=8) -> Network:
    """'pool': conv/relu/pool chain; 'dropout': with a dropout inside; 'vgg': two convs and
    relus, then a pool; 'skip': a run whose input is also read after it (a residual add)."""
    net = Network((3, image, image), num_classes=5, name=kind, dtype=dtype)
    if kind == "pool":
        net.add(Conv2d(4, 3, padding=1), name="conv1")
        net.add(ReLU(), name="relu1")
        net.add(MaxPool2d(2), name="pool1")
    elif kind == "dropout":
        net.add(Conv2d(4, 3, padding=1), name="conv1")
        net.add(ReLU(), name="relu1")
        net.add(Dropout(0.5), name="drop1")
        net.add(MaxPool2d(2), name="pool1")
    elif kind == "vgg":
        net.add(Conv2d(4, 3, padding=1), name="conv1")
        net.add(ReLU(), name="relu1")
        net.add(Conv2d(6, 3, padding=1), name="conv2")
        net.add(ReLU(), name="relu2")
        net.add(MaxPool2d(2), name="pool1")
    elif kind == "skip":
        net.add(Conv2d(4, 3, padding=1), name="conv0")
        net.add(Conv2d(4, 3, padding=1), name="conv1")
        net.add(ReLU(), name="relu1")
        net.add(Add(), inputs=["relu1", "conv0"], name="join")
        net.add(MaxPool2d(2), name="pool1")
    else:
        raise ValueError(kind)
    net.add(Conv2d(6, 3, padding=1), name="conv9")
    net.add(ReLU(), name="relu9")
    net.add(Flatten(), name="flat")
    net.add(Linear(5), name="fc")
    net.add_loss()
    return net


RUNS = {"pool": (("conv1", "pool1", 4),), "dropout": (("conv1", "pool1", 2),),
        "vgg": (("conv1", "relu2", 4),), "skip": (("conv1", "relu1", 2),)}


def batch(dtype, n=BATCH, image=8):
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, 3, image, image)).astype(dtype), rng.integers(0, 5, n)


def step(kind, dtype=np.float64, chunks=(), micro_batches=1, memory="keep", layout="nchw",
         precision="fp32", **options):
    """One training step: {'loss', 'outputs' (None with micro-batches), 'grads', 'input'}.
    memory: 'keep' every map, 'offload' every candidate (vDNN_all), 'recompute' every
    candidate, of the plan the executor runs. layout, precision: of the maps."""
    net = make_net(kind, dtype)
    net.init_params(0)
    decision = replace(NO_DECISION, chunks=chunks, micro_batches=micro_batches,
                       layout=layout, precision=precision)
    plan = None
    if memory != "keep":
        graph = chunk_network(net, chunks) if chunks else net
        plan = LivenessPlan(graph, BATCH // micro_batches, input_grad=True,
                            maps=MapFormat(layout, precision))
        if memory == "offload":
            decision = replace(decision, offload=OffloadAll().decide(plan).offload)
        else:
            decision = replace(decision, recompute=frozenset(
                s.id for s in recompute_candidates(plan)))
    x, y = batch(dtype)
    # (the executor makes the same liveness plan, whose storage ids the decision names)
    with Executor(net, BATCH, device="cpu", seed=3, decision=decision, input_grad=True,
                  **options) as ex:
        if micro_batches == 1:
            loss = ex.forward(x, y, keep_outputs=True)
            outputs = ex.outputs()
            ex.backward()
        else:
            loss, outputs = ex.accumulate_gradients(x, y), None
        return {"loss": np.asarray(loss).copy(), "outputs": outputs, "grads": ex.gradients(),
                "input": ex.input_gradient(), "stats": ex.memory_stats()}


def assert_same_bits(a, b, what=("loss", "outputs", "grads", "input")):
    for key in what:
        if key == "grads":
            assert a["grads"].keys() == b["grads"].keys()
            for name in a["grads"]:
                np.testing.assert_array_equal(a["grads"][name], b["grads"][name], err_msg=name)
        elif a[key] is not None or b[key] is not None:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("kind", ["pool", "dropout", "vgg", "skip"])
def test_a_chunked_step_matches_the_unchunked_one_in_float64(kind):
    whole = step(kind)
    chunked = step(kind, chunks=RUNS[kind])
    np.testing.assert_allclose(chunked["loss"], whole["loss"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(chunked["outputs"], whole["outputs"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(chunked["input"], whole["input"], rtol=0, atol=1e-12)
    assert chunked["grads"].keys() == whole["grads"].keys()
    for name, g in whole["grads"].items():
        np.testing.assert_allclose(chunked["grads"][name], g, rtol=0, atol=1e-12, err_msg=name)
    assert np.abs(whole["input"]).max() > 0     # the gradients compared are not all zero


@pytest.mark.parametrize("kind", ["pool", "dropout", "vgg", "skip"])
def test_float32_forward_loss_and_input_gradient_are_the_same_bits(kind):
    whole = step(kind, np.float32)
    chunked = step(kind, np.float32, chunks=RUNS[kind])
    assert_same_bits(chunked, whole, ("loss", "outputs", "input"))
    # only the order of the weight-gradient sums differs
    for name, g in whole["grads"].items():
        np.testing.assert_allclose(chunked["grads"][name], g, rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("layout, precision", [("nhwc", "fp32"), ("nchw", "bf16"),
                                               ("nhwc", "bf16")])
@pytest.mark.parametrize("kind", ["vgg", "skip", "dropout"])
def test_channels_last_and_bf16_maps(kind, layout, precision):
    """Row views of channels-last maps, and pieces widened to float32 and rounded: the same
    bits as the unchunked step but for the weight gradients, recomputed or not."""
    fmt = dict(layout=layout, precision=precision)
    whole = step(kind, np.float32, **fmt)
    chunked = step(kind, np.float32, chunks=RUNS[kind], **fmt)
    assert_same_bits(chunked, whole, ("loss", "outputs", "input"))
    assert_same_bits(step(kind, np.float32, chunks=RUNS[kind], memory="recompute", **fmt),
                     chunked)


def test_a_chunked_step_repeats_bit_for_bit():
    assert_same_bits(step("vgg", np.float32, chunks=RUNS["vgg"]),
                     step("vgg", np.float32, chunks=RUNS["vgg"]))


@pytest.mark.parametrize("memory", ["offload", "recompute"])
@pytest.mark.parametrize("kind", ["vgg", "dropout"])
def test_offload_and_recompute_of_piece_maps_change_no_bit(kind, memory):
    alone = step(kind, np.float32, chunks=RUNS[kind])
    moved = step(kind, np.float32, chunks=RUNS[kind], memory=memory)
    assert moved["stats"][f"{memory}_storages"] > 0
    assert_same_bits(moved, alone)


def test_piece_maps_are_recomputed_and_offloaded():
    """The decisions of the test above do move piece maps, not only whole-batch ones."""
    graph = chunk_network(make_net("vgg"), RUNS["vgg"])
    plan = LivenessPlan(graph, BATCH)
    pieces = {i for i, node in enumerate(plan.nodes) if node.piece is not None}
    assert any(s.producer in pieces for s in recompute_candidates(plan))
    assert any(s.producer in pieces for s in offload_candidates(plan))


def test_a_static_layout_changes_no_bit():
    alone = step("vgg", np.float32, chunks=RUNS["vgg"])
    planned = step("vgg", np.float32, chunks=RUNS["vgg"], memory="offload", static_layout=True)
    assert planned["stats"]["layout_bytes"] > 0
    assert_same_bits(planned, alone)


@pytest.mark.parametrize("kind", ["vgg", "dropout"])
def test_chunks_with_micro_batches(kind):
    chunks = ((RUNS[kind][0][0], RUNS[kind][0][1], 2),)
    whole = step(kind)
    both = step(kind, chunks=chunks, micro_batches=2)
    np.testing.assert_allclose(both["loss"], whole["loss"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(both["input"], whole["input"], rtol=0, atol=1e-12)
    for name, g in whole["grads"].items():
        np.testing.assert_allclose(both["grads"][name], g, rtol=0, atol=1e-12, err_msg=name)
    # in float32: the same bits as micro-batches alone, but for the weight gradients
    split = step(kind, np.float32, micro_batches=2)
    both32 = step(kind, np.float32, chunks=chunks, micro_batches=2)
    assert_same_bits(both32, split, ("loss", "input"))
    # offload and recompute on top change no bit
    for memory in ("offload", "recompute"):
        assert_same_bits(step(kind, np.float32, chunks=chunks, micro_batches=2, memory=memory),
                         both32)


def test_dropout_masks_are_those_of_the_unchunked_step(monkeypatch):
    masks = []
    forward = DropoutLayer.forward

    def record(self, xs, y, aux, ctx):
        forward(self, xs, y, aux, ctx)
        masks.append((ctx.batch_offset, aux["mask"].copy()))

    monkeypatch.setattr(DropoutLayer, "forward", record)
    step("dropout", np.float32)
    (offset, whole), = masks
    masks.clear()
    step("dropout", np.float32, chunks=(("conv1", "pool1", 4),))
    assert [o for o, _ in masks] == [0, 2, 4, 6]
    np.testing.assert_array_equal(np.concatenate([m for _, m in masks]), whole)
    assert 0 < whole.mean() < 1


def test_pieces_write_their_rows_of_the_input_gradient_without_a_sum(monkeypatch):
    """A chain's pieces share out the rows of the run input's gradient: no temporary, no
    add (the manager's add is called only for a second whole reader, as in 'skip')."""
    net = make_net("vgg")
    plan = LivenessPlan(chunk_network(net, RUNS["vgg"]), BATCH, input_grad=True)
    firsts = [i for i, node in enumerate(plan.nodes) if plan.rows[i] is not None]
    assert [plan.nodes[i].name for i in firsts] == [f"conv1@{j}" for j in range(4)]
    assert [plan.rows[i] for i in firsts] == [slice(2 * j, 2 * j + 2) for j in range(4)]
    assert plan.tensors["grad:data"].shape == (BATCH, 3, 8, 8)
    assert not any(plan.inplace[i] or plan.grad_over_input.get(i) or plan.grad_alias.get(i)
                   for i in firsts)
    adds = []
    net.init_params(0)
    x, y = batch(np.float64)
    with Executor(net, BATCH, device="cpu", input_grad=True,
                  decision=replace(NO_DECISION, chunks=RUNS["vgg"])) as ex:
        monkeypatch.setattr(ex.manager, "add", lambda *a: adds.append(a))
        ex.forward(x, y)
        ex.backward()
    assert adds == []


def test_evaluation_runs_the_pieces_too():
    net = make_net("vgg", np.float32)
    net.init_params(0)
    x, y = batch(np.float32)
    results = []
    for chunks in ((), RUNS["vgg"]):
        with Executor(net, BATCH, device="cpu",
                      decision=replace(NO_DECISION, chunks=chunks)) as ex:
            results.append(ex.evaluate(x, y))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_chunking_lowers_the_peak_of_a_step_whose_piece_maps_are_recomputed():
    """A big run in 8 pieces, its piece maps recomputed: the step's peak of feature maps is
    far below the unchunked step's, whether that one keeps or recomputes its maps. (The run
    ends in a pool: the pieces' last maps are all alive when they are joined.)"""
    n, image = 32, 32
    net = make_net("vgg", np.float32, image=image)
    chunks = (("conv1", "pool1", 8),)

    def peak(chunks, recompute):
        graph = chunk_network(net, chunks) if chunks else net
        plan = LivenessPlan(graph, n)
        decision = replace(NO_DECISION, chunks=chunks, recompute=frozenset(
            s.id for s in recompute_candidates(plan)) if recompute else frozenset())
        with Executor(net, n, device="cpu", compute=False, decision=decision) as ex:
            return ex.simulate_step()["peak_feature_map_bytes"]

    whole, whole_recomputed = peak((), False), peak((), True)
    chunked = peak(chunks, True)
    assert chunked < 0.5 * min(whole, whole_recomputed)


def test_the_chunked_network_shares_the_layers_and_lists_each_parameter_once():
    net = make_net("vgg")
    graph = chunk_network(net, RUNS["vgg"])
    graph.infer_shapes(BATCH)
    assert [n for n, _ in graph.parameters()] == [n for n, _ in net.parameters()]
    assert all(a is b for (_, a), (_, b) in zip(graph.parameters(), net.parameters()))
    assert graph.node("conv1@3").layer is net.node("conv1").layer
    assert graph.node("conv1@3").piece == (3, 4)
    assert type(graph.node("relu2").layer).__name__ == "BatchJoin"
    assert graph.node("relu2").inputs == [f"relu2@{j}" for j in range(4)]
    assert graph.shapes["conv1@0"] == (BATCH // 4, 4, 8, 8)
    assert graph.shapes["relu2"] == (BATCH, 6, 8, 8)
    assert net.node("conv1").layer.name == "conv1" and net.node("conv1").layer.index == 0
    assert [node.name for node in net.nodes][:4] == ["conv1", "relu1", "conv2", "relu2"]


# ---- what cannot be chunked ----------------------------------------------------------------
def bn_net():
    net = Network((3, 8, 8), num_classes=5, name="bn")
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(BatchNorm2d(), name="bn1")
    net.add(ReLU(), name="relu1")
    net.add(Flatten(), name="flat")
    net.add(Linear(5), name="fc")
    net.add_loss()
    return net


@pytest.mark.parametrize("net, chunks, message", [
    (lambda: make_net("skip"), (("conv0", "relu1", 2),), "also read by"),
    (lambda: make_net("skip"), (("relu1", "join", 2),), "not a chain"),
    (lambda: make_net("skip"), (("join", "pool1", 2),), "its first node must read one map"),
    (bn_net, (("conv1", "relu1", 2),), "whole batch's statistics"),
    (lambda: make_net("vgg"), (("conv1", "relu1", 2), ("relu1", "pool1", 2)), "overlap"),
    (lambda: make_net("vgg"), (("conv1", "nope", 2),), "has no node 'nope'"),
    (lambda: make_net("vgg"), (("relu2", "conv1", 2),), "comes before"),
    (lambda: make_net("vgg"), (("conv1", "relu1", 1),), "pieces must be an integer >= 2"),
    (lambda: make_net("vgg"), (("fc", "loss", 2),), "not a chain"),
    (lambda: make_net("vgg"), (("conv1", "relu1"),), "(first node, last node, pieces)"),
])
def test_runs_that_cannot_be_chunked(net, chunks, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chunk_network(net(), chunks)


def test_pieces_must_divide_the_pass_batch():
    net = make_net("vgg")
    with pytest.raises(ConfigError, match="3 pieces must divide the pass batch 8"):
        Executor(net, BATCH, device="cpu", decision=replace(NO_DECISION,
                                                            chunks=(("conv1", "relu2", 3),)))
    with pytest.raises(ConfigError, match="8 pieces must divide the pass batch 4"):
        Executor(net, BATCH, device="cpu", decision=replace(
            NO_DECISION, micro_batches=2, chunks=(("conv1", "relu2", 8),)))
