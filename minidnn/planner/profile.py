"""The profiling pass: measure what each layer costs on this device, once, and cache it on disk.

    prof = get_profile(net, batch, device)        # measured on first use, then read from disk

For every layer of the network (one at a time, so a network far larger than the device can
still be profiled) the pass builds the layer's input, output, aux and gradient buffers on the
device and times its forward and backward, for each convolution plan setting ('fastest',
'min_workspace') on convolutions; it reads each setting's cuDNN workspace from the kernels'
measured plan table (`conv_plans`), and adds the workspace limits between the two that trade
memory for time (`fastest<=BYTES`, timed from the plan table's differences), and apart the
pass adding a convolution's bias, which a step whose ReLU adds it does not make. It measures the
host's time to issue each call, one SGD step, the pinned copy bandwidth device -> host,
host -> device and both at once, and how much longer a call takes among a pass's other
calls than alone (measure_call_gap).

Times: on a GPU, CUDA events around `repeats` back-to-back calls on the compute stream,
captured as a CUDA graph and replayed as a replayed step runs them (or, where they cannot be
captured, issued while the stream is held busy so that the host is ahead of the device), and
the host clock for the time to issue them; on the CPU, where the host does the work,
wall-clock time (and the host's issue time is the memory manager's bookkeeping alone,
measured in a dry run).

Cache: JSON files under `$MINIDNN_CACHE/profiles/` (default `~/.cache/minidnn/profiles/`),
named by network, batch and device, keyed by a hash of the network's structure, the batch,
the device's name, the library versions (CuPy, cuDNN, the cuDNN frontend, CUDA, NumPy,
minidnn), the math mode and the way layers are timed (TIMING_METHOD): a change to any of
them measures again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import kernels as kernel_modules
from ..backend import Device, select_device
from ..errors import ConfigError
from ..kernels import mapformat
from ..kernels.mapformat import MapFormat
from ..layers import precision as mixed
from ..layers.base import Parameter, StepContext
from ..layers.conv import parse_plan_setting, plan_setting
from ..memory.plan import LivenessPlan
from ..network import LABEL
from ..kernels.math_mode import kernel_settings
from ..version import __version__
from .costs import (ALGOS, IN_PLACE_ADD_SHARE, LayerCost, Profile, in_place_gradients,
                    numel, structure_hash, weight_copy_shapes)

DEFAULT_REPEATS = {"gpu": 5, "cpu": 2}
# How layers are timed, in the cache key: a profile cached by an earlier way of timing them
# is measured again (2: the stream held while the host issues the timed calls; 3: the calls
# replayed from a CUDA graph, _Clock; 4: a convolution's plan tables, which give its
# workspace ladder, of the maps' layout and dtype, where they were NCHW float32's; 5: the
# parameters laid out as the run lays them out, so a channels-last convolution is timed with
# its weights channels last, where they were C order: another cuDNN problem; 6: a later
# pass's gradient adds without those a layer adds in place, and on the GPU fully connected
# products in the kernels' math mode, which a process that never called configure ran in
# strict FP32; 7: a bf16 product timed reading its weight's bf16 copy as a step's calls share
# it, where each call made its own: the copies are timed apart, once, Profile.weight_copy_s;
# 8: each copy's fixed latency and an event's crossing between engines,
# Profile.d2h_latency_s / h2d_latency_s / sync_latency_s; 9: what a call takes beyond its time
# alone among a pass's other calls, Profile.call_gap_s; 10: the pass adding a convolution's
# bias, LayerCost.bias_s).
TIMING_METHOD = 10
# measure_call_gap: the bytes a pass's buffers may take at once, and its timed passes.
CALL_GAP_BYTES = 2 * 2**30
CALL_GAP_REPEATS = 10
BANDWIDTH_BYTES = {"gpu": 256 * 2**20, "cpu": 32 * 2**20}
LATENCY_BYTES = 4096     # a copy whose bytes take a small part of its time


# ---- the cache -----------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where profiles are kept: $MINIDNN_CACHE/profiles, else ~/.cache/minidnn/profiles."""
    root = os.environ.get("MINIDNN_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "minidnn"
    return base / "profiles"


def library_versions(device: Device) -> dict:
    """Versions of everything a measurement depends on besides the network and the GPU."""
    v = {"minidnn": __version__, "numpy": np.__version__}
    if device.is_gpu:
        import cupy
        v["cupy"] = cupy.__version__
        try:
            v["cuda_runtime"] = int(cupy.cuda.runtime.runtimeGetVersion())
            v["cuda_driver"] = int(cupy.cuda.runtime.driverGetVersion())
        except Exception:  # a CuPy without these queries: the other versions still key it
            pass
        try:
            from ..kernels.cudnn_conv import load_cudnn
            cudnn = load_cudnn()   # the cuDNN of the 'gpu' extra, as the kernels load it
            v["cudnn_frontend"] = getattr(cudnn, "__version__", "?")
            v["cudnn"] = int(cudnn.backend_version())
        except Exception:  # no cuDNN to load: convolutions cannot run, the key says so
            v["cudnn"] = None
    return v


def profile_key(net, batch: int, device_name: str, versions: dict, settings: dict,
                relu_bits=frozenset()) -> tuple:
    """(key, fields): a 16-hex-digit hash of everything a profile depends on, and those things."""
    fields = {"structure": structure_hash(net, batch, relu_bits), "batch": int(batch),
              "device": device_name, "versions": versions, "settings": settings,
              "timing": TIMING_METHOD}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return key, fields


def profile_path(net, batch: int, device_name: str, key: str, directory=None) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    return Path(directory or cache_dir()) / f"{net.name}-b{int(batch)}-{slug}-{key}.json"


def save_profile(profile: Profile, path) -> None:
    from ..checkpoint import atomic_write
    text = json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n"
    atomic_write(str(path), lambda f: f.write(text.encode()))


def load_profile(path) -> Profile:
    """A profile from a JSON file (ConfigError if it is not one)."""
    try:
        with open(path) as f:
            return Profile.from_json(json.load(f))
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"cannot read a profile from {str(path)!r}: {e}") from e


