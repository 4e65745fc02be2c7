"""Static layout: packing, waits on earlier occupants, and equivalence with dynamic blocks."""
import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.errors import fmt_bytes
from minidnn.memory.allocator import aligned
from minidnn.memory.layout import Interval, PlannedBlocks, StaticLayout, pack
from minidnn.decide import build_executor

from fakes import WaitingStream


def _random_intervals(rng, n=60):
    out = []
    for sid in range(n):
        start = int(rng.integers(0, 100))
        out.append(Interval(sid, 0, int(rng.integers(1, 5000)), start,
                            start + int(rng.integers(1, 30))))
    return out


def test_packed_intervals_never_share_bytes_while_both_alive():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ivs = _random_intervals(rng)
        size = pack(ivs)
        for a in ivs:
            assert a.offset % 256 == 0 and a.offset + aligned(a.nbytes) <= size
            for b in ivs:
                if a is b or not (a.start < b.end and b.start < a.end):
                    continue
                assert a.offset + aligned(a.nbytes) <= b.offset or \
                    b.offset + aligned(b.nbytes) <= a.offset, (a, b)


def test_predecessors_are_the_earlier_blocks_at_the_same_addresses():
    ivs = [Interval(0, 0, 1024, 0, 2), Interval(1, 0, 1024, 3, 5), Interval(2, 0, 512, 1, 4)]
    pack(ivs)
    by = {iv.sid: iv for iv in ivs}
    assert by[1].offset == by[0].offset          # reuses the first block's bytes
    assert by[1].predecessors == [(0, 0)]
    assert by[0].predecessors == [] and by[2].predecessors == []


class _Device:
    def __init__(self):
        self.compute, self.prefetch = WaitingStream(), WaitingStream()


class _FM:
    def __init__(self, sid, nbytes):
        self.sid, self.nbytes, self.device = sid, nbytes, None


def test_a_block_released_behind_a_copy_makes_its_next_occupant_wait():
    layout = StaticLayout([Interval(0, 0, 1024, 0, 1), Interval(1, 0, 1024, 2, 3),
                           Interval(2, 0, 1024, 4, 5)])
    blocks = PlannedBlocks(layout, np.zeros(layout.size, np.uint8), allocator=None)
    dev = _Device()
    blocks.begin_step(dev)
    a, b, c = _FM(0, 1024), _FM(1, 1024), _FM(2, 1024)
    a.device = blocks.acquire(a, "", dev.compute)
    offload_done = object()
    blocks.release(a, after=offload_done)        # an offload still reads it
    b.device = blocks.acquire(b, "", dev.compute)
    assert dev.compute.waited == [offload_done]
    blocks.release(b, after=None)                # compute-ordered: nothing to wait for
    c.device = blocks.acquire(c, "", dev.prefetch)
    assert dev.prefetch.waited == [offload_done] and len(dev.compute.waited) == 1
    assert np.shares_memory(a.device, c.device)


