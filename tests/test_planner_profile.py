"""The profiling pass on the CPU (the code path the GPU runs) and its disk cache."""
import json

import numpy as np
import pytest

from minidnn import models
from minidnn.backend import Device
from minidnn.errors import ConfigError
from minidnn.planner import profile as profiling
from minidnn.planner import costs
from minidnn.planner.costs import Profile
from minidnn.planner.gpus import analytic_profile


@pytest.fixture
def net():
    n = models.build("tiny_cnn", num_classes=10, image_size=16)
    n.init_params(0)
    return n


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path))
    return tmp_path / "profiles"


def test_measuring_covers_every_layer_and_leaves_the_network_as_it_was(net):
    before = net.state_dict()
    data = {name: p.data for name, p in net.parameters()}
    net.node("conv2").layer.algo = "min_workspace"
    prof = profiling.measure_profile(net, 4, Device("cpu"), repeats=1)
    assert set(prof.layers) == {n.name for n in net.nodes}
    for name in ("conv1", "conv2"):
        cost = prof.layer(name)
        assert set(cost.forward_s) == set(cost.backward_s) == {"fastest", "min_workspace"}
        assert all(t > 0 for t in cost.forward_s.values())
        assert cost.workspace("forward", "fastest") == 0       # NumPy kernels: no cuDNN plans
    assert prof.layer("fc3").time("backward") > 0
    assert prof.d2h_bw > 0 and prof.h2d_bw > 0 and prof.duplex_bw >= prof.d2h_bw
    assert prof.optimizer_s > 0 and prof.accumulate_s > 0 and prof.memory_bytes > 0
    assert prof.layer("relu1").host("forward") > 0           # the memory manager's bookkeeping
    after = net.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert all(p.data is data[name] for name, p in net.parameters())
    assert net.node("conv2").layer.algo == "min_workspace"
    assert net.node("conv1").layer.algo == "fastest"


def test_a_copys_latency_is_what_it_takes_beyond_its_bytes():
    """measure_copy_latency: the time of a small copy less its bytes at the bandwidth given
    (at infinite bandwidth, the whole copy's time, which is more than nothing)."""
    cpu = Device("cpu")
    whole = profiling.measure_copy_latency(cpu, float("inf"), float("inf"))
    assert all(0 < t < 1e-3 for t in whole)
    less = profiling.measure_copy_latency(cpu, 4096 / 1e-3, 4096 / 1e-3)   # 1 ms of bytes
    assert less == (0.0, 0.0)        # never below nothing


def test_profiles_round_trip_through_json(net, tmp_path):
    prof = analytic_profile(net, 4, "h200")
    path = tmp_path / "p.json"
    profiling.save_profile(prof, path)
    again = profiling.load_profile(path)
    assert again == prof
    assert json.loads(path.read_text())["format"] == costs.FORMAT_VERSION
    path.write_text('{"format": 99}')
    with pytest.raises(ConfigError):
        profiling.load_profile(path)
    path.write_text("not json")
    with pytest.raises(ConfigError):
        profiling.load_profile(path)


def test_a_profile_is_measured_once_then_read_from_the_cache(net, cache, monkeypatch):
    first = profiling.get_profile(net, 4, Device("cpu"), repeats=1)
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and first.key in files[0].name
    assert files[0].name.startswith("tiny_cnn-b4-cpu-")

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the cache matches")
    monkeypatch.setattr(profiling, "measure_profile", must_not_measure)
    again = profiling.get_profile(net, 4, Device("cpu"))
    assert again == first
    with pytest.raises(AssertionError):          # another batch is another profile
        profiling.get_profile(net, 8, Device("cpu"))
    with pytest.raises(AssertionError):          # refresh measures again
        profiling.get_profile(net, 4, Device("cpu"), refresh=True)


def test_a_corrupt_cached_profile_is_measured_again_and_replaced(net, cache):
    first = profiling.get_profile(net, 4, Device("cpu"), repeats=1)
    (path,) = cache.glob("*.json")
    path.write_text('{"format": 1, "truncated')
    messages = []
    again = profiling.get_profile(net, 4, Device("cpu"), repeats=1, log=messages.append)
    assert again.key == first.key and set(again.layers) == set(first.layers)
    assert "unreadable" in messages[0] and path.name in messages[0]
    assert any(m.startswith("profiling tiny_cnn") for m in messages)
    assert profiling.load_profile(path) == again                  # overwritten: readable again
    assert list(cache.glob("*.json")) == [path]


def test_the_key_changes_with_the_way_layers_are_timed(net, monkeypatch):
    versions, settings = {"minidnn": "0.1.0"}, {"math": "tf32"}
    key, fields = profiling.profile_key(net, 8, "NVIDIA H200", versions, settings)
    assert fields["timing"] == profiling.TIMING_METHOD
    monkeypatch.setattr(profiling, "TIMING_METHOD", profiling.TIMING_METHOD + 1)
    assert profiling.profile_key(net, 8, "NVIDIA H200", versions, settings)[0] != key