def get_profile(net, batch: int, device: Device | str = "auto", refresh: bool = False,
                directory=None, repeats: int | None = None, log=None,
                relu_bits=frozenset(), maps: MapFormat | None = None) -> Profile:
    """The measured profile of `net` at `batch` on `device` under the kernels' current math
    mode, with the ReLUs `relu_bits` keeping bit masks (a decision's relu_bits) and feature
    maps stored as `maps` says (layout and precision; None: NCHW float32): from the cache
    when its key matches, else measured now and cached."""
    device = device if isinstance(device, Device) else select_device(device)
    kernels = kernel_modules.for_device(device)
    maps = maps or MapFormat()
    settings = dict(kernel_settings(kernels), layout=maps.layout, precision=maps.precision)
    key, fields = profile_key(net, batch, device.name, library_versions(device), settings,
                              relu_bits)
    path = profile_path(net, batch, device.name, key, directory)
    if path.exists() and not refresh:
        try:
            prof = load_profile(path)
        except ConfigError as e:  # a corrupt or outdated file: measure again, overwriting it
            if log:
                log(f"cached profile is unreadable, measuring again: {e}")
        else:
            if prof.key == key:
                return prof
    if log:
        log(f"profiling {net.name} at batch {batch} on {device.name} (cached in {path})")
    prof = measure_profile(net, batch, device, repeats=repeats, relu_bits=relu_bits, maps=maps)
    prof.key, prof.key_fields = key, fields
    save_profile(prof, path)
    return prof


# ---- measuring -----------------------------------------------------------------------------------
class _Clock:
    """Times `repeats` back-to-back calls: device time by events (GPU) or wall clock (CPU),
    and the host's time to issue them.

    On a GPU the calls are captured once as a CUDA graph and the graph is replayed between
    two events, as a step replayed from a graph runs them (step_graph.py): launched one by
    one from the host, short kernels cost the device more (on an H200, timing calls replayed
    lowered the predicted steps of passes of 4 to 32 images by up to 6%). The host's time is
    that of issuing the captured calls.
    A call that cannot be captured is timed launched from the host instead, with the stream
    held (kernels/cuda_hold.py) while the host issues them, so that a call the host issues
    more slowly than the device runs it is still timed at the device's rate: the hold lasts
    HOLD_MARGIN times the host's issue time of the previous timing (at least MIN_HOLD_S),
    and a timing whose issue outlasted its hold is taken again with a hold long enough."""

    MIN_HOLD_S = 0.5e-3
    HOLD_MARGIN = 2.0

    def __init__(self, device: Device):
        self.device = device
        self._issue_s = 0.0      # the host's time to issue the last timing's calls

    def __call__(self, fn, repeats: int, warmup: int = 1) -> tuple[float, float]:
        """(device seconds, host seconds) per call of fn()."""
        for _ in range(warmup):
            fn()
        if not self.device.is_gpu:
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            return (time.perf_counter() - t0) / repeats, 0.0
        replayed = self._time_replayed(fn, repeats)
        if replayed is not None:
            return replayed
        held = max(self.MIN_HOLD_S, self.HOLD_MARGIN * self._issue_s)
        device_s, self._issue_s = self._time_held(fn, repeats, held)
        if self._issue_s > held:     # the device caught up with the host: time it again
            device_s, self._issue_s = self._time_held(
                fn, repeats, self.HOLD_MARGIN * self._issue_s)
        return device_s / repeats, self._issue_s / repeats

    def _time_replayed(self, fn, repeats: int) -> tuple[float, float] | None:
        """(device seconds, host seconds) per call of `repeats` calls captured as one CUDA
        graph and replayed, or None where they cannot be captured. The warm-up call before
        left the blocks the calls take in CuPy's pool, so the capture allocates nothing new."""
        import cupy
        dev = self.device
        stream = dev.compute
        dev.synchronize()
        try:
            with stream:
                stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
                t0 = time.perf_counter()
                try:
                    for _ in range(repeats):
                        fn()
                finally:
                    host = time.perf_counter() - t0
                    graph = stream.end_capture()
            graph.upload(stream)
            graph.launch(stream)             # the first replay sets the graph up
            start, end = dev.timing_event(), dev.timing_event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
        except Exception:   # noqa: BLE001 -- not capturable: timed as launched (the caller)
            dev.synchronize()
            return None
        return cupy.cuda.get_elapsed_time(start, end) / 1e3 / repeats, host / repeats

    def _time_held(self, fn, repeats: int, held: float) -> tuple[float, float]:
        """(device seconds, host seconds) of `repeats` calls issued behind a hold of `held`."""
        import cupy
        from ..kernels.cuda_hold import hold
        dev = self.device
        dev.compute.synchronize()
        start, end = dev.timing_event(), dev.timing_event()
        with dev.compute:
            hold(held)
        start.record(dev.compute)
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        host = time.perf_counter() - t0
        end.record(dev.compute)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3, host


