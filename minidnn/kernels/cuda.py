"""GPU kernels: cuDNN convolutions (through the cuDNN frontend), CuPy kernels for pooling and LRN.

Every op has its cpu.py twin's signature and semantics (see kernels/__init__.py) and runs on
CuPy's *current* stream, which the executor makes its compute stream. Nothing here synchronizes
with the host except the first call of a convolution shape, which builds its cuDNN graph and
times every candidate plan (cudnn_conv.py); that call is a warm-up, not a steady-state step.

Convolutions
* The cuDNN handle is re-bound to the current stream on every call (the frontend skips the
  call when the stream is unchanged). On CuPy's legacy default stream the convolution runs on a
  private non-blocking stream fenced by events on both sides, so cuDNN never runs on the legacy
  stream and the ordering with the caller's work is kept.
* Workspace: a block the caller passes (`workspace=`, the memory manager's planned block in
  the static layout) when it is large enough; otherwise allocated per call from CuPy's
  allocator (which the framework routes into its arena, so it is counted against the budget)
  and dropped as soon as the plan is enqueued. Either way a layer's workspace exists only while
  its convolution runs, as in vDNN; reuse of the bytes is ordered on the stream.
* Bias add (forward, cuda_pointwise.py) and bias gradient are CuPy kernels on the same stream.
  With relu=True on float32 maps the bias and the ReLU after the convolution run in its cuDNN
  graph's epilogue instead (fprop_bias_relu; minidnn/fusion.py says when a step asks for it).
* Layouts: a problem's tensors are described to cuDNN by their strides, so NCHW and
  channels-last (NHWC) maps both run as they are (kernels/mapformat.py); with NHWC maps the
  tensor-core plans need no transposes around the convolution.

configure(math, deterministic) sets the math mode for convolutions and for float32 matrix
products (Linear's GemmEx, CuPy's matmul): 'tf32' or 'fp32'. Until it is called, convolutions
use TF32 and matrix products strict FP32: PyTorch's defaults.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Callable, NamedTuple

import cupy as cp
import numpy as np

from ..errors import ConfigError
from . import cpu as _cpu
from . import out_size
from .mapformat import BF16_OPS as MAP_OPS, layout_strides, shaped
from .cuda_linear import bind_stream as bind_cublas, linear_backward, linear_forward, \
    set_math as _linear_math
from .cuda_concat import concat_backward, concat_forward
from .cuda_lrn import lrn_backward, lrn_forward
from .cuda_pointwise import add, add_relu, bf16_to_float, bias_add, bias_grad, float_to_bf16, \
    relu_backward, relu_backward_bits, relu_forward, relu_forward_bits, relu_mask_copy, \
    relu_mask_sum, relu_mask_sum_copy, scale_by_mask
from .cuda_pool import avgpool2d_backward, avgpool2d_forward, maxpool2d_backward, \
    maxpool2d_forward
from .cuda_sgd import sgd_update
from .cuda_weights import empty_as, shared_weight_copies, weights_in
from .cudnn_conv import ConvPlanCache, ConvProblem, CudnnConvGraph, PlanUnavailable, load_cudnn, \
    check_math, split_by_group

__all__ = ["conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "bias_grad", "add",
           "add_relu", "relu_mask_copy", "relu_mask_sum_copy", "relu_mask_sum",
           "maxpool2d_forward",
           "maxpool2d_backward",
           "avgpool2d_forward", "avgpool2d_backward",
           "lrn_forward", "lrn_backward", "concat_forward", "concat_backward", "relu_forward",
           "relu_backward", "relu_forward_bits", "relu_backward_bits", "scale_by_mask",
           "float_to_bf16", "bf16_to_float", "configure",
           "math_mode", "conv_plans",
           "conv_cache_stats", "conv_cache_entries", "clear_conv_cache", "run_conv_plan",
           "reset_workspace_fallbacks", "linear_forward", "linear_backward",
           "shared_weight_copies", "sgd_update", "BF16_OPS", "bind_libraries"]

#: The ops that take bf16 feature maps as they are (layers/precision.py calls a layer whose
#: kernel ops are all here on its bf16 maps; the others see them widened to float32).
BF16_OPS = MAP_OPS["gpu"]

# Measuring a plan: one run to load its kernels, timed, then one timed run that counts. When
# the first run alone took more than SLOW_FACTOR times the best plan so far (and more than
# SLOW_MS), the plan is clearly not the one to choose: its first time stands and the second run
# is skipped, which halves the cost of measuring the very slow fallback plans of large layers.
SLOW_FACTOR = 3.0
SLOW_MS = 5.0

_state = {"math": "tf32", "deterministic": False}
_linear_math(_state["math"])   # the fully connected products in the same mode from the start
_handles: dict = {}        # device id -> cudnn.Handle
_caches: dict = {}         # device id -> ConvPlanCache
_side_streams: dict = {}   # device id -> stream used when the caller is on the legacy stream


# ---- math mode --------------------------------------------------------------------------------
def configure(math: str = "tf32", deterministic: bool = False) -> None:
    """Set the math mode of convolutions and float32 matrix products.

    math='tf32' lets cuDNN use TF32 tensor-core plans and cuBLAS's float32 products (Linear's
    and CuPy's matmuls) compute in TF32
    (about 3e-4 relative error, several times faster); 'fp32' keeps both strict FP32 (about
    1e-6). deterministic=True restricts convolutions to deterministic plans, chosen by rank
    rather than by timing, so that two runs give identical bits. Graphs built under another
    mode stay cached under that mode.
    """
    math, deterministic = check_math(math, deterministic)
    _state["math"], _state["deterministic"] = math, deterministic
    _linear_math(math)
    # CuPy reads its float32 GEMM compute type from CUPY_TF32 once; set it explicitly instead.
    from cupy._core import _routines_linalg as linalg
    tf32 = getattr(linalg, "COMPUTE_TYPE_TF32", 7)
    default = getattr(linalg, "COMPUTE_TYPE_DEFAULT", 1)
    linalg.set_compute_type(np.float32, tf32 if math == "tf32" else default)


def bind_libraries() -> None:
    """Bind cuBLAS's and cuDNN's handles to the current stream. A step captured as a CUDA
    graph (minidnn/step_graph.py) must find them bound already: CuPy refuses to rebind
    cuBLAS while a stream is captured."""
    stream = cp.cuda.get_current_stream().ptr
    bind_cublas(stream)
    load_cudnn().set_stream(handle=_handle(), stream=stream)


def math_mode() -> dict:
    """{'math': 'tf32' | 'fp32', 'deterministic': bool}: the mode in force."""
    return dict(_state)


# ---- cuDNN plumbing -----------------------------------------------------------------------------
def _device_id() -> int:
    return cp.cuda.Device().id


def _handle():
    dev = _device_id()
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = load_cudnn().create_handle()
    return h


def _time_plan(graph, index, workspace_bytes, operands, best_ms=float("inf")):
    """Milliseconds of plan `index` on the current stream (see SLOW_FACTOR), or None if its
    workspace cannot be had or cuDNN refuses to run it. operands: the pointers of x, w and
    y (and b, for fprop_bias_relu), and the call's planned workspace block (None: none), in
    which a plan whose workspace it holds runs: under a budget the plan reserved that block
    for this call."""
    *operands, reserved = operands
    ws = None
    if reserved is not None and workspace_bytes <= reserved.nbytes:
        ws_ptr = reserved.data.ptr if workspace_bytes else 0
    else:
        try:
            ws = cp.empty(workspace_bytes, dtype=np.uint8) if workspace_bytes else None
        except MemoryError:  # CuPy's OutOfMemoryError and the arena's budget error both are
            return None
        ws_ptr = ws.data.ptr if ws is not None else 0
    ptrs = (*operands[:3], ws_ptr, *operands[3:])
    stream = cp.cuda.get_current_stream()
    events = [cp.cuda.Event() for _ in range(3)]
    try:
        events[0].record(stream)
        graph.execute(index, *ptrs)
        events[1].record(stream)
        events[1].synchronize()
        first = cp.cuda.get_elapsed_time(events[0], events[1])
        if first > SLOW_MS and first > SLOW_FACTOR * best_ms:
            return first
        graph.execute(index, *ptrs)
        events[2].record(stream)
    except (RuntimeError, load_cudnn().cudnnGraphNotSupportedError):
        return None
    events[2].synchronize()
    return cp.cuda.get_elapsed_time(events[1], events[2])


def _cache() -> ConvPlanCache:
    dev = _device_id()
    c = _caches.get(dev)
    if c is None:
        c = _caches[dev] = ConvPlanCache(lambda p: CudnnConvGraph(p, _handle()), _time_plan)
    return c


@contextlib.contextmanager
def _cudnn_stream():
    """Bind the handle to the current stream for the body (a private one, fenced, when the
    current stream is the legacy default stream)."""
    cudnn = load_cudnn()
    current = cp.cuda.get_current_stream()
    if current.ptr != 0:
        cudnn.set_stream(handle=_handle(), stream=current.ptr)
        yield current
        return
    dev = _device_id()
    side = _side_streams.get(dev)
    if side is None:
        side = _side_streams[dev] = cp.cuda.Stream(non_blocking=True)
    side.wait_event(current.record())
    with side:
        cudnn.set_stream(handle=_handle(), stream=side.ptr)
        yield side
    current.wait_event(side.record())


def _ptrs(x, w, y) -> tuple:
    return x.data.ptr, w.data.ptr, y.data.ptr


def _entry_and_parts(op, x, w, y, spec, reserved=None, b=None):
    """(cache entry, [(x, w, y)] to run it on): the grouped problem itself, or one part per
    group when cuDNN cannot run it grouped. reserved: the call's planned workspace block, in
    which a problem seen for the first time measures the plans it holds (_time_plan); b: the
    bias fprop_bias_relu reads (that op is never split by group)."""
    cache = _cache()
    math, det = _state["math"], _state["deterministic"]
    problem = ConvProblem.of(op, x, w, y, spec, math, det)
    bias = () if b is None else (b.data.ptr,)
    try:
        return cache.get(problem, _ptrs(x, w, y) + bias + (reserved,)), [(x, w, y)]
    except PlanUnavailable:
        if spec.groups == 1 or b is not None:
            raise
    parts = split_by_group(x, w, y, spec.groups)
    problem = ConvProblem.of(op, *parts[0], spec, math, det, groups=1)
    return cache.get(problem, _ptrs(*parts[0]) + (reserved,)), parts


class _Ready(NamedTuple):
    """What a steady-state call needs: the plan's runner and workspace, and for a grouped
    convolution that cuDNN runs group by group, the byte steps between the groups' x, w, y."""
    run: Callable
    workspace_bytes: int
    group_steps: tuple | None
    index: int = -1                 # the plan's index in its graph


