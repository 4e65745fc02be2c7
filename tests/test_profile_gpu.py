"""The profiler's clock on the GPU (planner/profile.py): the timed calls captured as a CUDA
graph and replayed, as a replayed step runs them; where they cannot be captured, a stream held
busy while the host issues them (kernels/cuda_hold.py), so that a call the host issues more
slowly than the device runs it is timed at the device's rate. Skipped without a CUDA GPU."""
import time

import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda_hold = pytest.importorskip("minidnn.kernels.cuda_hold")

from minidnn.backend import select_device  # noqa: E402
from minidnn.planner.profile import _Clock  # noqa: E402


def test_a_hold_keeps_the_stream_busy_for_its_time_and_returns_at_once():
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cuda_hold.hold(0)              # the first call compiles the kernel
    cp.cuda.Device().synchronize()
    with stream:
        start.record()
        t0 = time.perf_counter()
        cuda_hold.hold(5e-3)
        issued = time.perf_counter() - t0
        end.record()
    end.synchronize()
    held = cp.cuda.get_elapsed_time(start, end) / 1e3
    assert 5e-3 <= held < 7e-3
    assert issued < 2e-3


def test_a_call_the_host_issues_slowly_is_timed_at_the_devices_rate():
    device = select_device("gpu")
    x = cp.ones(1024, cp.float32)

    def slow_to_issue():     # a tiny kernel behind 300 us of host work
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 300e-6:
            pass
        cp.multiply(x, 2, out=x)

    with device.compute:
        device_s, host_s = _Clock(device)(slow_to_issue, repeats=20)
    assert host_s >= 300e-6
    assert device_s < 60e-6      # back to back on the device; issued at the host's rate: 300 us


def test_a_call_the_device_runs_slowly_is_timed_at_its_own_length():
    device = select_device("gpu")
    with device.compute:
        device_s, host_s = _Clock(device)(lambda: cuda_hold.hold(2e-3), repeats=5)
    assert 2e-3 <= device_s < 2.3e-3
    assert host_s < 1e-3


def test_calls_of_many_short_kernels_are_timed_as_a_replayed_graph_runs_them():
    """Forty tiny kernels a call: replayed from a graph they take the device less time than
    launched one by one from the host (the step model's calls run replayed)."""
    device = select_device("gpu")
    x = cp.ones(256, cp.float32)

    def many_kernels():
        for _ in range(40):
            cp.multiply(x, 1, out=x)

    clock = _Clock(device)
    with device.compute:
        many_kernels()
        replayed = clock._time_replayed(many_kernels, 10)
        launched, _ = clock._time_held(many_kernels, 10, 20e-3)
        timed, _ = clock(many_kernels, 10)
    assert replayed is not None
    assert replayed[0] < launched / 10
    assert timed < launched / 10


def test_a_call_that_cannot_be_captured_is_timed_launched_and_the_stream_stays_usable():
    """A call that reads a value back to the host cannot be captured: the clock times it
    launched, and the compute stream runs work afterwards as before."""
    device = select_device("gpu")
    x = cp.ones(1024, cp.float32)

    def reads_back():
        cp.multiply(x, 1, out=x)
        return float(x[0])

    clock = _Clock(device)
    with device.compute:
        assert clock._time_replayed(reads_back, 5) is None
        device_s, host_s = clock(reads_back, 5)
        y = cp.arange(8, dtype=cp.float32) * 2
    assert device_s > 0 and host_s > 0
    assert y.get().tolist() == [0, 2, 4, 6, 8, 10, 12, 14]


@pytest.mark.parametrize("layout, precision", [("nhwc", "bf16"), ("nhwc", "fp32"),
                                               ("nchw", "fp32")])
def test_the_plan_tables_a_profile_reads_are_those_of_the_problems_a_step_runs(layout,
                                                                             precision):
    """A convolution's workspace ladder comes from the cuDNN plan tables of the problems the
    step runs (planner/profile.py, _conv_tables): after a step, asking for every
    convolution's tables finds them all in the plan cache and builds no other problem (they
    were NCHW float32 problems whatever the maps)."""
    from minidnn import models
    from minidnn.kernels import cuda
    from minidnn.kernels.mapformat import MapFormat
    from minidnn.planner.profile import _conv_tables
    from test_fusion import _run
    cuda.clear_conv_cache()
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    _run(net, {"layout": layout, "precision": precision}, 1, False, 16, "bias_relu",
         device="gpu")
    entries = cuda.conv_cache_stats()["entries"]
    maps = MapFormat(layout, precision)
    convs = [n for n in net.nodes if n.layer.kind == "conv"]
    assert convs and entries >= 2 * len(convs)
    for node in convs:
        tables = _conv_tables(cuda, node.layer, node, maps)
        assert tables and all(any(t.time_ms == t.time_ms for t in table)
                              for table in tables.values())
    assert cuda.conv_cache_stats()["entries"] == entries