def _random(xp, shape, dtype, rng):
    """Standard normal values of `shape` made where they will be used: on a GPU by CuPy's
    generator (drawing VGG-16's batch-256 maps on the host, in float64, then copying them
    over would take minutes), on the CPU by NumPy's, both directly in `dtype`."""
    if not shape:
        return xp.asarray(np.asarray(1.0, dtype))
    if xp is np:
        return rng.standard_normal(shape, dtype=dtype)
    return xp.random.default_rng(int(rng.integers(2**31))).standard_normal(shape, dtype=dtype)


def _random_map(xp, shape, dtype, rng, maps: MapFormat, kernels):
    """Standard normal values of `shape` stored as the executor stores a feature map: in
    `maps`' layout and dtype (bf16 rounded from float32 by the kernels)."""
    values = mapformat.empty(xp, shape, dtype, maps.layout)
    values[...] = _random(xp, shape, dtype, rng)
    if maps.precision == "fp32":
        return values
    out = mapformat.empty(xp, shape, maps.map_dtype(dtype), maps.layout)
    kernels.float_to_bf16(values, out)
    return out


def _layer_buffers(i, node, plan, shapes, xp, rng, num_classes, kernels):
    """(xs, y, aux, gy, gxs) of node i on the device, shared the way the executor shares them
    and stored in its format (plan.maps: layout and precision)."""
    maps, dtype = plan.maps, plan.net.dtype
    map_dtype = maps.map_dtype(dtype)
    xs = []
    for name in node.inputs:
        if name == LABEL:
            xs.append(xp.asarray(rng.integers(0, num_classes, shapes[LABEL]).astype(np.int64)))
        else:
            xs.append(_random_map(xp, shapes[name], dtype, rng, maps, kernels))
    out_shape = shapes[node.name]
    if plan.inplace.get(i):
        y = xs[0].reshape(out_shape)
    else:
        y = mapformat.empty(xp, out_shape, map_dtype, maps.layout)
    aux = {}
    for a, (s, dt) in plan.aux_specs(i).items():
        aux[a] = mapformat.empty(xp, s, dt, maps.layout)
        aux[a][...] = 0
    gy = (_random_map(xp, out_shape, dtype, rng, maps, kernels) if out_shape
          else xp.ones((), dtype=dtype))
    gxs = []
    for k, name in enumerate(node.inputs):
        if not plan.wants_grad(node, k):
            gxs.append(None)
        elif k == 0 and plan.grad_alias.get(i):
            gxs.append(gy.reshape(shapes[name]))
        else:
            gxs.append(mapformat.empty(xp, shapes[name], map_dtype, maps.layout))
    return xs, y, aux, gy, gxs


def _conv_tables(kernels, layer, node, maps: MapFormat) -> dict:
    """{op: [PlanTiming]}: the kernels' measured plan tables of the convolution ops a conv layer
    runs (fprop; wgrad; dgrad when its input wants a gradient) on maps stored as `maps` says
    (the problems the step runs: the layout and dtype choose cuDNN's plans and workspaces), or
    {} for kernels without cuDNN plans (the CPU)."""
    conv_plans = getattr(kernels, "conv_plans", None)
    if conv_plans is None:
        return {}
    from ..kernels.cudnn_conv import PlanTiming
    ops = ["fprop", "wgrad"] + (["dgrad"] if LivenessPlan.wants_grad(node, 0) else [])
    return {op: [PlanTiming(*t) for t in conv_plans(op, layer.in_shapes[0],
                                                    layer.params["weight"].shape, layer.spec,
                                                    dtype=maps.map_dtype(layer.dtype),
                                                    layout=maps.layout)]
            for op in ops}