# (op, layouts, dtypes, spec, device, math mode, plan_index) -> _Ready. A cheap key: building
# a ConvProblem costs tens of microseconds, too much for every call.
_ready: dict = {}


def _prepare(op, x, w, y, spec, plan_index, reserved=None, b=None) -> _Ready:
    """First call of a key: graph and measurements from the plan cache (in the call's
    planned workspace block `reserved`, when it has one), the plan chosen."""
    try:
        entry, parts = _entry_and_parts(op, x, w, y, spec, reserved, b)
    except PlanUnavailable as exc:
        raise ConfigError(f"convolution {spec.key or '(unnamed)'}: {exc}") from None
    if plan_index is None:
        plan = entry.plan_for(spec.algo, where=f"convolution {spec.key or '(unnamed)'}",
                              workspace_limit=spec.workspace_limit)
    else:
        plan = next((p for p in entry.table if p.index == plan_index), None)
        if plan is None:
            raise ConfigError(f"plan {plan_index} is not a candidate of "
                              f"{entry.problem.describe()}; candidates: "
                              f"{[p.index for p in entry.table]}")
    steps = None
    if len(parts) > 1:
        (x1, w1, y1) = parts[1]
        steps = (x1.data.ptr - x.data.ptr, w1.data.ptr - w.data.ptr, y1.data.ptr - y.data.ptr,
                 len(parts))
    return _Ready(entry.graph.runner(plan.index), plan.workspace_bytes, steps, plan.index)


