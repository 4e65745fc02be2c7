"""Which convolution fusions the cuDNN frontend offers on this GPU, and what they cost.

For each VGG-16 convolution at batch 256 (NHWC, bf16 maps summed in float32, and float32
maps in TF32) it builds and times, with the note filters minidnn uses:
  fprop               y = conv(x, w)                                   (what minidnn runs)
  fprop+bias+relu     y = max(conv(x, w) + b, 0), one rounding         (a fused epilogue)
  dgrad               dx = conv^T(dy, w)
  dgrad+drelu         dx = conv^T(dy, w) * (y_prev > 0)                (the previous ReLU's mask)
each once with the precompiled engines only and once with runtime-compiled ones allowed, and
prints candidates, build seconds and the best of the first few plans' times. The
pointwise pass the fusion would replace is timed too (a CuPy kernel: y = max(y + b, 0)).
"""
import sys
import time

import cupy as cp

sys.path.insert(0, ".")
from minidnn.kernels.cudnn_conv import load_cudnn  # noqa: E402

cudnn = load_cudnn()
handle = cudnn.create_handle()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 256
SHAPES = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56),
          (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 14)]
MAX_PLANS = 4
MAX_RUNTIME_PLANS = 2


def nhwc(n, c, h, w):
    return [n, c, h, w], [c * h * w, 1, w * c, c]


def timed(fn, reps=5):
    fn()
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / reps


def build(kind, dt_name, c, o, h, runtime):
    dt = cudnn.data_type.BFLOAT16 if dt_name == "bf16" else cudnn.data_type.FLOAT
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32,
                      handle=handle)
    conv = dict(padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=f32)
    xd, xs = nhwc(N, c, h, h)
    yd, ys = nhwc(N, o, h, h)
    w = g.tensor(name="w", dim=[o, c, 3, 3], stride=[c * 9, 1, 3 * c, c], data_type=dt)
    t = {"w": w}
    if kind.startswith("fprop"):
        t["x"] = g.tensor(name="x", dim=xd, stride=xs, data_type=dt)
        y = g.conv_fprop(image=t["x"], weight=w, **conv)
        if kind == "fprop+bias+relu":
            y.set_data_type(f32)
            t["b"] = g.tensor(name="b", dim=[1, o, 1, 1], stride=[o, 1, o, o], data_type=f32)
            y = g.relu(input=g.bias(input=y, bias=t["b"]))
        y.set_output(True).set_dim(yd).set_stride(ys).set_data_type(dt)
        t["y"] = y
    else:
        t["dy"] = g.tensor(name="dy", dim=yd, stride=ys, data_type=dt)
        dx = g.conv_dgrad(loss=t["dy"], filter=w, **conv)
        if kind == "dgrad+drelu":
            dx.set_data_type(f32)
            t["yp"] = g.tensor(name="yp", dim=xd, stride=xs, data_type=dt)
            dx = g.relu_backward(loss=dx, input=t["yp"])
        dx.set_output(True).set_dim(xd).set_stride(xs).set_data_type(dt)
        t["dx"] = dx
    g.validate()
    g.build_operation_graph()
    notes = ["DOWN_CONVERT_INPUTS"] + (["REDUCED_PRECISION_REDUCTION"] if dt_name == "bf16" else [])
    g.deselect_numeric_notes([getattr(cudnn.numerical_note, n) for n in notes])
    if not runtime:
        g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, t


def measure(kind, dt_name, c, o, h, runtime):
    t0 = time.perf_counter()
    try:
        g, t = build(kind, dt_name, c, o, h, runtime)
    except Exception as exc:  # noqa: BLE001 - a probe reports what cuDNN says
        return f"not supported ({str(exc).splitlines()[0][:90] if str(exc) else type(exc).__name__})"
    count = g.get_execution_plan_count()
    item = 2 if dt_name == "bf16" else 4
    sizes = {"x": N * c * h * h, "yp": N * c * h * h, "dx": N * c * h * h, "w": o * c * 9,
             "y": N * o * h * h, "dy": N * o * h * h}
    bufs = {k: cp.zeros(sizes[k] * item // 2 + 1, dtype=cp.float16) if k != "b" else None
            for k in t if k != "b"}
    for k in ("x", "dy", "yp", "w"):
        if k in bufs:
            bufs[k][:] = cp.random.standard_normal(bufs[k].size).astype(cp.float16) * 0.1
    if "b" in t:
        bufs["b"] = cp.random.standard_normal(o).astype(cp.float32)
    pack = {t[k]: bufs[k].data.ptr for k in t}
    built, best, name = 0, float("inf"), ""
    for i in range(count):
        if built >= (MAX_RUNTIME_PLANS if runtime else MAX_PLANS):
            break
        try:
            g.build_plan_at_index(i)
            ws = int(g.get_workspace_size_plan_at_index(i))
            space = cp.empty(max(ws, 1), dtype=cp.uint8)
            built += 1
            ms = timed(lambda: g.execute_plan_at_index(pack, workspace=space.data.ptr, index=i,
                                                       handle=handle))
            if ms < best:
                best, name = ms, g.get_plan_name_at_index(i)
        except Exception:  # noqa: BLE001
            continue
    return (f"{count:3d} offered, {built} built in {time.perf_counter() - t0:6.2f} s, "
            f"best {best:7.3f} ms  {name[:60]}")


def pointwise_ms(dt_name, o, h):
    dtype = cp.float32 if dt_name == "tf32" else cp.float16  # bf16 traffic: 2-byte values
    y = cp.random.standard_normal((N, h, h, o)).astype(dtype)
    b = cp.zeros(o, dtype=dtype)
    k = cp.ElementwiseKernel("T b", "T y", "float v = (float)y + (float)b; y = (T)(v > 0.f ? v : 0.f)", "bias_relu_probe")
    return timed(lambda: k(b, y))


for dt_name in ("bf16", "tf32"):
    for c, o, h in (SHAPES if dt_name == "bf16" else SHAPES[1::3]):
        print(f"== {dt_name} conv {c}->{o} at {h}x{h}, batch {N}; bias+relu pass alone "
              f"{pointwise_ms(dt_name, o, h):.3f} ms", flush=True)
        for kind in ("fprop", "fprop+bias+relu", "dgrad", "dgrad+drelu"):
            if kind.startswith("dgrad") and c == 3:
                continue
            for runtime in (False, True):
                if kind in ("fprop", "dgrad") and runtime:
                    continue
                label = f"{kind}{' (runtime-compiled allowed)' if runtime else ''}"
                print(f"  {label:45s} {measure(kind, dt_name, c, o, h, runtime)}", flush=True)