def _conv_settings(layer, node, ctx, deterministic, run, maps: MapFormat) -> tuple:
    """(forward_s, backward_s, workspace_forward, workspace_backward, host times) of a conv
    layer under each plan setting: 'fastest' and 'min_workspace' timed by running the layer,
    and the workspace limits between them (cudnn_conv.workspace_ladder) from the fastest
    setting's times and the plan tables' measured differences, without running them again."""
    from ..kernels.cudnn_conv import choose_plans, workspace_ladder
    fwd, bwd, ws_f, ws_b = {}, {}, {}, {}
    host = (0.0, 0.0)
    for algo in ALGOS:
        layer.plan_setting = algo
        fwd[algo], bwd[algo], host = run()
    tables = _conv_tables(ctx.kernels, layer, node, maps)
    if not tables:
        return fwd, bwd, {a: 0 for a in ALGOS}, {a: 0 for a in ALGOS}, host
    where = f"profile of {layer.name}"
    settings = list(ALGOS) + [plan_setting("fastest", limit)
                              for limit in workspace_ladder(tables, by_rank=deterministic)]
    fastest = choose_plans(tables, "fastest", deterministic, where)
    for setting in settings:
        algo, limit = parse_plan_setting(setting)
        chosen = choose_plans(tables, algo, deterministic, where, workspace_limit=limit)
        backward_ops = [op for op in chosen if op != "fprop"]
        if setting not in fwd:
            fwd[setting] = fwd["fastest"] + \
                (chosen["fprop"].time_ms - fastest["fprop"].time_ms) / 1e3
            bwd[setting] = bwd["fastest"] + sum(chosen[op].time_ms - fastest[op].time_ms
                                                for op in backward_ops) / 1e3
        ws_f[setting] = chosen["fprop"].workspace_bytes
        ws_b[setting] = max(chosen[op].workspace_bytes for op in backward_ops)
    return fwd, bwd, ws_f, ws_b, host


def _manager_overhead(net, batch: int) -> float:
    """Host seconds the memory manager spends per layer call (its bookkeeping, from dry runs)."""
    from ..executor import Executor
    ex = Executor(net, batch, device="cpu", compute=False)
    ex.simulate_step()
    t0 = time.perf_counter()
    steps = 3
    for _ in range(steps):
        ex.simulate_step()
    return (time.perf_counter() - t0) / (steps * 2 * len(net.nodes))


def _measuring(net, batch: int, device: Device, maps, relu_bits) -> tuple:
    """(plan, shapes, rng, ctx) that a profile's layer calls are built from: each layer as
    the unfused step calls it (the step model weighs the fusions), in a training context."""
    plan = LivenessPlan(net, batch, relu_bits=relu_bits, maps=maps, fuse=False)
    ctx = StepContext(device.xp, kernels=kernel_modules.for_device(device), train=True, step=0,
                      seed=0, device=device, relu_bits=plan.relu_bits)
    return plan, net.infer_shapes(batch), np.random.default_rng(0), ctx


def _layer_calls(i, node, plan, shapes, ctx, rng, num_classes) -> tuple:
    """(forward, backward, bias): node i's two calls as the executor makes them (through the
    mixed-precision boundary), on buffers that live as long as the calls; bias: of a
    convolution with a bias, the pass adding it inside its forward (LayerCost.bias_s), else
    None."""
    layer = node.layer
    xs, y, aux, gy, gxs = _layer_buffers(i, node, plan, shapes, ctx.xp, rng, num_classes,
                                         ctx.kernels)
    bxs = [x if k in layer.retain_inputs else None for k, x in enumerate(xs)]
    by = y if plan.retains_output(i) else None
    bias = None
    if layer.kind == "conv" and layer.bias:
        def bias():
            ctx.kernels.bias_add(y, layer.params["bias"].data)
    return (lambda: mixed.forward(layer, xs, y, aux, ctx),
            lambda: mixed.backward(layer, bxs, by, gy, gxs, aux, ctx), bias)


def _place_parameters(node, net, plan, xp, rng) -> None:
    """Parameters of the right shape, laid out as the run lays them out (a convolution's
    weights as the maps: Assembly._place_parameters), so that a convolution is timed on the
    cuDNN problem the run runs; their values do not change the time."""
    for p in node.layer.params.values():
        p.data = mapformat.empty(xp, p.shape, net.dtype, plan.maps.layout)
        p.data[...] = _random(xp, p.shape, net.dtype, rng) * net.dtype.type(0.01)
        p.grad = mapformat.empty(xp, p.shape, net.dtype, plan.maps.layout)
    for b in node.layer.buffers.values():
        b.data = xp.asarray(b.initial_value(net.dtype))


