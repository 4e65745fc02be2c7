"""Feature-map formats (kernels/mapformat.py): channels-last views, memory order, the layout
each device takes, and the liveness plan's rule for a Flatten of a channels-last map."""
import numpy as np
import pytest

from minidnn import Network
from minidnn.backend import Device
from minidnn.errors import ConfigError
from minidnn.kernels import mapformat
from minidnn.kernels.mapformat import MapFormat
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.memory.plan import LivenessPlan


def test_nhwc_view_puts_channels_last_in_memory():
    shape = (2, 3, 4, 5)
    flat = np.zeros(np.prod(shape) * 4 + 16, dtype=np.uint8)      # longer than needed
    a = mapformat.shaped(flat, shape, np.float32, "nhwc")
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    a[...] = values
    assert a.shape == shape and not a.flags.c_contiguous
    assert mapformat.layout_of(a) == "nhwc" and mapformat.is_channels_last(a)
    memory = flat[:values.nbytes].view(np.float32)
    np.testing.assert_array_equal(memory, values.transpose(0, 2, 3, 1).reshape(-1))
    np.testing.assert_array_equal(mapformat.in_memory_order(a), memory)
    np.testing.assert_array_equal(mapformat.arrange(values, "nhwc").reshape(-1), memory)
    # Vectors and other ranks keep C order in either layout.
    v = mapformat.shaped(flat, (6, 7), np.float32, "nhwc")
    assert v.flags.c_contiguous and mapformat.layout_of(v) == "nchw"


def test_layouts_that_coincide_and_ones_that_clash():
    nchw = mapformat.empty(np, (2, 3, 4, 5), np.float32, "nchw")
    nhwc = mapformat.empty(np, (2, 3, 4, 5), np.float32, "nhwc")
    both = mapformat.empty(np, (2, 3, 1, 1), np.float32, "nhwc")    # H = W = 1: one order
    assert mapformat.common_layout("t", [nhwc, nhwc]) == "nhwc"
    assert mapformat.common_layout("t", [both, both]) == "nchw"
    with pytest.raises(ValueError, match="mix NCHW and NHWC"):
        mapformat.common_layout("t", [nchw, nhwc])
    with pytest.raises(ValueError, match="neither"):
        mapformat.layout_of(nchw[:, ::2])


def test_layout_per_device():
    cpu = Device("cpu")
    assert mapformat.map_layout(cpu, None) == "nchw"
    assert mapformat.map_layout(cpu, "nhwc") == "nhwc"
    with pytest.raises(ConfigError, match="layout must be one of"):
        MapFormat("chwn")
    with pytest.raises(ConfigError, match="layout must be one of"):
        mapformat.map_layout(cpu, "NHWC")


