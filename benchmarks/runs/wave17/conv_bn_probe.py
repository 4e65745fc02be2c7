"""What cuDNN's fused convolution + batch-norm graphs cost on ResNet-50's convolutions.

For each distinct stride-1 convolution of ResNet-50 at batch 256 (bf16, or float32 maps with
TF32 math: --dtype fp32; NHWC), three cuDNN frontend graphs, every plan cuDNN offers timed,
the fastest kept:

  conv        y = conv(x, w)                                  what minidnn runs today
  conv+stats  y = conv(x, w); sum, sum of squares of y        the batch norm's statistics
                                                              in the convolution's epilogue
  sbr+conv    y = conv(relu(x * s + b), w); sum, sum sq of y  the previous batch norm's
                                                              apply + ReLU in its prologue too

beside the bytes the separate passes they replace move (statistics: read y; apply + ReLU:
read x, write x'), priced at the copy bandwidth measured in the same process. Whether each
graph's fastest plan is compiled at run time is printed too (minidnn excludes those today).

    python3 benchmarks/runs/wave17/conv_bn_probe.py [--batch 256] [--repeats 20] [--max-plans 8]
        [--dtype bf16|fp32] [--modes A,FALLBACK]
"""
import argparse
import time

import cupy as cp

from minidnn.kernels.cudnn_conv import load_cudnn
from minidnn.kernels.nvidia_libraries import preload

# (H=W, in channels, out channels, kernel): ResNet-50's stride-1 convolutions
SHAPES = [(56, 64, 64, 1), (56, 64, 64, 3), (56, 64, 256, 1), (56, 256, 64, 1),
          (28, 128, 128, 3), (28, 128, 512, 1), (28, 512, 128, 1),
          (14, 256, 256, 3), (14, 256, 1024, 1), (14, 1024, 256, 1),
          (7, 512, 512, 3), (7, 512, 2048, 1), (7, 2048, 512, 1)]


def nhwc(n, c, h, w):
    return [n, c, h, w], [h * w * c, 1, w * c, c]


def bf16_random(rng, size, scale):
    """Normal values as bf16 bit patterns (the upper half of each float32)."""
    f = scale * rng.standard_normal((size,), dtype=cp.float32)
    return (f.view(cp.uint32) >> 16).astype(cp.uint16)


def fp32_random(rng, size, scale):
    return scale * rng.standard_normal((size,), dtype=cp.float32)


# --dtype: (the maps' cuDNN type name, random values, an array of n values, one, bytes a value)
DTYPES = {"bf16": ("BFLOAT16", bf16_random, lambda n: cp.empty(n, cp.uint16), 0x3F80, 2),
          "fp32": ("FLOAT", fp32_random, lambda n: cp.empty(n, cp.float32), 1.0, 4)}


def timed(fn, repeats):
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / repeats


def build(cudnn, handle, kind, n, h, ci, co, k, dtype="bf16", modes=("A", "FALLBACK")):
    bf16, f32 = getattr(cudnn.data_type, DTYPES[dtype][0]), cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32,
                      handle=handle)
    dim, st = nhwc(n, ci, h, h)
    x = g.tensor(name="x", dim=dim, stride=st, data_type=bf16)
    dim, st = nhwc(co, ci, k, k)
    w = g.tensor(name="w", dim=dim, stride=st, data_type=bf16)
    t = {"x": x, "w": w}
    inp = x
    if kind == "sbr+conv":
        s = g.tensor(name="s", dim=[1, ci, 1, 1], stride=[ci, 1, ci, ci], data_type=bf16)
        b = g.tensor(name="b", dim=[1, ci, 1, 1], stride=[ci, 1, ci, ci], data_type=bf16)
        t.update(s=s, b=b)
        inp = g.relu(input=g.bias(input=g.scale(input=x, scale=s), bias=b))
    y = g.conv_fprop(image=inp, weight=w, padding=[k // 2] * 2, stride=[1, 1],
                     dilation=[1, 1], compute_data_type=f32)
    dim, st = nhwc(n, co, h, h)
    y.set_output(True).set_dim(dim).set_stride(st).set_data_type(bf16)
    t["y"] = y
    if kind != "conv":
        total, squares = g.genstats(input=y)
        total.set_output(True).set_data_type(f32)
        squares.set_output(True).set_data_type(f32)
        t.update(sum=total, sq=squares)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in modes])
    return g, t