def test_a_bf16_product_is_timed_reading_a_shared_weight_copy_and_the_copies_once_apart():
    """A bf16 step makes each weight's bf16 copy once and its calls share it
    (kernels/cuda_weights.py): the profile times a product reading a copy made before, and
    the copies once, apart (Profile.weight_copy_s). A fully connected layer of 4 rows reads
    its bf16 weight once (128 MiB); making the copy reads 256 MiB and writes 128."""
    from minidnn import Network
    from minidnn.kernels.mapformat import MapFormat
    from minidnn.layers import Flatten, Linear
    from minidnn.planner.profile import measure_layers, measure_weight_copies
    net = Network((1024, 4, 4), num_classes=4096, name="wide_fc")
    net.add(Flatten(), name="flat")
    net.add(Linear(4096), name="fc")
    net.add_loss()
    device = select_device("gpu")
    costs = measure_layers(net, 4, device, progress=False, maps=MapFormat(precision="bf16"))
    copies_s = measure_weight_copies(net, device)
    assert copies_s > 384 * 2**20 / 5e12                    # no faster than HBM allows
    forward = costs["fc"].time("forward", "fastest")
    assert forward < 0.7 * copies_s, (forward, copies_s)   # no copy in the product's time


def test_a_small_copys_time_is_mostly_its_latency_and_a_large_ones_its_bytes():
    """Each pinned copy takes a fixed time on its stream beyond its bytes
    (profile.measure_copy_latency; the timeline adds it to every copy). A step of 64 passes
    of 4 images copies thousands of maps (GoogLeNet: 9088 each way, the median 100 KB, whose
    bytes take about as long as its latency)."""
    from minidnn.planner.profile import measure_bandwidth, measure_copy_latency
    device = select_device("gpu")
    d2h_bw, h2d_bw, _ = measure_bandwidth(device)
    d2h, h2d = measure_copy_latency(device, d2h_bw, h2d_bw)
    for latency, bw in ((d2h, d2h_bw), (h2d, h2d_bw)):
        assert 0.2e-6 < latency < 50e-6, (d2h, h2d)
        assert latency > 2 * 4096 / bw            # the bytes of 4 KB: far less
    # A copy of 1 MiB: its latency and its bytes, within a third of the sum.
    whole = measure_copy_latency(device, float("inf"), float("inf"), nbytes=2**20, repeats=32)
    for took, latency, bw in zip(whole, (d2h, h2d), (d2h_bw, h2d_bw)):
        assert took == pytest.approx(latency + 2**20 / bw, rel=0.33), (whole, d2h, h2d)


def test_an_events_crossing_between_engines_is_measured_in_microseconds():
    """profile.measure_sync_latency: a copy between two compute calls, each stream waiting
    for the other's event, takes the kernel, the copy and two crossings; a crossing is a few
    microseconds at most (Profile.sync_latency_s)."""
    from minidnn.planner.profile import (measure_bandwidth, measure_copy_latency,
                                         measure_sync_latency)
    device = select_device("gpu")
    d2h_bw, h2d_bw, _ = measure_bandwidth(device)
    d2h, h2d = measure_copy_latency(device, d2h_bw, h2d_bw)
    sync = measure_sync_latency(device, d2h_bw, h2d_bw, d2h, h2d)
    assert 0.0 <= sync < 30e-6, sync
    print(f"copy latency {d2h * 1e6:.2f} / {h2d * 1e6:.2f} us, sync {sync * 1e6:.2f} us")


def test_a_pass_of_many_different_calls_takes_a_gap_a_call_beyond_them_alone():
    """AlexNet's pass of 4 images: in sequence its calls take microseconds each more than
    each alone back to back (the H200: about 2 us); the pass is measured at the profile's
    batch where its buffers fit, and the network is left as it was."""
    from minidnn import models
    from minidnn.kernels.mapformat import MapFormat
    from minidnn.planner.profile import CALL_GAP_BYTES, measure_call_gap, pass_bytes
    device = select_device("gpu")
    net = models.build("alexnet")
    weights = [p.data for _, p in net.parameters()]
    maps = MapFormat("nhwc", "fp32")
    gap, batch = measure_call_gap(net, 4, device, maps)
    assert batch == 4 and pass_bytes(net, 4, maps) <= CALL_GAP_BYTES
    assert 0.2e-6 < gap < 20e-6
    assert all(p.data is w for (_, p), w in zip(net.parameters(), weights))
    assert pass_bytes(net, 256, maps) > CALL_GAP_BYTES
    gap, batch = measure_call_gap(net, 256, device, maps)   # halved until it fits
    assert 0 < batch < 256 and pass_bytes(net, batch, maps) <= CALL_GAP_BYTES < \
        pass_bytes(net, 2 * batch, maps)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_convolutions_bias_pass_is_timed_apart_no_faster_than_memory_allows(precision):
    """The pass adding a convolution's bias (LayerCost.bias_s), which a step whose ReLU adds
    the bias does not make, reads and writes the convolution's output: a part of its
    forward, no faster than HBM moves those bytes; a convolution without a bias has none."""
    from minidnn import Network
    from minidnn.kernels.mapformat import MapFormat
    from minidnn.layers import Conv2d, Flatten, Linear, ReLU
    from minidnn.planner.profile import measure_layers
    net = Network((128, 56, 56), num_classes=10, name="one_conv")
    net.add(Conv2d(128, 3, padding=1), name="conv")
    net.add(ReLU(), name="relu")
    net.add(Conv2d(8, 1, bias=False), name="narrow")
    net.add(Flatten(), name="flat")
    net.add(Linear(10), name="fc")
    net.add_loss()
    maps = MapFormat("nhwc", precision)
    costs = measure_layers(net, 32, select_device("gpu"), progress=False, maps=maps)
    moved = 2 * 32 * 128 * 56 * 56 * (4 if precision == "fp32" else 2)
    assert moved / 5e12 < costs["conv"].bias_s < costs["conv"].time("forward")
    assert costs["narrow"].bias_s == 0.0
