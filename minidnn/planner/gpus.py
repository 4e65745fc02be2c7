"""Analytic models of named GPUs, so that a plan can be made without the GPU it is for.

A GpuModel is a handful of rates: how fast convolutions run under the fastest cuDNN plan and
under the memory-optimal (least-workspace) one, how much workspace the fastest needs, how fast
matrix products and memory-bound layers run, and how fast pinned copies cross PCIe. From them
`analytic_profile` computes the same Profile (costs.py) that measuring on a GPU gives.

Why this exists: vDNN's choices depend on the ratio of compute speed to PCIe bandwidth. On the
paper's K40 (2016) a convolution took so long that copying its input to the host hid behind
it; an H200 computes ~35x faster while its PCIe is only ~4.5x faster, so the same offloads
stall it. `minidnn plan --gpu k40` and `--gpu h200` show the difference on a laptop.

Every number below says where it comes from. "Datasheet" figures are the vendor's peak
numbers; "measured" ones were measured on an H200 (cuDNN convolution times, workspaces and
pinned copy bandwidth, each stated with its measurement); "assumed" ones are modelling choices,
stated with their reason, to be replaced by a measured profile (profile.py) wherever the GPU
is at hand.

Convolution cost model: time = forward FLOPs (2 * N * O * OH * OW * C/groups * KH * KW) /
rate, where the rate is an *effective* one, i.e. per direct-convolution FLOP, so FFT and
Winograd plans can exceed the hardware peak. Backward runs the data gradient (unless the
input is the graph input) and the filter gradient, each with the forward's FLOPs. Workspace of
the fastest plan = ratio * the larger of the convolution's input and output map bytes; the
memory-optimal plan needs none.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..memory.plan import LivenessPlan
from ..network import Network
from ..kernels.math_mode import MATH_MODES
from .costs import (ALGOS, IN_PLACE_ADD_SHARE, LayerCost, Profile, in_place_gradients,
                    numel, structure_hash, weight_copy_shapes)

GB = 1e9
GiB = 1024 ** 3
TFLOPS = 1e12


# Each pinned copy's fixed time on its stream on the H200 (beyond its bytes over PCIe), and
# how long after an event on one engine a stream on another sees it, measured by
# profile.measure_copy_latency and measure_sync_latency; the older GPUs are assumed alike.
H200_D2H_LATENCY_S = 1.7e-6
H200_H2D_LATENCY_S = 2.3e-6
H200_SYNC_LATENCY_S = 4.1e-6


@dataclass(frozen=True)
class GpuModel:
    """A named GPU for the analytic cost model (see the module docstring).

    conv_flops: {math: {algo: effective FLOP/s}} for math 'fp32' and (where the GPU has it)
    'tf32'. workspace_ratio: {math: workspace of the fastest plan / max(input, output) bytes}.
    gemm_flops: {math: FLOP/s} of large matrix products (Linear). mem_bw: bytes/s that
    memory-bound layers achieve (read + written). d2h_bw / h2d_bw: pinned copies alone;
    duplex_bw: both directions at once, in total. d2h_latency_s / h2d_latency_s: each
    copy's time on its stream beyond its bytes over the link; sync_latency_s: how long after
    an event a stream on another engine sees it. kernel_s: the least time any kernel takes.
    host_s_per_call: the host's time to issue one layer call (Python, memory manager,
    launches). multiprocessors: the GPU's SMs, which size a random generator's state
    (generator_bytes). sources: {field: where the number comes from}.
    """
    name: str
    description: str
    memory_bytes: int
    conv_flops: dict
    workspace_ratio: dict
    gemm_flops: dict
    mem_bw: float
    d2h_bw: float
    h2d_bw: float
    duplex_bw: float
    d2h_latency_s: float = H200_D2H_LATENCY_S
    h2d_latency_s: float = H200_H2D_LATENCY_S
    sync_latency_s: float = H200_SYNC_LATENCY_S
    kernel_s: float = 5e-6
    host_s_per_call: float = 60e-6
    multiprocessors: int = 0
    sources: dict = field(default_factory=dict)

    @property
    def generator_bytes(self) -> int:
        """Device bytes of the step's random generator state (backend.Device.generator_bytes):
        0, the GPU's generator is counter-based (kernels/cuda_random.py)."""
        return 0

    def math_for(self, math: str) -> str:
        """The math mode the model uses for `math` (a GPU without TF32 computes in FP32)."""
        if math not in MATH_MODES:
            raise ConfigError(f"math must be one of {', '.join(MATH_MODES)}, got {math!r}")
        return math if math in self.conv_flops else "fp32"