def best_plan(cudnn, g, t, arrays, repeats, max_plans):
    """(ms, plan name, runtime compiled?, plans timed) of the fastest of the first max_plans
    plans that build, in the heuristics' order."""
    pack = {t[name]: arrays[name].data.ptr for name in t}
    best = (float("inf"), "-", False, 0)
    timed_plans = 0
    for i in range(g.get_execution_plan_count()):
        if timed_plans >= max_plans:
            break
        try:
            g.build_plan_at_index(i)
            ws = cp.empty(max(1, int(g.get_workspace_size_plan_at_index(i))), cp.uint8)
            name = g.get_plan_name_at_index(i)
            ms = timed(lambda: g.execute_plan_at_index(pack, workspace=ws.data.ptr, index=i,
                                                       handle=g_handle[0]), repeats)
        except Exception:  # noqa: BLE001 - a plan that does not build or run is skipped
            continue
        timed_plans += 1
        if ms < best[0]:
            rt = False
            try:
                rt = cudnn.behavior_note.RUNTIME_COMPILATION in g.get_behavior_notes_for_plan_at_index(i)
            except Exception:  # noqa: BLE001 - older frontends cannot say
                rt = "?"
            best = (ms, name, rt, timed_plans)
    return best[0], best[1], best[2], timed_plans


g_handle = [None]


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device copy, its read and write both counted."""
    src, dst = cp.empty(1 << 30, cp.uint8), cp.empty(1 << 30, cp.uint8)
    return 2 * src.nbytes / timed(lambda: cp.copyto(dst, src), 10) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-plans", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=400)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--modes", default="A,FALLBACK", help="heuristics modes, e.g. A,B,FALLBACK")
    args = ap.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    _, random, empty, one, size = DTYPES[args.dtype]
    preload("cudnn")
    cudnn = load_cudnn()
    handle = g_handle[0] = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
    n = args.batch
    copy_gbs = copy_bandwidth()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s (read + write)")
    print("| H | in | out | k | conv ms | conv+stats ms | sbr+conv ms | passes saved ms | "
          "gain ms | fastest sbr+conv plan |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    t0 = time.time()
    tot = {"conv": 0.0, "conv+stats": 0.0, "sbr+conv": 0.0, "saved": 0.0}
    for h, ci, co, k in SHAPES:
        if time.time() - t0 > args.time_limit:
            print("time limit reached")
            break
        rng = cp.random.default_rng(0)
        arrays = {"x": random(rng, n * h * h * ci, 1.0),
                  "w": random(rng, co * k * k * ci, 0.05),
                  "y": empty(n * h * h * co),
                  "s": empty(ci), "b": empty(ci),
                  "sum": cp.zeros(co, cp.float32), "sq": cp.zeros(co, cp.float32)}
        arrays["s"][...] = one
        arrays["b"][...] = 0
        row = {}
        for kind in ("conv", "conv+stats", "sbr+conv"):
            try:
                g, t = build(cudnn, handle, kind, n, h, ci, co, k, args.dtype, modes)
                row[kind] = best_plan(cudnn, g, t, arrays, args.repeats,
                                      args.max_plans)
            except Exception as exc:  # noqa: BLE001 - report and go on
                row[kind] = (float("nan"), f"unsupported: {str(exc).splitlines()[0][:60]}", False, 0)
        # bytes of the passes the fused graph replaces: read y (stats), read x + write x' (apply)
        saved_bytes = size * (n * h * h * co) + 2 * size * (n * h * h * ci)
        saved_ms = saved_bytes / (copy_gbs * 1e6)
        gain = row["conv"][0] + saved_ms - row["sbr+conv"][0]
        for key, v in (("conv", row["conv"][0]), ("conv+stats", row["conv+stats"][0]),
                       ("sbr+conv", row["sbr+conv"][0]), ("saved", saved_ms)):
            tot[key] += v
        p = row["sbr+conv"]
        print(f"| {h} | {ci} | {co} | {k} | {row['conv'][0]:.3f} | {row['conv+stats'][0]:.3f} | "
              f"{p[0]:.3f} | {saved_ms:.3f} | {gain:+.3f} | {p[1][:50]} (rt={p[2]}, {p[3]} plans) |",
              flush=True)
    print(f"totals: conv {tot['conv']:.2f} ms, conv+stats {tot['conv+stats']:.2f}, "
          f"sbr+conv {tot['sbr+conv']:.2f}, separate passes {tot['saved']:.2f}")


if __name__ == "__main__":
    main()