def _train(static, policy, steps=3):
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    ex = build_executor(net, 4, device="cpu", seed=1, policy=policy, static_layout=static)
    opt = SGD(net.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        ex.train_step(x, rng.integers(0, 5, 4), opt)
    return net.param_checksum(), ex


@pytest.mark.parametrize("policy", ["none", "all"])
def test_static_layout_gives_the_same_bits_as_dynamic_blocks(policy):
    static, ex = _train(True, policy)
    dynamic, _ = _train(False, policy)
    assert static == dynamic
    assert ex.memory_stats()["unplanned_blocks"] == 0


def test_vgg16_b256_feature_maps_under_vdnn_all_pack_without_waste():
    """The layout of VGG-16 at batch 256 under vDNN_all is as small as its live peak, and with
    parameters, gradients and momentum it leaves room under a 12 GiB budget."""
    net = models.build("vgg16", num_classes=1000)
    ex = build_executor(net, 256, device="cpu", policy="all", compute=False, static_layout=True)
    st = ex.simulate_step()
    assert st["layout_bytes"] <= 1.01 * st["layout_live_peak_bytes"]
    momentum = sum(int(np.prod(p.shape)) * 4 for _, p in net.parameters())
    assert st["peak_device_bytes"] + momentum < 12 * 2**30, fmt_bytes(st["peak_device_bytes"])


# ---- planned cuDNN workspaces ------------------------------------------------------------------
def test_a_workspace_block_lives_for_its_call_and_packs_over_dead_maps():
    """tiny_cnn's last conv runs when its first conv's output is dead: a workspace there takes
    those addresses, so the region grows by less than the workspace; one at the first conv,
    where the maps alive are few but will all be needed, is placed beside them."""
    from minidnn.memory.record import layout_for_step, record_intervals
    from minidnn.memory.plan import LivenessPlan
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    plan = LivenessPlan(net, 4)
    convs = [i for i, n in enumerate(plan.nodes) if n.layer.kind == "conv"]
    keep = (net.loss_node.name, net.output)
    bare = layout_for_step(plan, frozenset(), 1, keep)
    ws = 64 * 1024
    with_ws = layout_for_step(plan, frozenset(), 1, keep,
                              {(convs[-1], "backward"): ws, (convs[0], "forward"): ws})
    assert with_ws.workspace_bytes() == 2 * ws
    assert with_ws.size < bare.size + 2 * ws          # workspaces share addresses with maps
    intervals = record_intervals(plan, frozenset(), 1, keep, {(convs[-1], "backward"): ws})
    (block,) = [iv for iv in intervals if iv.sid == ("workspace", convs[-1], "backward")]
    assert block.end == block.start + 1 and block.nbytes == ws
    # Alive with it: exactly the blocks acquired before and released after it.
    alive = [iv for iv in intervals if iv.start < block.start < iv.end]
    assert alive and all(iv.sid != block.sid for iv in alive)


def _train_with_workspace(workspace: dict, steps=3):
    """tiny_cnn on the CPU in a budget (static layout), with planned workspace blocks;
    returns the checksum and the blocks each conv call saw in ctx.workspace."""
    from minidnn.memory.policy import MemoryDecision
    from minidnn.planner.dyn import FixedDecision
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    seen = {}
    for node in net.nodes:
        if node.layer.kind == "conv":
            layer = node.layer

            def spy(orig, name, phase):
                def call(*args):
                    ctx = args[-1]
                    seen[(name, phase)] = ctx.workspace
                    return orig(*args)
                return call
            layer.forward = spy(layer.forward, node.name, "forward")
            layer.backward = spy(layer.backward, node.name, "backward")
    ex = build_executor(net, 4, device="cpu", seed=1, memory_budget="64MiB",
                  policy=FixedDecision(MemoryDecision(workspace=workspace)))
    opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        ex.train_step(x, rng.integers(0, 5, 4), opt)
    return net.param_checksum(), seen, ex


def test_a_conv_call_gets_its_planned_workspace_block_from_the_region():
    planned = {("conv2", "backward"): 4096, ("conv1", "forward"): 1000}
    checksum, seen, ex = _train_with_workspace(planned)
    region = ex.layout
    for key, nbytes in planned.items():
        block = seen[key]
        assert block is not None and block.dtype == np.uint8 and block.nbytes == nbytes
        iv = region.intervals[(("workspace", ex.plan.nodes.index(ex.net.node(key[0])),
                                key[1]), 0)]
        assert iv.nbytes == nbytes
    assert seen[("conv1", "backward")] is None and seen[("conv2", "forward")] is None
    assert ex.memory_stats()["unplanned_blocks"] == 0
    plain, _, _ = _train_with_workspace({})
    assert checksum == plain      # the blocks change where workspace lives, not one bit


def test_a_workspace_for_an_unknown_call_is_named():
    from minidnn.errors import ConfigError
    with pytest.raises(ConfigError, match="workspace for 'conv9'"):
        _train_with_workspace({("conv9", "forward"): 1024}, steps=0)


def _pack_by_hand(rows, alignment=256):
    """The packing rule written out plainly: largest first (ties: earliest start), each at
    the lowest of 0 and the aligned ends of the placed blocks alive with it where it fits;
    predecessors: the blocks released before it starts that share an address with it."""
    need = [aligned(n) for _, _, n, _, _ in rows]
    offset = [None] * len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (-need[i], rows[i][3])):
        alive = [j for j in range(len(rows)) if offset[j] is not None
                 and rows[j][3] < rows[i][4] and rows[i][3] < rows[j][4]]
        ends = [(offset[j] + need[j] + alignment - 1) // alignment * alignment for j in alive]
        offset[i] = min(a for a in [0] + ends
                        if all(a + need[i] <= offset[j] or offset[j] + need[j] <= a
                               for j in alive))
    preds = [[j for j in range(len(rows)) if rows[j][4] <= rows[i][3]
              and offset[j] < offset[i] + need[i] and offset[i] < offset[j] + need[j]]
             for i in range(len(rows))]
    return offset, preds


def test_packing_is_the_plain_rule_exactly():
    rng = np.random.default_rng(7)
    for _ in range(40):
        rows = []
        for sid in range(int(rng.integers(1, 50))):
            start = int(rng.integers(0, 80))
            rows.append((sid, 0, int(rng.choice([rng.integers(1, 5000), 1024, 4096])), start,
                         start + int(rng.integers(1, 25))))
        ivs = [Interval(*r) for r in rows]
        size = pack(ivs)
        offset, preds = _pack_by_hand(rows)
        assert [iv.offset for iv in ivs] == offset
        assert size == max(o + aligned(r[2]) for o, r in zip(offset, rows))
        assert [iv.predecessor_index.tolist() for iv in ivs] == preds
        assert [iv.predecessors for iv in ivs] == [[(j, 0) for j in p] for p in preds]


def test_predecessors_among_candidates_are_the_predecessors_masked_to_them():
    """PlannedBlocks sifts only the blocks with an event due (Overlaps.among): the same
    positions, in the same order, as the full predecessor list masked to them."""
    rng = np.random.default_rng(11)
    for _ in range(30):
        ivs = _random_intervals(rng, n=int(rng.integers(1, 60)))
        layout = StaticLayout(ivs)
        for iv in ivs:
            mask = rng.random(len(ivs)) < 0.3
            want = [j for j in iv.predecessor_index.tolist() if mask[j]]
            assert layout.overlaps.among(iv.index, np.flatnonzero(mask).tolist()) == want