def _measure_layer(i, node, plan, shapes, ctx, clock, repeats, rng, num_classes,
                   deterministic) -> LayerCost:
    """The LayerCost of node i (its host times without the manager's), on buffers that
    live only inside this call."""
    forward, backward, bias = _layer_calls(i, node, plan, shapes, ctx, rng, num_classes)

    def run() -> tuple:
        f, hf = clock(forward, repeats)
        b, hb = clock(backward, repeats)
        return f, b, (hf, hb)

    if node.layer.kind == "conv":
        fwd, bwd, ws_f, ws_b, (hf, hb) = _conv_settings(node.layer, node, ctx, deterministic,
                                                        run, plan.maps)
    else:
        f, b, (hf, hb) = run()
        fwd, bwd, ws_f, ws_b = {"fastest": f}, {"fastest": b}, {"fastest": 0}, {"fastest": 0}
    own = clock(bias, repeats)[0] if bias is not None else 0.0
    return LayerCost(fwd, bwd, ws_f, ws_b, {"forward": hf, "backward": hb}, own)


def measure_layers(net, batch: int, device: Device, repeats: int | None = None,
                   progress: bool = True, relu_bits=frozenset(),
                   maps: MapFormat | None = None) -> dict:
    """{node name: LayerCost} measured on `device` (see the module docstring), the ReLUs
    `relu_bits` keeping bit masks, feature maps stored as `maps` says (None: NCHW float32).
    progress: a progress bar on stderr, one tick per layer (a first convolution of each
    shape also measures every cuDNN plan, which takes seconds)."""
    from tqdm import tqdm
    kernels = kernel_modules.for_device(device)
    deterministic = kernel_settings(kernels)["deterministic"]
    repeats = repeats or DEFAULT_REPEATS[device.kind]
    plan, shapes, rng, ctx = _measuring(net, batch, device, maps, relu_bits)
    xp, num_classes = device.xp, shapes[net.output][-1]
    clock = _Clock(device)
    manager_s = _manager_overhead(net, batch)
    costs = {}
    with _net_state_kept(net), device.compute:
        bar = tqdm(net.nodes, desc=f"profiling {net.name} b{batch}", unit="layer",
                   disable=None if progress else True, leave=False)  # None: off without a terminal
        for i, node in enumerate(bar):
            bar.set_postfix_str(node.name)
            _place_parameters(node, net, plan, xp, rng)
            # A step's calls share one bf16 copy of each weight (made once a step:
            # measure_weight_copies): the warm-up call makes it, the timed calls read it.
            with kernels.shared_weight_copies():
                cost = _measure_layer(i, node, plan, shapes, ctx, clock, repeats, rng,
                                      num_classes, deterministic)
            costs[node.name] = replace(cost, host_s={
                phase: s + manager_s for phase, s in cost.host_s.items()})
            for p in node.layer.params.values():
                p.data = p.grad = None
            _release_pool(device)
    return costs


@contextlib.contextmanager
def _net_state_kept(net):
    """The network's parameters, running statistics and convolution plan settings as they
    were when the block ends (a profile puts measuring ones in their place)."""
    saved = [(p, p.data, p.grad) for _, p in net.parameters()]
    saved_buffers = [(b, b.data) for _, b in net.buffers()]   # running statistics forward moves
    saved_settings = {n.name: n.layer.plan_setting for n in net.nodes if n.layer.kind == "conv"}
    try:
        yield
    finally:
        for p, data, grad in saved:
            p.data, p.grad = data, grad
        for b, data in saved_buffers:
            b.data = data
        for name, setting in saved_settings.items():
            net.node(name).layer.plan_setting = setting


def pass_bytes(net, batch: int, maps: MapFormat) -> int:
    """Device bytes of every layer's buffers at once (each input, output and their
    gradients) and of the parameters with their gradients: what measure_call_gap holds."""
    shapes = net.infer_shapes(batch)
    item = np.dtype(maps.map_dtype(net.dtype)).itemsize
    maps_n = sum(2 * (sum(numel(shapes[x]) for x in n.inputs) + numel(shapes[n.name]))
                 for n in net.nodes)
    params_n = sum(2 * numel(p.shape) for _, p in net.parameters())
    return maps_n * item + params_n * np.dtype(net.dtype).itemsize


def pass_calls(net, batch: int, device: Device, maps: MapFormat,
               relu_bits=frozenset()) -> list:
    """[(label, call)]: one pass of `net` at `batch` as measure_call_gap times it, every
    forward in order, then every backward in reverse, each convolution on its fastest plan,
    nothing fused, each call on buffers of its own. It puts parameters of its own in the
    network (_net_state_kept gives the network's back)."""
    plan, shapes, rng, ctx = _measuring(net, batch, device, maps, relu_bits)
    forwards, backwards = [], []
    for i, node in enumerate(net.nodes):
        _place_parameters(node, net, plan, device.xp, rng)
        if node.layer.kind == "conv":
            node.layer.plan_setting = "fastest"
        forward, backward, _ = _layer_calls(i, node, plan, shapes, ctx, rng,
                                            shapes[net.output][-1])
        forwards.append((f"{node.name}.forward", forward))
        backwards.append((f"{node.name}.backward", backward))
    return forwards + backwards[::-1]