# ---- presets -------------------------------------------------------------------------------------
K40 = GpuModel(
    name="k40",
    description="NVIDIA Tesla K40 (Kepler, 2013): the GPU of the vDNN paper (arXiv version)",
    memory_bytes=12 * GiB,
    conv_flops={"fp32": {"fastest": 3.2 * TFLOPS, "min_workspace": 1.9 * TFLOPS}},
    workspace_ratio={"fp32": 2.0},
    gemm_flops={"fp32": 3.2 * TFLOPS},
    mem_bw=200 * GB,
    d2h_bw=12 * GB,
    h2d_bw=12 * GB,
    duplex_bw=20 * GB,
    multiprocessors=15,
    sources={
        "multiprocessors": "datasheet: 15 SMX units",
        "memory_bytes": "datasheet: 12 GB GDDR5",
        "conv_flops": "datasheet peak 4.29 TFLOP/s FP32 (2880 cores x 2 x 745 MHz); assumed "
                      "75% effective for the fastest cuDNN v4 plans (FFT / precomputed GEMM "
                      "with workspace) and 45% for implicit GEMM without workspace, the "
                      "~1.7x gap vDNN_dyn trades for memory; cuDNN v4 had no TF32",
        "workspace_ratio": "assumed: FFT plans hold transformed inputs, filters and outputs, "
                           "about twice the larger feature map",
        "gemm_flops": "assumed 75% of the 4.29 TFLOP/s peak for cuBLAS SGEMM",
        "mem_bw": "datasheet 288 GB/s; assumed 70% achieved by elementwise kernels",
        "d2h_bw": "PCIe gen3 x16 pinned copies, ~12 GB/s each way (vDNN paper's setting)",
        "d2h_latency_s": "assumed: the H200's measured copy and sync latencies",
        "duplex_bw": "assumed: PCIe is full duplex, ~20 GB/s both ways at once on that era's "
                     "host bridges",
        "host_s_per_call": "minidnn's host overhead per layer call (an estimate; a profile "
                           "measures it)",
    })

TITANX = GpuModel(
    name="titanx",
    description="NVIDIA GeForce GTX Titan X (Maxwell, 2015): the GPU of vDNN's MICRO version",
    memory_bytes=12 * GiB,
    conv_flops={"fp32": {"fastest": 5.0 * TFLOPS, "min_workspace": 3.0 * TFLOPS}},
    workspace_ratio={"fp32": 2.0},
    gemm_flops={"fp32": 5.0 * TFLOPS},
    mem_bw=250 * GB,
    d2h_bw=12 * GB,
    h2d_bw=12 * GB,
    duplex_bw=20 * GB,
    multiprocessors=24,
    sources={
        "multiprocessors": "datasheet: 24 SMs",
        "memory_bytes": "datasheet: 12 GB GDDR5",
        "conv_flops": "datasheet peak 6.6 TFLOP/s FP32; assumed 75% / 45% effective as for "
                      "the K40 (same cuDNN generation)",
        "workspace_ratio": "assumed, as for the K40",
        "gemm_flops": "assumed 75% of peak",
        "mem_bw": "datasheet 336 GB/s; assumed 75% achieved",
        "d2h_bw": "PCIe gen3 x16, as for the K40",
        "d2h_latency_s": "assumed: the H200's measured copy and sync latencies",
        "duplex_bw": "assumed, as for the K40",
        "host_s_per_call": "minidnn's host overhead per layer call (an estimate)",
    })