def _conv(op: str, x, w, y, spec, plan_index: int | None = None, workspace=None,
          b=None) -> None:
    """Run a convolution op on the roles x (image), w (filter), y (output map); `workspace`: a
    flat uint8 device array to use if it is large enough for the plan; b: the bias
    fprop_bias_relu reads."""
    stream = cp.cuda.get_current_stream()
    if stream.ptr == 0:                      # legacy default stream: run fenced on our own
        with _cudnn_stream():
            _conv(op, x, w, y, spec, plan_index, workspace, b)
        return
    dev = x.data.device_id
    handle = _handles.get(dev) or _handle()
    load_cudnn().set_stream(handle=handle, stream=stream.ptr)
    key = (op, x.shape, x.strides, w.shape, w.strides, y.shape, y.strides, x.dtype, w.dtype,
           y.dtype, spec, dev, _state["math"], _state["deterministic"], plan_index)
    ready = _ready.get(key)
    if ready is None:
        ready = _ready[key] = _prepare(op, x, w, y, spec, plan_index, workspace, b)
    ws = None
    if workspace is not None and workspace.nbytes >= ready.workspace_bytes:
        ws_ptr = workspace.data.ptr if ready.workspace_bytes else 0
    else:
        try:
            ws = cp.empty(ready.workspace_bytes, dtype=np.uint8) if ready.workspace_bytes \
                else None
        except MemoryError as exc:  # the budget cannot hold this plan's workspace now
            ready, ws = _leaner_plan(key, op, x, w, y, spec, ready, str(exc))
        ws_ptr = ws.data.ptr if ws is not None else 0
    if b is not None:
        ready.run(x.data.ptr, w.data.ptr, y.data.ptr, ws_ptr, b.data.ptr)
    elif ready.group_steps is None:
        ready.run(x.data.ptr, w.data.ptr, y.data.ptr, ws_ptr)
    else:
        sx, sw, sy, groups = ready.group_steps
        px, pw, py = x.data.ptr, w.data.ptr, y.data.ptr
        for g in range(groups):
            ready.run(px + g * sx, pw + g * sw, py + g * sy, ws_ptr)
    del ws  # back to the allocator now; later reuse is ordered on this stream