def test_the_key_changes_with_batch_gpu_versions_math_and_structure(net):
    versions = {"minidnn": "0.1.0", "numpy": "2.0", "cupy": "14.2.0", "cudnn": 91900}
    settings = {"math": "tf32", "deterministic": False}
    key, fields = profiling.profile_key(net, 256, "NVIDIA H200", versions, settings)
    assert fields["batch"] == 256 and fields["device"] == "NVIDIA H200"
    variants = [
        profiling.profile_key(net, 128, "NVIDIA H200", versions, settings),
        profiling.profile_key(net, 256, "NVIDIA A100", versions, settings),
        profiling.profile_key(net, 256, "NVIDIA H200", dict(versions, cupy="14.3.0"), settings),
        profiling.profile_key(net, 256, "NVIDIA H200", dict(versions, cudnn=92000), settings),
        profiling.profile_key(net, 256, "NVIDIA H200", versions, dict(settings, math="fp32")),
    ]
    other = models.build("tiny_cnn", num_classes=5, image_size=16)
    variants.append(profiling.profile_key(other, 256, "NVIDIA H200", versions, settings))
    keys = [key] + [k for k, _ in variants]
    assert len(set(keys)) == len(keys)
    assert profiling.profile_key(net, 256, "NVIDIA H200", dict(versions), dict(settings))[0] == key


def test_a_profile_for_another_network_or_batch_is_refused(net):
    prof = analytic_profile(net, 4, "h200")
    prof.check_matches(net, 4)
    with pytest.raises(ConfigError):
        prof.check_matches(net, 8)
    other = models.build("tiny_cnn", num_classes=5, image_size=16)
    with pytest.raises(ConfigError):
        prof.check_matches(other, 4)


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path))
    assert profiling.cache_dir() == tmp_path / "profiles"
    monkeypatch.delenv("MINIDNN_CACHE")
    assert profiling.cache_dir().parts[-3:] == (".cache", "minidnn", "profiles")
    assert isinstance(Profile.from_json(analytic_profile(
        models.build("mlp", num_classes=10), 2, "k40").to_json()), Profile)


def test_a_profile_is_measured_in_the_format_the_run_stores_its_maps_in(net, cache, monkeypatch):
    """Channels-last or bf16 maps run other kernels than NCHW float32 ones (on the H200, VGG-16's
    NHWC convolutions are faster): the profile is measured in the run's format, and the
    format is part of its cache key."""
    pytest.importorskip("ml_dtypes")
    from minidnn.kernels.mapformat import MapFormat, is_channels_last, is_bfloat16
    from minidnn.layers.conv import Conv2d
    seen, weights = [], []
    real = Conv2d.forward

    def spy(self, xs, y, aux, ctx):
        seen.append((is_channels_last(xs[0]) and not xs[0].flags.c_contiguous,
                     str(xs[0].dtype)))
        w = self.params["weight"]
        weights.append(all(is_channels_last(a) and not a.flags.c_contiguous
                           for a in (w.data, w.grad)))
        return real(self, xs, y, aux, ctx)
    monkeypatch.setattr(Conv2d, "forward", spy)
    nhwc = profiling.get_profile(net, 4, Device("cpu"), repeats=1, maps=MapFormat("nhwc"))
    assert seen and all(last and dtype == "float32" for last, dtype in seen)
    # The weights and their gradients too, as the run lays them out: the same cuDNN problem.
    assert weights and all(weights)
    seen.clear()
    from minidnn.kernels import cpu
    widened = []
    real_widen = cpu.bf16_to_float

    def count_widening(src, dst):
        widened.append(is_bfloat16(src.dtype))
        return real_widen(src, dst)
    monkeypatch.setattr(cpu, "bf16_to_float", count_widening)
    bf16 = profiling.get_profile(net, 4, Device("cpu"), repeats=1,
                                 maps=MapFormat("nchw", "bf16"))
    # bf16 maps reach the layers through the mixed-precision boundary, widened to float32.
    assert widened and all(widened)
    assert seen and all(not last and dtype == "float32" for last, dtype in seen)
    plain = profiling.get_profile(net, 4, Device("cpu"), repeats=1)
    assert len({nhwc.key, bf16.key, plain.key}) == 3
    assert len(list(cache.glob("*.json"))) == 3
    assert any("NHWC" in note for note in nhwc.notes)


@pytest.mark.parametrize("layout, precision", [("nhwc", "bf16"), ("nchw", "fp32")])
def test_a_convolution_s_plan_tables_are_asked_for_in_the_maps_format(net, monkeypatch, layout,
                                                                    precision):
    """The workspace ladder of a convolution (planner/profile.py, _conv_settings) comes from
    the cuDNN plan tables of the problems the step runs: channels-last bf16 maps run other
    plans, with other workspaces, than NCHW float32 ones. A GPU kernels module stand-in
    records what is asked (the CPU's has no tables)."""
    pytest.importorskip("ml_dtypes")
    from minidnn.kernels import cpu
    from minidnn.kernels.cudnn_conv import PlanTiming  # noqa: F401 (needs no GPU)
    from minidnn.kernels.mapformat import MapFormat
    asked = []

    def conv_plans(op, x_shape, w_shape, spec, dtype=np.float32, layout="nchw"):
        asked.append((op, np.dtype(dtype).name, layout))
        return [(0, 0, 1.0)]
    monkeypatch.setattr(cpu, "conv_plans", conv_plans, raising=False)
    profiling.measure_layers(net, 4, Device("cpu"), repeats=1, progress=False,
                             maps=MapFormat(layout, precision))
    want = "bfloat16" if precision == "bf16" else "float32"
    assert asked and all(dtype == want and lay == layout for _, dtype, lay in asked)
    assert {op for op, _, _ in asked} >= {"fprop", "wgrad"}