H200 = GpuModel(
    name="h200",
    description="NVIDIA H200 (Hopper, 141 GB HBM3e, PCIe gen5)",
    memory_bytes=140 * GiB,
    conv_flops={"tf32": {"fastest": 148 * TFLOPS, "min_workspace": 41 * TFLOPS},
                "fp32": {"fastest": 70 * TFLOPS, "min_workspace": 41 * TFLOPS}},
    workspace_ratio={"tf32": 1.0, "fp32": 0.5},
    gemm_flops={"tf32": 200 * TFLOPS, "fp32": 50 * TFLOPS},
    mem_bw=3.6e12,
    d2h_bw=55 * GB,
    h2d_bw=55 * GB,
    duplex_bw=100 * GB,
    multiprocessors=132,
    sources={
        "multiprocessors": "measured: the driver reports 132 SMs",
        "memory_bytes": "datasheet 141 GB; the driver reports about 140 GiB",
        "conv_flops": "measured: cuDNN conv 64->128 3x3 56x56 batch 32 (14.8 GFLOP) takes "
                      "0.10 ms with TF32 plans (148 TFLOP/s) and 0.36 ms with strict FP32 "
                      "plans (41 TFLOP/s, 0 workspace), so under TF32 the least-workspace plan "
                      "is the FP32 one; fp32 'fastest' 70 TFLOP/s is calibrated to PyTorch's "
                      "strict-FP32 VGG-16 b256 step (357.8 ms, 23.6 TFLOP of convolutions) "
                      "against its TF32 step (180.5 ms), which the TF32 rate reproduces",
        "workspace_ratio": "measured for TF32: 26-77 MB of workspace for that conv's 26 MB "
                           "input / 51 MB output (ratio 0.5-1.5, 1.0 taken); fp32 0.5 assumed "
                           "(Winograd-type plans)",
        "gemm_flops": "assumed: ~40% of the 495 TFLOP/s dense TF32 peak and ~75% of the 67 "
                      "TFLOP/s FP32 peak for cuBLAS",
        "mem_bw": "datasheet 4.8 TB/s; assumed 75% achieved by elementwise kernels",
        "d2h_bw": "measured: pinned copies 55 GB/s each way",
        "d2h_latency_s": "measured: back to back, a pinned copy of a few KB takes 1.7 us "
                         "device to host and 2.3 us host to device, beyond its bytes",
        "sync_latency_s": "measured: 4.1 us; a copy between two compute calls, each "
                          "waiting for the other's event, adds it twice beyond the copy",
        "duplex_bw": "measured: 100 GB/s with both directions at once",
        "host_s_per_call": "minidnn's host overhead per layer call (an estimate; a profile "
                           "measures it)",
    })

PRESETS = {g.name: g for g in (K40, TITANX, H200)}


def gpu_names() -> list[str]:
    return sorted(PRESETS)


def get_gpu(name: str | GpuModel) -> GpuModel:
    """A preset by name ('k40', 'titanx', 'h200'; case and 'tesla'/'nvidia' prefixes ignored)."""
    if isinstance(name, GpuModel):
        return name
    key = str(name).lower().replace(" ", "").replace("-", "").replace("_", "")
    for prefix in ("nvidia", "tesla", "geforce", "gtx"):
        key = key.removeprefix(prefix)
    for g in PRESETS.values():
        if key == g.name or key.startswith(g.name):
            return g
    raise ConfigError(f"unknown GPU {name!r}; analytic models: {', '.join(gpu_names())}")


def preset_for_device_name(device_name: str) -> GpuModel | None:
    """The preset of a driver-reported name ('NVIDIA H200' -> h200), or None."""
    try:
        return get_gpu(device_name)
    except ConfigError:
        return None


# ---- the analytic profile ------------------------------------------------------------------------
def _memory_bound(gpu: GpuModel, nbytes: float, kernels: int) -> float:
    """A layer call that streams `nbytes` through device memory with `kernels` launches."""
    return max(nbytes / gpu.mem_bw, kernels * gpu.kernel_s)