class Fallback(NamedTuple):
    """A convolution that ran a leaner plan than its chosen one: plan indices and workspaces
    (bytes) of both, and why the chosen one's workspace could not be had."""
    chosen: int
    ran: int
    chosen_workspace: int
    ran_workspace: int
    reason: str


# (layer key, op) -> Fallback: convolutions whose chosen plan's workspace did not fit the
# memory budget when they ran.
workspace_fallbacks: dict = {}
_fallback_keys: set = set()        # the _ready keys that now hold a leaner plan


def reset_workspace_fallbacks() -> None:
    """Forget the leaner plans chosen under memory pressure: the next call of each such
    convolution tries its chosen plan again (for a new budget or a new network)."""
    for key in _fallback_keys:
        _ready.pop(key, None)
    _fallback_keys.clear()
    workspace_fallbacks.clear()


def _leaner_plan(key, op, x, w, y, spec, ready, reason: str = ""):
    """The fastest measured plan whose workspace can be allocated now, and that workspace.

    Called when the chosen plan's workspace does not fit the budget (the feature maps of a
    virtualized step leave little room). The choice sticks for this call key: a step's
    memory pattern repeats, so the next step would fail the same way. Plans not measured
    (and those that failed to run when measured) come last, leanest first: a plan needing no
    workspace always fits, so this fails for want of memory only when cuDNN offers none.
    """
    entry, _ = _entry_and_parts(op, x, w, y, spec)
    leaner = [p for p in entry.table if p.workspace_bytes < ready.workspace_bytes]
    # Measured plans, fastest first; then those not measured (ranked past MEASURED_PLANS),
    # leanest first, so that a plan needing no workspace is found if cuDNN offers one.
    measured = sorted((p for p in leaner if np.isfinite(p.time_ms)), key=lambda p: p.time_ms)
    unmeasured = sorted((p for p in leaner if np.isnan(p.time_ms)),
                        key=lambda p: p.workspace_bytes)
    for plan in measured + unmeasured:
        try:
            ws = cp.empty(plan.workspace_bytes, dtype=np.uint8) if plan.workspace_bytes else None
        except MemoryError:
            continue
        lean = _Ready(entry.graph.runner(plan.index), plan.workspace_bytes, ready.group_steps,
                      plan.index)
        _ready[key] = lean
        _fallback_keys.add(key)
        workspace_fallbacks[(spec.key, op)] = Fallback(ready.index, plan.index,
                                                       ready.workspace_bytes,
                                                       plan.workspace_bytes, reason)
        return lean, ws
    raise ConfigError(f"convolution {spec.key or '(unnamed)'} ({op}): no measured plan runs "
                      f"without workspace, and the budget holds no workspace now")