def _train(layout, policy="none", precision="fp32", decision=None, steps=2):
    """State dict and memory stats after a few CPU steps of the branchy test network."""
    from minidnn import SGD
    from minidnn.decide import build_executor
    from minidnn.planner.dyn import FixedDecision
    from test_manager import dag_net
    rng = np.random.default_rng(0)
    net = dag_net()
    with build_executor(net, 4, device="cpu", seed=0, layout=layout, precision=precision,
                        policy=FixedDecision(decision) if decision else policy) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 5, 4), opt)
        weight = ex.net.node("conv1").layer.params["weight"].data
        assert mapformat.layout_of(weight) == layout or weight.flags.c_contiguous
        stats = ex.memory_stats()
    return net.state_dict(), stats


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_channels_last_steps_match_nchw_steps(precision):
    """Channels-last maps (and conv weights) through the whole step: the manager's views,
    the branch's gradient sum, dropout, Flatten's reordering, offload and recomputation all
    give the parameters of NCHW maps, within summation-order rounding; the state dict keeps
    PyTorch's layouts."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    from minidnn.memory.policy import MemoryDecision, recompute_candidates
    from test_manager import dag_net
    want, want_stats = _train("nchw", precision=precision)
    plan = LivenessPlan(dag_net(), 4, maps=MapFormat("nhwc", precision))
    recompute = frozenset([s.id for s in recompute_candidates(plan)])
    for kw in (dict(), dict(policy="all"), dict(decision=MemoryDecision(recompute=recompute))):
        got, stats = _train("nhwc", precision=precision, **kw)
        for name, w in want.items():
            assert got[name].shape == w.shape and got[name].flags.c_contiguous
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{kw} {name}")
        if not kw:
            assert stats["peak_feature_map_bytes"] == want_stats["peak_feature_map_bytes"]


def _classifier_net():
    net = Network((3, 8, 8), num_classes=4, name="cls")
    net.add(Conv2d(4, 3, padding=1), name="conv")
    net.add(ReLU(), name="relu")
    net.add(MaxPool2d(2), name="pool")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add_loss()
    return net


def test_flatten_shares_its_input_as_a_view_or_by_the_in_place_rules():
    """NCHW: Flatten is a view of its input, always shared. NHWC: it reorders the bytes, so
    it shares only as an in-place layer may (here it may: the pool's output has no other
    reader); either way the storages are sized by the tensors."""
    net = _classifier_net()
    flat = [n.name for n in net.nodes].index("flat")
    for layout in ("nchw", "nhwc"):
        plan = LivenessPlan(net, 2, maps=MapFormat(layout))
        assert plan.maps.layout == layout
        assert plan.inplace[flat]
        assert plan.tensors["flat"].storage == plan.tensors["pool"].storage


def test_flatten_of_a_map_read_elsewhere_gets_its_own_buffer_in_nhwc():
    net = Network((3, 8, 8), num_classes=4, name="two_readers")
    net.add(Conv2d(4, 3, padding=1), name="conv")
    net.add(MaxPool2d(2), name="pool")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add(Flatten(), inputs="pool", name="flat2")
    net.add(Linear(4), name="fc2")
    from minidnn.layers import Add
    net.add(Add(), inputs=["fc", "fc2"], name="sum")
    net.add_loss()
    nchw = LivenessPlan(net, 2, maps=MapFormat("nchw"))
    nhwc = LivenessPlan(net, 2, maps=MapFormat("nhwc"))
    assert nchw.tensors["flat"].storage == nchw.tensors["pool"].storage
    assert nhwc.tensors["flat"].storage != nhwc.tensors["pool"].storage
    assert nhwc.tensors["flat2"].storage != nhwc.tensors["pool"].storage


def test_flatten_in_place_reorders_a_channels_last_map_on_the_cpu_arrays():
    """The layer's own logic, with NumPy arrays laid out channels last: written over its
    input, the output is the NCHW-order flattening, and backward puts the gradient back."""
    from minidnn.layers import StepContext
    layer = Flatten()
    layer.setup([(2, 3, 4, 5)])
    values = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    flat = np.zeros(480, dtype=np.uint8)
    x = mapformat.shaped(flat, values.shape, np.float32, "nhwc")
    x[...] = values
    y = mapformat.shaped(flat, (2, 60), np.float32, "nhwc")
    ctx = StepContext(np)
    layer.forward([x], y, {}, ctx)
    np.testing.assert_array_equal(y, values.reshape(2, 60))
    gx = mapformat.shaped(flat, values.shape, np.float32, "nhwc")
    layer.backward([None], None, y, [gx], {}, ctx)
    np.testing.assert_array_equal(gx, values)


def test_pointwise_views_are_flat_in_memory_order_only_where_that_is_the_same_operation():
    from minidnn.kernels.mapformat import arrange, pointwise_views
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    na, nb = (arrange(v, "nhwc").transpose(0, 3, 1, 2) for v in (a, b))
    fa, fb = pointwise_views(na, nb)
    assert fa.ndim == 1 and np.shares_memory(fa, na) and np.shares_memory(fb, nb)
    fa += fb                                   # through the views: the arrays themselves
    np.testing.assert_array_equal(na, a + b)
    mixed = pointwise_views(na, b)             # NHWC beside NCHW: left as they are
    assert mixed[0] is na and mixed[1] is b
    strided = a[:, :, ::2]
    assert pointwise_views(strided, strided)[0] is strided
    assert pointwise_views(a, b)[0] is a       # NCHW: already in memory order


def test_a_copy_of_channels_last_rows_goes_through_flat_views(monkeypatch):
    """copy_values of a layer chunk's piece into its rows of the whole channels-last batch
    (BatchJoin) copies flat views in memory order, the bits of the strided copy; maps in two
    layouts are copied through their strides."""
    import ml_dtypes
    from minidnn.kernels.mapformat import arrange, copy_values
    seen = []
    real = mapformat.pointwise_views
    monkeypatch.setattr(mapformat, "pointwise_views",
                        lambda *a: seen.append(real(*a)) or seen[-1])
    rng = np.random.default_rng(0)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        values = rng.standard_normal((6, 3, 4, 5)).astype(dtype)
        whole = arrange(np.zeros_like(values), "nhwc").transpose(0, 3, 1, 2)
        pieces = [arrange(values[j:j + 2], "nhwc").transpose(0, 3, 1, 2) for j in (0, 2, 4)]
        for j, piece in zip((0, 2, 4), pieces):
            copy_values(whole[j:j + 2], piece)
        assert all(dst.ndim == 1 and src.ndim == 1 for dst, src in seen[-3:])
        np.testing.assert_array_equal(np.ascontiguousarray(whole).view(np.uint8),
                                      values.view(np.uint8))
        plain = np.zeros_like(values)
        copy_values(plain[:2], pieces[0])                    # NCHW from NHWC: strided
        assert seen[-1][0].ndim == 4
        np.testing.assert_array_equal(plain[:2], values[:2])


def test_is_channels_last_by_strides_agrees_with_the_array_module():
    """The stride rule against NumPy's own contiguity of the (N, H, W, C) transpose, over
    views of every kind: sliced, transposed, length-1 and empty axes."""
    from minidnn.kernels.mapformat import is_channels_last
    rng = np.random.default_rng(0)
    for _ in range(400):
        shape = tuple(int(d) for d in rng.integers(0, 4, 4))
        base = np.zeros(tuple(d + 2 for d in shape), np.float32)
        order = rng.permutation(4)
        a = base.transpose(order)[tuple(slice(0, d, int(rng.integers(1, 3))) for d in shape)]
        for candidate in (a, np.ascontiguousarray(a),
                          np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)):
            assert is_channels_last(candidate) == \
                candidate.transpose(0, 2, 3, 1).flags.c_contiguous, (candidate.shape,
                                                                      candidate.strides)
    assert not is_channels_last(np.zeros((2, 3, 4)))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 1, 1), (4, 64, 9, 9), (3, 8)])
def test_layout_strides_are_those_of_an_array_laid_out_so(shape, layout):
    from minidnn.kernels.mapformat import empty, layout_strides
    a = empty(np, shape, np.float32, layout)
    assert tuple(s * 4 for s in layout_strides(shape, layout)) == a.strides