def measure_call_gap(net, batch: int, device: Device, maps: MapFormat | None = None,
                     relu_bits=frozenset(), repeats: int = CALL_GAP_REPEATS) -> tuple:
    """(seconds, batch measured at): how much longer a layer call takes in a pass, among
    the network's other calls, than replayed back to back alone (Profile.call_gap_s).

    A pass's calls (every forward in order, every backward in reverse, each convolution on
    its fastest plan, nothing fused) are captured `repeats` times as one CUDA graph, as a
    step replays them, and that replay is set beside the sum of the same calls each timed
    alone (_Clock): the difference over the calls. On an H200, AlexNet's pass of 4 images
    takes 1.9 us (fp32) and 2.0 us (bf16) more a call in sequence, though each call after
    the one before it alone takes what it takes alone: the gap comes with many different
    calls in turn, not with a pair's handover. Every buffer lives at once, so the pass is
    measured at the largest batch of `batch`, batch / 2, batch / 4, ... whose buffers
    (pass_bytes) take at most CALL_GAP_BYTES (an eighth of a smaller device's memory), and
    the gap is taken as the same at the profile's batch, where it is a small part of calls
    that large. 0 on the CPU, whose wall-clock times hold whatever a call costs, and where
    not even one image's pass fits."""
    if not device.is_gpu:
        return 0.0, batch
    maps = maps or MapFormat()
    limit = min(CALL_GAP_BYTES, device_memory_bytes(device) // 8)
    while batch > 1 and pass_bytes(net, batch, maps) > limit:
        batch //= 2
    if pass_bytes(net, batch, maps) > limit:
        return 0.0, 0
    kernels = kernel_modules.for_device(device)
    clock = _Clock(device)
    with _net_state_kept(net), device.compute, kernels.shared_weight_copies():
        calls = [call for _, call in pass_calls(net, batch, device, maps, relu_bits)]
        alone = sum(clock(call, repeats)[0] for call in calls)
        together = clock(lambda: [call() for call in calls], repeats)[0]
    _release_pool(device)
    return max(0.0, (together - alone) / len(calls)), batch


def _release_pool(device: Device) -> None:
    """Give CuPy's cached blocks back to the driver (the executor's arena wants them)."""
    if device.is_gpu:
        import cupy
        device.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


def measure_optimizer(net, device: Device, repeats: int = 3) -> tuple[float, float, float]:
    """(device seconds, host seconds) of one SGD step (momentum, weight decay) over arrays
    shaped like the network's parameters, and the device seconds of adding each gradient into
    another once, as a micro-batch after a step's first does (executor.py: the kernels' add,
    out in place); costs.IN_PLACE_ADD_SHARE of that for a gradient its layer adds to in
    place (Profile.accumulate_s)."""
    from ..optim import SGD
    kernels = kernel_modules.for_device(device)
    xp = device.xp
    in_place = in_place_gradients(net)
    params = []
    with device.compute:
        for name, p in net.parameters():
            q = Parameter(p.shape, "zeros")
            q.data = xp.zeros(p.shape, dtype=net.dtype)
            q.grad = xp.full(p.shape, 1e-3, dtype=net.dtype)
            params.append((name, q))
        opt = SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
        device_s, host_s = _Clock(device)(opt.step, repeats)

        def adds(group):
            for q in group:
                kernels.add(q.data, q.grad, q.data)
        adds_s = 0.0
        for share, added in ((1.0, False), (IN_PLACE_ADD_SHARE, True)):
            group = [q for name, q in params if (name in in_place) == added]
            if group:
                adds_s += share * _Clock(device)(lambda: adds(group), repeats)[0]
    del opt, params
    _release_pool(device)
    return device_s, host_s, adds_s


def measure_weight_copies(net, device: Device, repeats: int = 3) -> float:
    """Device seconds of making the bf16 copy of every weight a bf16 product reads
    (costs.WEIGHT_COPY_KINDS), each once: what a bf16 step on the GPU makes once, the
    passes of its batch sharing them (kernels/cuda_weights.py; Profile.weight_copy_s). 0 on
    the CPU, whose products read the float32 weights."""
    if not device.is_gpu:
        return 0.0
    kernels = kernel_modules.for_device(device)
    xp = device.xp
    with device.compute:
        pairs = [(xp.zeros(shape, dtype=np.float32), xp.empty(shape, dtype=np.uint16))
                 for shape in weight_copy_shapes(net)]

        def copy_all():
            for w, w16 in pairs:
                kernels.float_to_bf16(w, w16)
        seconds = _Clock(device)(copy_all, repeats)[0] if pairs else 0.0
    del pairs
    _release_pool(device)
    return seconds


def measure_bandwidth(device: Device, nbytes: int | None = None,
                      repeats: int = 3) -> tuple[float, float, float]:
    """(device -> host, host -> device, both at once in total) in bytes/s, pinned memory,
    each direction on its own stream as the memory manager copies."""
    nbytes = int(nbytes or BANDWIDTH_BYTES[device.kind])
    if not device.is_gpu:
        a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        np.copyto(b, a)
        t0 = time.perf_counter()
        for _ in range(repeats):
            np.copyto(b, a)
        bw = nbytes * repeats / (time.perf_counter() - t0)
        return bw, bw, bw
    rates = _gpu_copy_rates(device, nbytes, repeats)
    _release_pool(device)
    return rates


def _copy_ends(device: Device, nbytes: int) -> tuple:
    """The two ends of the copies a measurement times: (a device block of `nbytes` bytes,
    made on the compute stream; a pinned host block of as many, which must be kept alive
    while its address is used; that address)."""
    import cupy
    with device.compute:
        on_device = cupy.ones(nbytes, dtype=np.uint8)
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    return on_device, pinned, np.frombuffer(pinned, np.uint8, nbytes).ctypes.data


def _gpu_copy_rates(device: Device, nbytes: int, repeats: int) -> tuple[float, float, float]:
    import cupy
    from cupy.cuda import runtime
    d2h_kind, h2d_kind = 2, 1   # cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice
    dev_a, pinned_a, host_a = _copy_ends(device, nbytes)
    dev_b, pinned_b, host_b = _copy_ends(device, nbytes)
    device.compute.synchronize()
    d2h = (device.offload, host_a, dev_a.data.ptr, d2h_kind)
    h2d = (device.prefetch, dev_b.data.ptr, host_b, h2d_kind)

    def rate(copies) -> float:
        for stream, dst, src, kind in copies:  # once untimed: first-touch costs
            runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
        device.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            for stream, dst, src, kind in copies:
                runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
        for stream, *_ in copies:
            stream.synchronize()
        return len(copies) * nbytes * repeats / (time.perf_counter() - t0)

    return rate([d2h]), rate([h2d]), rate([d2h, h2d])


def measure_copy_latency(device: Device, d2h_bw: float, h2d_bw: float,
                         nbytes: int = LATENCY_BYTES, repeats: int = 256) -> tuple[float, float]:
    """(device -> host, host -> device) seconds each copy takes beyond its bytes at the
    bandwidths given: `repeats` back-to-back pinned copies of `nbytes`, timed as the step's
    copies run (on a GPU captured as a CUDA graph and replayed, _Clock), less nbytes / bw.
    A step of many passes copies thousands of small maps, whose bytes take no longer than
    each copy's latency (Profile.d2h_latency_s)."""
    if not device.is_gpu:
        a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        each = _Clock(device)(lambda: np.copyto(b, a), repeats)[0]
        return max(0.0, each - nbytes / d2h_bw), max(0.0, each - nbytes / h2d_bw)
    import cupy
    from cupy.cuda import runtime
    on_device, pinned, host = _copy_ends(device, nbytes)
    clock = _Clock(device)

    def each(dst, src, kind) -> float:
        def copy():
            runtime.memcpyAsync(dst, src, nbytes, kind, cupy.cuda.get_current_stream().ptr)
        with device.compute:
            return clock(copy, repeats)[0]
    d2h = each(host, on_device.data.ptr, 2)     # cudaMemcpyDeviceToHost
    h2d = each(on_device.data.ptr, host, 1)     # cudaMemcpyHostToDevice
    del on_device
    _release_pool(device)
    return max(0.0, d2h - nbytes / d2h_bw), max(0.0, h2d - nbytes / h2d_bw)


def measure_sync_latency(device: Device, d2h_bw: float, h2d_bw: float, d2h_latency: float,
                         h2d_latency: float, nbytes: int = LATENCY_BYTES,
                         repeats: int = 128) -> float:
    """Seconds after an event on one engine that a stream on another sees it
    (Profile.sync_latency_s): `repeats` round trips, each a one-value kernel on the compute
    stream, a copy of `nbytes` on a copy stream that waits for it and the compute stream
    waiting for the copy (as a map offloaded after its layer and waited for before its memory
    is reused), timed as a replayed step runs them (_Clock), less the kernel alone and the
    copy (its latency and bytes, as measured back to back), halved: two crossings a trip.
    The mean of both directions; 0 on the CPU, where one thread does everything."""
    if not device.is_gpu:
        return 0.0
    import cupy
    from cupy.cuda import runtime
    with device.compute:
        counter = cupy.zeros(1, dtype=np.float32)
    on_device, pinned, host = _copy_ends(device, nbytes)
    clock = _Clock(device)

    def tick():
        cupy.add(counter, 1, out=counter)      # one value: the least a kernel takes

    def round_trip(stream, dst, src, kind):
        there, back = device.event(), device.event()

        def trip():
            here = cupy.cuda.get_current_stream()
            tick()
            there.record(here)
            stream.wait_event(there)
            runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
            back.record(stream)
            here.wait_event(back)
        return clock(trip, repeats)[0]

    with device.compute:
        alone = clock(tick, repeats)[0]
        out = round_trip(device.offload, host, on_device.data.ptr, 2)     # device to host
        back = round_trip(device.prefetch, on_device.data.ptr, host, 1)   # host to device
    crossings = [out - d2h_latency - nbytes / d2h_bw, back - h2d_latency - nbytes / h2d_bw]
    del counter, on_device
    _release_pool(device)
    return max(0.0, (sum(crossings) / 2 - alone) / 2)


def device_memory_bytes(device: Device) -> int:
    if device.is_gpu:
        import cupy
        return int(cupy.cuda.runtime.memGetInfo()[1])
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def untimed_profile(net, batch: int, device: Device | str = "cpu",
                    relu_bits=frozenset()) -> Profile:
    """The profile of `net` at `batch` on a device whose kernels take no workspace (the
    CPU's: NumPy), measured in nothing: what a step's memory reads from a profile
    (workspaces, none; the generator's bytes; temporaries outside the arena; a synchronous
    device) is known without running a layer, and every time is zero. For a prediction of
    memory only (decide.py weighs a vDNN policy's decision with it); ConfigError on a GPU,
    whose cuDNN workspaces are measured."""
    device = device if isinstance(device, Device) else select_device(device)
    if device.is_gpu:
        raise ConfigError("a GPU's convolutions take measured workspaces: measure its profile "
                          "(get_profile)")
    settings = kernel_settings(kernel_modules.for_device(device))
    layers = {}
    for node in net.nodes:
        algos = ALGOS if node.layer.kind == "conv" else ("fastest",)
        zero = {a: 0.0 for a in algos}
        layers[node.name] = LayerCost(dict(zero), dict(zero), {a: 0 for a in algos},
                                      {a: 0 for a in algos})
    return Profile(source="untimed", device_name=device.name, math=settings["math"],
                   network=net.name, batch=int(batch), memory_bytes=device_memory_bytes(device),
                   d2h_bw=1.0, h2d_bw=1.0, duplex_bw=1.0, layers=layers, synchronous=True,
                   temporaries_in_arena=False, generator_bytes=device.generator_bytes,
                   key_fields={"structure": structure_hash(net, batch, relu_bits)},
                   notes=["untimed: memory only"])


def measure_profile(net, batch: int, device: Device | str = "auto",
                    repeats: int | None = None, relu_bits=frozenset(),
                    maps: MapFormat | None = None) -> Profile:
    """Measure the Profile of `net` at `batch` on `device` now, the ReLUs `relu_bits`
    keeping bit masks, the feature maps stored as `maps` says (no cache; see get_profile)."""
    device = device if isinstance(device, Device) else select_device(device)
    kernels = kernel_modules.for_device(device)
    settings = kernel_settings(kernels)
    maps = maps or MapFormat()
    t0 = time.perf_counter()
    layers = measure_layers(net, batch, device, repeats, relu_bits=relu_bits, maps=maps)
    opt_s, opt_host_s, adds_s = measure_optimizer(net, device)
    copies_s = measure_weight_copies(net, device)
    d2h, h2d, both = measure_bandwidth(device)
    d2h_latency, h2d_latency = measure_copy_latency(device, d2h, h2d)
    sync_latency = measure_sync_latency(device, d2h, h2d, d2h_latency, h2d_latency)
    call_gap, gap_batch = measure_call_gap(net, batch, device, maps, relu_bits)
    notes = [f"measured in {time.perf_counter() - t0:.1f} s",
             f"feature maps {maps.layout.upper()}, {maps.precision}"]
    if device.is_gpu:
        notes.append(f"call gap {call_gap * 1e6:.2f} us, measured in passes of {gap_batch}"
                     if gap_batch else "call gap not measured: one image's pass is too large")
    else:
        notes.append("CPU: layer times are wall-clock; copies are memcpy")
    return Profile(source="measured", device_name=device.name, math=settings["math"],
                   network=net.name, batch=int(batch), memory_bytes=device_memory_bytes(device),
                   d2h_bw=d2h, h2d_bw=h2d, duplex_bw=max(both, max(d2h, h2d)),
                   d2h_latency_s=d2h_latency, h2d_latency_s=h2d_latency,
                   sync_latency_s=sync_latency, call_gap_s=call_gap, layers=layers,
                   optimizer_s=opt_s, optimizer_host_s=opt_host_s, accumulate_s=adds_s,
                   weight_copy_s=copies_s, synchronous=not device.is_gpu,
                   temporaries_in_arena=device.is_gpu,
                   generator_bytes=device.generator_bytes,
                   key_fields={"structure": structure_hash(net, batch, relu_bits)},
                   notes=notes)
