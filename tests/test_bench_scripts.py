"""The benchmark scripts' shared parts that run without a GPU or PyTorch: the worker
protocol (scripts/benchlib.py) and the walk of a network's graph that bench_vs_pytorch
translates into PyTorch (any DAG: Concat and Add joins)."""
import sys
import pathlib

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import benchlib  # noqa: E402
import bench_vs_pytorch  # noqa: E402
from minidnn import models  # noqa: E402
from minidnn.network import DATA  # noqa: E402


def _child(code: str) -> list:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); {code}"]


def test_a_worker_result_comes_back():
    result, why = benchlib.run_worker(
        _child("import benchlib; print('noise'); benchlib.emit({'images_per_s': 12.5})"), 30)
    assert result == {"images_per_s": 12.5} and why == ""


def test_a_worker_without_a_result_says_why():
    result, why = benchlib.run_worker(
        _child("print('first'); print('out of memory', file=sys.stderr); sys.exit(3)"), 30)
    assert result is None and why == "first | out of memory"
    result, why = benchlib.run_worker(_child("import time; print('started', flush=True); "
                                             "time.sleep(30)"), 1)
    assert result is None and why.endswith("timed out after 1 s")


@pytest.mark.parametrize("name,size", [("googlenet", 47), ("resnet18", 16), ("vgg11", 32)])
def test_graph_steps_run_every_layer_once_in_an_order_that_works(name, size):
    net = models.build(name, num_classes=10, image_size=size)
    steps = bench_vs_pytorch.graph_steps(net)
    layers = [n.name for n in net.nodes if n.layer.kind != "loss"]
    assert [s.name for s in steps] == layers
    live, freed = {DATA}, []
    for step in steps:
        assert set(step.inputs) <= live, f"{step.name} reads a value not made or already freed"
        live.add(step.name)
        live -= set(step.frees)
        freed += step.frees
    assert live == {steps[-1].name}            # only the logits remain
    assert sorted(freed) == sorted(set(freed))  # each value freed once
    joins = [s for s in steps if len(s.inputs) > 1]
    assert bool(joins) == (name != "vgg11")


def test_a_layer_overwrites_its_input_only_where_nothing_else_reads_it():
    from minidnn.layers import Conv2d, ReLU
    from minidnn.layers.merge import Add
    from minidnn.network import Network
    net = Network((3, 8, 8), name="fork")
    conv = net.add(Conv2d(4, 3, padding=1), name="conv")
    a = net.add(ReLU(), conv, name="relu_a")
    b = net.add(ReLU(), conv, name="relu_b")
    join = net.add(Add(), [a, b], name="join")
    net.add(ReLU(), join, name="relu_c")
    steps = bench_vs_pytorch.graph_steps(net)
    assert bench_vs_pytorch.overwritable(steps) == {"relu_c"}


def test_the_capped_benchmark_compiles_each_channels_last_step_it_runs_eagerly():
    import bench_budget
    configs = bench_budget.torch_configs([2, 4], [], ("nchw", "channels_last"))
    compiled = [(c["layout"], c["accumulate"]) for c in configs if c["compiled"]]
    assert compiled == [("channels_last", 1), ("channels_last", 2), ("channels_last", 4)]
    assert not any(c["compiled"] for c in bench_budget.torch_configs([2], [], compiled=False))
    assert bench_budget.describe(dict(configs[-2], math="tf32")) == \
        "channels_last, accumulation 4, torch.compile"


def test_a_layers_floor_is_its_bytes_or_its_flops():
    import layer_times
    net = models.build("vgg16", num_classes=10, image_size=32)
    net.infer_shapes(256)
    relu, conv = net.node("relu1_1").layer, net.node("conv1_2").layer
    n = 256 * 64 * 32 * 32
    assert layer_times.layer_bytes(relu, 2) == (2 * n * 2, 3 * n * 2)
    fwd, bwd = layer_times.floors(relu, layer_times.PEAK_FLOPS["bf16"], 2)
    assert fwd == 2 * n * 2 / layer_times.HBM_BYTES_PER_S
    fwd, bwd = layer_times.floors(conv, layer_times.PEAK_FLOPS["tf32"], 4)
    assert fwd == conv.flops() / layer_times.PEAK_FLOPS["tf32"] and bwd == 2 * fwd


def test_a_compiled_step_is_warmed_up_once_more_and_timed_apart():
    calls = []
    out, compile_s = benchlib.warm_up(lambda: calls.append(1) or len(calls), 0, True,
                                      lambda: None)
    assert out == [1, 2] and compile_s is not None and compile_s >= 0
    out, compile_s = benchlib.warm_up(lambda: 7, 3, False, lambda: None)
    assert out == [7, 7, 7] and compile_s is None


def test_cached_empty_hands_out_one_array_per_shape_and_dtype():
    """benchlib.CachedEmpty (what lets bn_bandwidth.py capture the batch norm's passes in a
    CUDA graph): the same array for the same shape and dtype, another for another; every
    other name is the module's own."""
    import numpy as np
    cached = benchlib.CachedEmpty(np)
    a = cached.empty((3, 4, 2), np.float64)
    assert cached.empty((3, 4, 2), np.float64) is a and a.shape == (3, 4, 2)
    assert cached.empty((3, 4, 2), np.float32) is not a
    assert cached.empty(5, np.float32) is cached.empty((5,), np.float32)
    assert cached.zeros is np.zeros and cached.float64 is np.float64


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
     "convolution"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16", "convolution"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized>", "convolution"),
    ("nvjet_sm90_tss_256x128_64x4_1x2_h_bz_coopA_NTT", "matrix product"),
    ("triton_per_fused__native_batch_norm_legit_functional_add_relu_12", "batch norm"),
    ("void bn_grad_relu_last<bf16, 8>(bf16 const*)", "batch norm"),
    ("void column_pass<bf16, 8, 2>(bf16 const*)", "pointwise and other"),
    ("triton_poi_fused_add_relu_threshold_backward_7", "pointwise and other"),
    ("void relu_backward_bits<bf16, 8>(bf16 const*)", "pointwise and other"),
    ("Memset (Unknown)", "copy and fill"),
    ("cupy_copy__uint16_uint16", "copy and fill"),
])
def test_a_kernel_is_classed_by_its_name(name, cls):
    """The kernel profile's classes: where a step's time goes besides its products."""
    assert benchlib.kernel_class(name) == cls


def test_step_kernels_adds_a_steps_kernels_up_per_pass_by_class_and_name():
    """scripts/step_kernels.py's summary: span, busy time (overlaps counted once), and each
    class's and kernel's time per pass."""
    import step_kernels
    events = [(0.0, 10.0, "sm90_xmma_fprop_implicit_gemm"), (5.0, 12.0, "cupy_copy__uint16"),
              (20.0, 24.0, "sm90_xmma_fprop_implicit_gemm"), (24.0, 25.0, "bn_grad_last")]
    s = step_kernels.summary(events, passes=2)
    assert s["span_us"] == 25.0 and s["busy_us"] == 12.0 + 5.0
    assert s["by_class"] == {"convolution": 7.0, "copy and fill": 3.5, "batch norm": 0.5}
    assert s["by_name"][0] == ("sm90_xmma_fprop_implicit_gemm", 7.0, 1.0)


def test_step_kernels_without_a_gpu_says_so_in_one_line():
    import subprocess
    proc = subprocess.run([sys.executable, str(SCRIPTS / "step_kernels.py"), "--model",
                           "tiny_cnn", "--batch", "8"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "minidnn: error: step_kernels.py profiles a GPU's kernels; there is no GPU here"]