# ---- convolution ops ----------------------------------------------------------------------------
# With bf16 maps (mixed precision) the float32 weights are read through a bf16 copy and the
# weight gradient comes out in bf16, widened into the float32 gradient: cuDNN's bf16 plans take
# one dtype for all three operands (layers/precision.py says what this rounds).
def _weights_for(w, maps):
    """w as a convolution on `maps` reads it: itself, or its bf16 copy beside bf16 maps."""
    return w if w.dtype == maps.dtype else weights_in(w, maps.dtype)


def conv2d_forward(x, w, b, y, spec, workspace=None, relu: bool = False) -> None:
    """y (N, O, OH, OW) = conv(x (N, C, H, W), w (O, C/groups, KH, KW)) + b (O,) (b may be None).
    workspace: a flat uint8 device array for cuDNN, used when large enough (see _conv).
    relu: y = max(conv + b, 0) (b required): on float32 maps one cuDNN graph with the bias
    and the ReLU in its epilogue, among the plans that need no more workspace than the
    call was given; else, or where cuDNN has no such plan (the choice is remembered per
    call), the convolution and then the ReLU's pass adding the bias (relu_forward)."""
    if relu:
        if b is None:
            raise ValueError("conv2d_forward: relu=True needs the bias b")
        if _bias_relu_epilogue(x, w, b, y, spec, workspace):
            return
        _conv("fprop", x, _weights_for(w, x), y, spec, workspace=workspace)
        relu_forward(y, y, b)
        return
    _conv("fprop", x, _weights_for(w, x), y, spec, workspace=workspace)
    if b is not None:
        bias_add(y, b)


# Call keys whose fused graph cuDNN could not run: they take the two passes from then on.
_no_epilogue: set = set()


def _bias_relu_epilogue(x, w, b, y, spec, workspace) -> bool:
    """Run fprop_bias_relu for conv2d_forward(relu=True); False (nothing run) where it does
    not apply: bf16 maps, a grouped convolution, or a call whose fused graph failed before."""
    if x.dtype != np.float32 or spec.groups != 1 or b.dtype != x.dtype:
        return False
    key = (x.shape, x.strides, w.shape, y.strides, spec, _state["math"],
           _state["deterministic"])
    if key in _no_epilogue:
        return False
    if workspace is not None:       # no more workspace than the plan gave the call
        limit = workspace.nbytes if spec.workspace_limit is None else \
            min(workspace.nbytes, spec.workspace_limit)
        spec = replace(spec, workspace_limit=limit)
    try:
        _conv("fprop_bias_relu", x, w, y, spec, workspace=workspace, b=b)
    except (ConfigError, MemoryError):
        _no_epilogue.add(key)
        return False
    return True


def conv2d_backward_data(gy, w, gx, spec, workspace=None) -> None:
    """gx (N, C, H, W) = conv^T(gy (N, O, OH, OW), w); overwrites gx."""
    _conv("dgrad", gx, _weights_for(w, gy), gy, spec, workspace=workspace)


def conv2d_backward_filter(x, gy, gw, gb, spec, workspace=None) -> None:
    """gw (O, C/groups, KH, KW) and gb (O,) (gb may be None) from x and gy; both overwritten."""
    if gw.dtype == x.dtype:
        _conv("wgrad", x, gw, gy, spec, workspace=workspace)
    else:
        gw16 = empty_as(gw, x.dtype)
        _conv("wgrad", x, gw16, gy, spec, workspace=workspace)
        bf16_to_float(gw16, gw)
    if gb is not None:
        bias_grad(gy, gb)