def layer_cost(node, gpu: GpuModel, math: str) -> LayerCost:
    """Analytic forward/backward time and workspace of one node (see the module docstring).

    Bytes streamed per call, from the layers' code (B: the output map's bytes, Bin: input's):
    relu 2B / 3B (fused kernels); dropout 5.75B / 4.25B (float32
    draws, 1-byte mask, multiply, scale); max-pool Bin + 1.25B both ways (1-byte argmax);
    LRN 3B / 4B doubled for its per-element powers; a reshape in place 0.
    """
    layer = node.layer
    m = gpu.math_for(math)
    item = layer.dtype.itemsize
    kind = layer.kind
    out_b = numel(layer.out_shape) * item if layer.out_shape else item
    in_b = sum(numel(s) for s in layer.in_shapes) * item
    host = {"forward": gpu.host_s_per_call, "backward": gpu.host_s_per_call}
    if kind == "conv":
        flops = float(layer.flops())
        passes = 2 if LivenessPlan.wants_grad(node, 0) else 1
        fwd, bwd, ws_f, ws_b = {}, {}, {}, {}
        bias = getattr(layer, "bias", False)
        own = _memory_bound(gpu, 2 * out_b, 1) if bias else 0.0     # the bias's add
        for algo in ALGOS:
            rate = gpu.conv_flops[m][algo]
            fwd[algo] = max(flops / rate, gpu.kernel_s) + own
            bwd[algo] = max(passes * flops / rate, passes * gpu.kernel_s) + \
                (_memory_bound(gpu, out_b, 1) if bias else 0.0)
            ws = 0 if algo == "min_workspace" else \
                int(gpu.workspace_ratio[m] * max(numel(layer.in_shapes[0]) * item, out_b))
            ws_f[algo] = ws_b[algo] = ws
        return LayerCost(fwd, bwd, ws_f, ws_b, host, own)
    if kind == "linear":
        flops = float(layer.flops())
        passes = 2 if LivenessPlan.wants_grad(node, 0) else 1
        rate = gpu.gemm_flops[m]
        fwd = max(flops / rate, gpu.kernel_s) + _memory_bound(gpu, 2 * out_b, 1)
        bwd = max(passes * flops / rate, passes * gpu.kernel_s) + _memory_bound(gpu, out_b, 1)
        return LayerCost({"fastest": fwd}, {"fastest": bwd}, host_s=host)
    streamed = {
        "relu": (2.0 * out_b, 1, 3.0 * out_b, 1),
        "dropout": (5.75 * out_b, 5, 4.25 * out_b, 2),
        "pool": (in_b + 1.25 * out_b, 1, in_b + 1.25 * out_b, 1),
        "lrn": (6.0 * out_b, 1, 8.0 * out_b, 1),
        "reshape": (0.0, 0, 0.0, 0),
        "add": (in_b + out_b, len(layer.in_shapes) - 1, 2 * in_b, len(layer.in_shapes)),
        "concat": (2.0 * out_b, len(layer.in_shapes), 2.0 * out_b, len(layer.in_shapes)),
        "loss": (10.0 * in_b, 8, 4.0 * in_b, 4),
    }.get(kind, (2.0 * out_b, 1, 2.0 * out_b, 1))
    fb, fk, bb, bk = streamed
    return LayerCost({"fastest": _memory_bound(gpu, fb, fk)},
                     {"fastest": _memory_bound(gpu, bb, bk)}, host_s=host)


def analytic_profile(net: Network, batch: int, gpu: str | GpuModel, math: str = "tf32",
                     relu_bits=frozenset()) -> Profile:
    """The Profile of `net` at `batch` on a named GPU, from its analytic model, for a run
    whose decision has the ReLUs `relu_bits` keep bit masks."""
    gpu = get_gpu(gpu)
    used_math = gpu.math_for(math)
    net.infer_shapes(batch)
    layers = {node.name: layer_cost(node, gpu, math) for node in net.nodes}
    params = [p for _, p in net.parameters()]
    pbytes = sum(numel(p.shape) for p in params) * net.dtype.itemsize
    added = in_place_gradients(net)
    in_place = sum(numel(p.shape) for name, p in net.parameters() if name in added) * \
        net.dtype.itemsize
    notes = []
    if used_math != math:
        notes.append(f"{gpu.name} has no TF32: convolutions and matrix products modelled in "
                     f"strict FP32")
    # SGD with momentum and weight decay streams ~13 parameter-sized passes (see optim.py:
    # wd * w, grad + that, v *= m, v += g, lr * v, w -= that) and launches ~6 kernels each.
    opt_s = _memory_bound(gpu, 13 * pbytes, 6 * len(params))
    copied = weight_copy_shapes(net)
    return Profile(
        source=f"analytic:{gpu.name}", device_name=gpu.name, math=used_math, network=net.name,
        batch=int(batch), memory_bytes=gpu.memory_bytes, d2h_bw=gpu.d2h_bw, h2d_bw=gpu.h2d_bw,
        duplex_bw=gpu.duplex_bw, d2h_latency_s=gpu.d2h_latency_s,
        h2d_latency_s=gpu.h2d_latency_s, sync_latency_s=gpu.sync_latency_s, layers=layers,
        optimizer_s=opt_s,
        accumulate_s=_memory_bound(   # an add reads 2 arrays and writes 1
            gpu, 3 * (pbytes - in_place + IN_PLACE_ADD_SHARE * in_place), len(params)),
        optimizer_host_s=6 * len(params) * 10e-6, generator_bytes=gpu.generator_bytes,
        weight_copy_s=_memory_bound(   # a bf16 copy reads 4 bytes a value and writes 2
            gpu, 6 * sum(numel(shape) for shape in copied), len(copied)),
        key_fields={"structure": structure_hash(net, batch, relu_bits), "gpu": gpu.name,
                    "math": used_math},
        notes=notes)