def run_conv_plan(op: str, x, w, y, spec, plan_index: int) -> None:
    """Run one given candidate plan of a convolution op (for tests and tuning), roles as in
    ConvProblem: fprop writes y, dgrad writes x, wgrad writes w. No bias."""
    _conv(op, x, w, y, spec, plan_index=plan_index)


def conv_plans(op: str, x_shape, w_shape, spec, dtype=np.float32, layout: str = "nchw") -> list:
    """The measured plan table of a convolution op: [(plan_index, workspace_bytes, time_ms)].

    x_shape (N, C, H, W) and w_shape (O, C/groups, KH, KW) are the forward shapes for all three
    ops; image, filter and output are `dtype` arrays laid out as `layout` says (mapformat), as
    a step with maps of that dtype and layout runs them, so the table is that step's problem's.
    A problem not yet seen is measured now on temporary arrays (allocated from CuPy, i.e.
    the arena). When cuDNN cannot run the groups together the table is the per-group graph's,
    with times multiplied by the number of groups. Plans that could not run have time inf,
    plans not measured (ranked past cudnn_conv.MEASURED_PLANS) NaN.
    """
    n, c, h, wd = (int(d) for d in x_shape)
    o, _, kh, kw = (int(d) for d in w_shape)
    oh = out_size(h, kh, spec.stride[0], spec.padding[0], spec.dilation[0])
    ow = out_size(wd, kw, spec.stride[1], spec.padding[1], spec.dilation[1])
    dtype = np.dtype(dtype)
    shapes = (x_shape, w_shape, (n, o, oh, ow))
    known = _cache().lookup(ConvProblem.of(
        op, *(_Layout(s, dtype, layout) for s in shapes), spec, _state["math"],
        _state["deterministic"]))
    if known is not None:
        return [(p.index, p.workspace_bytes, p.time_ms) for p in known.table]
    with _cudnn_stream():
        x, w, y = (_filled(s, dtype, layout) for s in shapes)
        entry, parts = _entry_and_parts(op, x, w, y, spec)
    factor = len(parts)
    return [(p.index, p.workspace_bytes, p.time_ms * factor) for p in entry.table]


def _filled(shape, dtype, layout: str):
    """A temporary array of logical `shape` in `layout`, every byte 0x3C: about 0.0115 as a
    float32 or a bf16, finite and not zero (the plans' times do not depend on the values)."""
    size = int(np.prod(shape)) * dtype.itemsize
    return shaped(cp.full(size, 0x3C, dtype=np.uint8), shape, dtype, layout)


class _Layout:
    """Shape, strides (in bytes, as CuPy's) and dtype of an array of logical `shape` laid out
    as `layout` says, not allocated (for cache look-ups)."""

    def __init__(self, shape, dtype, layout: str = "nchw"):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.strides = tuple(s * self.itemsize for s in layout_strides(shape, layout))


def conv_cache_stats() -> dict:
    """Counters of the current device's plan cache: graphs_built, plans_measured, hits,
    build_s, measure_s, and entries (problems cached)."""
    c = _cache()
    return dict(c.stats, entries=len(c))


def conv_cache_entries() -> list:
    """The cached ConvEntry objects (problem, graph, table, chosen plans) of this device."""
    return _cache().entries()


def clear_conv_cache() -> None:
    """Forget every graph and measurement (the next call of each shape measures again)."""
    _ready.clear()
    _fallback_keys.clear()
    workspace_fallbacks.clear()
    _cache().clear()


# ---- ops without a native kernel here fall back to the reference (runs on CuPy arrays) --------
FALLBACK_OPS = tuple(
    name for name, obj in vars(_cpu).items()
    if not name.startswith("_") and callable(obj)
    and getattr(obj, "__module__", "") == _cpu.__name__ and name not in globals())
for _name in FALLBACK_OPS:
    globals()[_name] = getattr(_cpu, _name)
