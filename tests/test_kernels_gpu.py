"""GPU kernels (kernels/cuda.py) against float64 NumPy references, and the cuDNN plan cache,
math modes, determinism and streams. Skipped without a CUDA GPU.

The references here are written independently of cpu.py (plain loops over kernel offsets and
output positions, in float64) and are themselves checked: the convolution ones by the adjoint
identities, LRN and avg-pool backward by finite differences. Each GPU op is also compared with
its cpu.py twin.
"""
import numpy as np
import pytest

from minidnn.kernels import ConvSpec, LRNSpec, PoolSpec, out_size

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda = pytest.importorskip("minidnn.kernels.cuda")
from minidnn.kernels import cpu  # noqa: E402

TF32_RTOL, FP32_RTOL, FP64_RTOL = 2e-3, 1e-5, 1e-10


@pytest.fixture(autouse=True)
def default_mode():
    """Each test starts in TF32, non-deterministic mode; the mode in force before (CuPy's
    matmul compute type included) comes back afterwards, so no other test inherits ours."""
    from cupy._core import _routines_linalg as linalg
    before, before_type = cuda.math_mode(), linalg.get_compute_type(np.float32)
    cuda.configure("tf32", deterministic=False)
    yield
    cuda.configure(**before)
    linalg.set_compute_type(np.float32, before_type)


@pytest.fixture
def stream():
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        yield s
    s.synchronize()


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# ---- float64 references -------------------------------------------------------------------------
def _conv_geometry(x_shape, w_shape, stride, pad, dil):
    (n, c, h, w), (o, cg, kh, kw) = x_shape, w_shape
    oh = out_size(h, kh, stride[0], pad[0], dil[0])
    ow = out_size(w, kw, stride[1], pad[1], dil[1])
    return oh, ow


def _taps(kh, kw, stride, dil, oh, ow):
    """(i, j, rows slice, cols slice) into the padded input for every kernel tap."""
    for i in range(kh):
        for j in range(kw):
            yield (i, j, slice(i * dil[0], i * dil[0] + stride[0] * (oh - 1) + 1, stride[0]),
                   slice(j * dil[1], j * dil[1] + stride[1] * (ow - 1) + 1, stride[1]))


def ref_conv(x, w, stride, pad, dil, groups):
    x, w = x.astype(np.float64), w.astype(np.float64)
    oh, ow = _conv_geometry(x.shape, w.shape, stride, pad, dil)
    xp_ = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    o, cg, kh, kw = w.shape
    og = o // groups
    y = np.zeros((x.shape[0], o, oh, ow))
    for g in range(groups):
        xg = xp_[:, g * cg:(g + 1) * cg]
        for i, j, rs, cs in _taps(kh, kw, stride, dil, oh, ow):
            y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", xg[:, :, rs, cs],
                                                   w[g * og:(g + 1) * og, :, i, j])
    return y


def ref_conv_dgrad(gy, w, x_shape, stride, pad, dil, groups):
    gy, w = gy.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    og = o // groups
    oh, ow = gy.shape[2:]
    gxp = np.zeros((n, c, h + 2 * pad[0] + stride[0] * kh, wd + 2 * pad[1] + stride[1] * kw))
    for g in range(groups):
        for i, j, rs, cs in _taps(kh, kw, stride, dil, oh, ow):
            gxp[:, g * cg:(g + 1) * cg, rs, cs] += np.einsum(
                "nohw,oc->nchw", gy[:, g * og:(g + 1) * og], w[g * og:(g + 1) * og, :, i, j])
    return gxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]


def ref_conv_wgrad(x, gy, w_shape, stride, pad, dil, groups):
    x, gy = x.astype(np.float64), gy.astype(np.float64)
    o, cg, kh, kw = w_shape
    og = o // groups
    oh, ow = gy.shape[2:]
    xp_ = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    gw = np.zeros(w_shape)
    for g in range(groups):
        for i, j, rs, cs in _taps(kh, kw, stride, dil, oh, ow):
            gw[g * og:(g + 1) * og, :, i, j] = np.einsum(
                "nchw,nohw->oc", xp_[:, g * cg:(g + 1) * cg, rs, cs], gy[:, g * og:(g + 1) * og])
    return gw


def _pool_windows(x_shape, spec, ceil_mode):
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    oh = out_size(h, kh, sh, ph, 1, ceil_mode)
    ow = out_size(w, kw, sw, pw, 1, ceil_mode)
    return oh, ow


def ref_maxpool(x, spec):
    """(y, argmax) with padding as -inf, first strict maximum wins."""
    n, c, h, w = x.shape
    oh, ow = _pool_windows(x.shape, spec, spec.ceil_mode)
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    y = np.empty((n, c, oh, ow), x.dtype)
    arg = np.empty((n, c, oh, ow), np.uint8)
    for a in range(oh):
        for b in range(ow):
            best = np.full((n, c), -np.inf, x.dtype)
            where = np.zeros((n, c), np.uint8)
            for i in range(kh):
                for j in range(kw):
                    r, s = a * sh - ph + i, b * sw - pw + j
                    v = x[:, :, r, s] if 0 <= r < h and 0 <= s < w else np.full((n, c), -np.inf)
                    if i == j == 0:
                        best = v.astype(x.dtype)
                        continue
                    win = v > best
                    best = np.where(win, v, best)
                    where = np.where(win, i * kw + j, where).astype(np.uint8)
            y[:, :, a, b], arg[:, :, a, b] = best, where
    return y, arg


def ref_maxpool_backward(gy, arg, x_shape, spec):
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    gx = np.zeros((n, c, h + 2 * ph + sh * kh, w + 2 * pw + sw * kw))
    oh, ow = gy.shape[2:]
    for a in range(oh):
        for b in range(ow):
            for i in range(kh):
                for j in range(kw):
                    hit = arg[:, :, a, b] == i * kw + j
                    gx[:, :, a * sh + i, b * sw + j] += np.where(hit, gy[:, :, a, b], 0)
    return gx[:, :, ph:ph + h, pw:pw + w]


def _avg_count(a, b, x_shape, spec):
    h, w = x_shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    hs, ws = a * sh - ph, b * sw - pw
    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
    if spec.count_include_pad:
        return (he - hs) * (we - ws), (hs, ws)
    return (min(he, h) - max(hs, 0)) * (min(we, w) - max(ws, 0)), (hs, ws)


def ref_avgpool(x, spec):
    n, c, h, w = x.shape
    oh, ow = _pool_windows(x.shape, spec, spec.ceil_mode)
    (kh, kw) = spec.kernel
    y = np.zeros((n, c, oh, ow))
    for a in range(oh):
        for b in range(ow):
            count, (hs, ws) = _avg_count(a, b, x.shape, spec)
            rs = slice(max(hs, 0), min(hs + kh, h))
            cs = slice(max(ws, 0), min(ws + kw, w))
            y[:, :, a, b] = x[:, :, rs, cs].astype(np.float64).sum(axis=(2, 3)) / count
    return y


def ref_avgpool_backward(gy, x_shape, spec):
    n, c, h, w = x_shape
    (kh, kw) = spec.kernel
    gx = np.zeros(x_shape)
    for a in range(gy.shape[2]):
        for b in range(gy.shape[3]):
            count, (hs, ws) = _avg_count(a, b, x_shape, spec)
            rs = slice(max(hs, 0), min(hs + kh, h))
            cs = slice(max(ws, 0), min(ws + kw, w))
            gx[:, :, rs, cs] += (gy[:, :, a, b] / count)[:, :, None, None]
    return gx


def ref_lrn(x, spec):
    x = x.astype(np.float64)
    c = x.shape[1]
    before, after = spec.size // 2, (spec.size - 1) // 2
    sq = x * x
    s = np.zeros_like(x)
    for ch in range(c):
        s[:, ch] = sq[:, max(ch - before, 0):min(ch + after, c - 1) + 1].sum(axis=1)
    scale = spec.k + spec.alpha / spec.size * s
    return x * scale ** -spec.beta, scale


def ref_lrn_backward(x, gy, spec):
    """Vector-Jacobian product of ref_lrn by the chain rule written out per channel pair."""
    x, gy = x.astype(np.float64), gy.astype(np.float64)
    c = x.shape[1]
    before, after = spec.size // 2, (spec.size - 1) // 2
    _, s = ref_lrn(x, spec)
    gx = gy * s ** -spec.beta
    for j in range(c):                    # output channel j depends on inputs j-before..j+after
        for i in range(max(j - before, 0), min(j + after, c - 1) + 1):
            gx[:, i] -= (gy[:, j] * x[:, j] * spec.beta * s[:, j] ** (-spec.beta - 1)
                         * 2 * spec.alpha / spec.size * x[:, i])
    return gx


# ---- the references themselves ----------------------------------------------------------------------
def test_conv_references_are_adjoint():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 9, 8))
    w = rng.standard_normal((4, 3, 3, 2))
    args = ((2, 1), (1, 2), (2, 1), 2)
    y = ref_conv(x, w, *args)
    gy = rng.standard_normal(y.shape)
    lhs = float((y * gy).sum())
    assert np.isclose(lhs, float((x * ref_conv_dgrad(gy, w, x.shape, *args)).sum()))
    assert np.isclose(lhs, float((w * ref_conv_wgrad(x, gy, w.shape, *args)).sum()))


def _finite_difference(f, x, gy, eps=1e-6, directions=3, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(directions):
        d = rng.standard_normal(x.shape)
        out.append((d, float(((f(x + eps * d) - f(x - eps * d)) * gy).sum() / (2 * eps))))
    return out


def test_lrn_and_avgpool_backward_references_match_finite_differences():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 3, 3))
    spec = LRNSpec(size=4, alpha=0.3, beta=0.75, k=1.5)
    gy = rng.standard_normal(x.shape)
    gx = ref_lrn_backward(x, gy, spec)
    for d, num in _finite_difference(lambda v: ref_lrn(v, spec)[0], x, gy):
        assert np.isclose(float((gx * d).sum()), num, rtol=1e-6)
    pspec = PoolSpec(kernel=(3, 2), stride=(2, 2), padding=(1, 1), ceil_mode=True,
                     count_include_pad=False)
    x = rng.standard_normal((2, 3, 7, 6))
    gy = rng.standard_normal(ref_avgpool(x, pspec).shape)
    gx = ref_avgpool_backward(gy, x.shape, pspec)
    for d, num in _finite_difference(lambda v: ref_avgpool(v, pspec), x, gy):
        assert np.isclose(float((gx * d).sum()), num, rtol=1e-6)


# ---- convolutions ---------------------------------------------------------------------------------------
# (N, C, H, W, O, KH, KW, stride, padding, dilation, groups)
CONV_CASES = [
    (2, 3, 11, 13, 8, 3, 3, (1, 1), (1, 1), (1, 1), 1),      # odd sizes, same padding
    (3, 8, 12, 12, 16, 1, 1, (1, 1), (0, 0), (1, 1), 1),     # 1x1
    (2, 4, 15, 14, 6, 5, 3, (2, 3), (2, 0), (1, 1), 1),      # rectangular kernel, strides
    (2, 6, 13, 13, 6, 3, 3, (1, 1), (2, 2), (2, 2), 1),      # dilation
    (2, 8, 10, 9, 12, 3, 3, (2, 2), (1, 1), (1, 1), 2),      # groups
    (2, 8, 9, 9, 8, 3, 3, (1, 1), (1, 1), (1, 1), 8),        # depthwise
    (4, 3, 35, 35, 16, 11, 11, (4, 4), (2, 2), (1, 1), 1),   # AlexNet-like first layer
]


def _conv_data(case, dtype, seed=0):
    n, c, h, w, o, kh, kw, stride, pad, dil, groups = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = (rng.standard_normal((o, c // groups, kh, kw)) / np.sqrt(c // groups * kh * kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    oh, ow = _conv_geometry(x.shape, wt.shape, stride, pad, dil)
    gy = rng.standard_normal((n, o, oh, ow)).astype(dtype)
    spec = ConvSpec(stride=stride, padding=pad, dilation=dil, groups=groups, key="test_conv")
    return x, wt, b, gy, spec


def _run_conv_ops(x, w, b, gy, spec):
    """(y, gx, gw, gb) from the GPU ops, as NumPy."""
    dx, dw, db, dgy = (cp.asarray(a) for a in (x, w, b, gy))
    y = cp.empty(gy.shape, x.dtype)
    gx, gw, gb = cp.empty_like(dx), cp.empty_like(dw), cp.empty_like(db)
    cuda.conv2d_forward(dx, dw, db, y, spec)
    cuda.conv2d_backward_data(dgy, dw, gx, spec)
    cuda.conv2d_backward_filter(dx, dgy, gw, gb, spec)
    return tuple(cp.asnumpy(a) for a in (y, gx, gw, gb))


def _check_conv(case, dtype, rtol):
    x, w, b, gy, spec = _conv_data(case, dtype)
    args = (spec.stride, spec.padding, spec.dilation, spec.groups)
    y, gx, gw, gb = _run_conv_ops(x, w, b, gy, spec)
    assert rel_err(y, ref_conv(x, w, *args) + b[None, :, None, None]) < rtol
    assert rel_err(gx, ref_conv_dgrad(gy, w, x.shape, *args)) < rtol
    assert rel_err(gw, ref_conv_wgrad(x, gy, w.shape, *args)) < rtol
    assert rel_err(gb, gy.astype(np.float64).sum(axis=(0, 2, 3))) < rtol
    return y, gx, gw, gb


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:7])))
def test_conv_tf32(case, stream):
    _check_conv(case, np.float32, TF32_RTOL)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:7])))
def test_conv_fp32_strict(case, stream):
    cuda.configure("fp32")
    _check_conv(case, np.float32, FP32_RTOL)


@pytest.mark.parametrize("case", CONV_CASES[:5:2], ids=lambda c: "x".join(map(str, c[:7])))
def test_conv_float64(case, stream):
    _check_conv(case, np.float64, FP64_RTOL)


def test_conv_matches_cpu_reference(stream):
    x, w, b, gy, spec = _conv_data(CONV_CASES[4], np.float32)
    cuda.configure("fp32")
    got = _run_conv_ops(x, w, b, gy, spec)
    y, gx = np.empty(gy.shape, np.float32), np.empty_like(x)
    gw, gb = np.empty_like(w), np.empty_like(b)
    cpu.conv2d_forward(x, w, b, y, spec)
    cpu.conv2d_backward_data(gy, w, gx, spec)
    cpu.conv2d_backward_filter(x, gy, gw, gb, spec)
    for g, want in zip(got, (y, gx, gw, gb)):
        assert rel_err(g, want) < FP32_RTOL


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_every_fp32_plan_is_strict(op, stream):
    """The note filter, not luck: in fp32 mode every candidate plan is accurate to FP32."""
    cuda.configure("fp32")
    x, w, _, gy, spec = _conv_data((4, 16, 20, 20, 32, 3, 3, (1, 1), (1, 1), (1, 1), 1),
                                   np.float32)
    args = (spec.stride, spec.padding, spec.dilation, spec.groups)
    want = {"fprop": ref_conv(x, w, *args), "dgrad": ref_conv_dgrad(gy, w, x.shape, *args),
            "wgrad": ref_conv_wgrad(x, gy, w.shape, *args)}[op]
    table = cuda.conv_plans(op, x.shape, w.shape, spec)
    assert table and all(ws >= 0 for _, ws, _ in table)
    dx, dw, dgy = cp.asarray(x), cp.asarray(w), cp.asarray(gy)
    out = {"fprop": dgy, "dgrad": dx, "wgrad": dw}[op]
    errors = {}
    for index, _, ms in table:
        if not np.isfinite(ms):
            continue
        out[...] = np.nan
        cuda.run_conv_plan(op, dx, dw, dgy, spec, index)
        errors[index] = rel_err(cp.asnumpy(out), want)
    assert errors and max(errors.values()) < FP32_RTOL, errors


def test_plan_table_and_choice(stream):
    x, w, b, gy, spec = _conv_data((8, 32, 28, 28, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1),
                                   np.float32)
    table = cuda.conv_plans("fprop", x.shape, w.shape, spec)
    # Plans ranked past MEASURED_PLANS are not measured: time NaN.
    assert all(isinstance(i, int) and isinstance(ws, int) and (ms > 0 or np.isnan(ms))
               for i, ws, ms in table)
    ran = [t for t in table if np.isfinite(t[2])]
    entry = next(e for e in cuda.conv_cache_entries() if e.problem.op == "fprop"
                 and e.problem.x[0] == x.shape and e.problem.math == "tf32")
    fastest, lean = entry.plan_for("fastest"), entry.plan_for("min_workspace")
    assert fastest.time_ms == min(t[2] for t in ran)
    assert lean.workspace_bytes == min(t[1] for t in ran)
    assert lean.time_ms == min(t[2] for t in ran if t[1] == lean.workspace_bytes)


def test_a_workspace_limit_runs_the_fastest_plan_within_it(stream):
    """Each rung of the ladder: the plan run is the one choose_plan names, within the limit,
    and the result is right."""
    from minidnn.kernels.cudnn_conv import PlanTiming, choose_plan, workspace_ladder
    x, w, b, gy, spec = _conv_data((16, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1),
                                   np.float32)
    args = (spec.stride, spec.padding, spec.dilation, spec.groups)
    want = ref_conv(x, w, *args) + b[None, :, None, None]
    _run_conv_ops(x, w, b, gy, spec)       # measures every plan of the three ops
    tables = {op: [PlanTiming(*t) for t in cuda.conv_plans(op, x.shape, w.shape, spec)]
              for op in ("fprop", "dgrad", "wgrad")}
    limits = workspace_ladder(tables) + [0]
    for limit in limits:
        limited = ConvSpec(stride=spec.stride, padding=spec.padding, key=f"limit{limit}",
                           workspace_limit=limit)
        y = _run_conv_ops(x, w, b, gy, limited)[0]
        assert rel_err(y, want) < TF32_RTOL
        plan = choose_plan(tables["fprop"], "fastest", workspace_limit=limit)
        assert plan.workspace_bytes <= max(limit, min(t.workspace_bytes for t in tables["fprop"]
                                                      if np.isfinite(t.time_ms)))
    print("fprop/dgrad/wgrad ladder (MiB):", [round(v / 2**20, 1) for v in limits])


def test_a_given_workspace_is_used_instead_of_an_allocation(stream, monkeypatch):
    # 64 -> 128 channels, 3x3, 56x56, batch 32: its fastest TF32 plans take 26-77 MB.
    x, w, b, gy, spec = _conv_data((32, 64, 56, 56, 128, 3, 3, (1, 1), (1, 1), (1, 1), 1),
                                   np.float32)
    want = _run_conv_ops(x, w, b, gy, spec)            # measures the plans
    entry = next(e for e in cuda.conv_cache_entries() if e.problem.op == "fprop"
                 and e.problem.x[0] == x.shape and e.problem.math == "tf32")
    need = entry.plan_for("fastest").workspace_bytes
    if need == 0:
        pytest.skip("the fastest plan of this problem needs no workspace")
    block = cp.empty(need, dtype=np.uint8)
    sizes = []
    real_empty = cp.empty
    monkeypatch.setattr(cp, "empty", lambda *a, **k: sizes.append(a[0]) or real_empty(*a, **k))
    dx, dw, db = cp.asarray(x), cp.asarray(w), cp.asarray(b)
    y = real_empty(gy.shape, np.float32)
    cuda.conv2d_forward(dx, dw, db, y, spec, workspace=block)
    assert need not in sizes                      # no workspace of its own
    assert np.array_equal(cp.asnumpy(y), want[0])  # same plan, same bits
    cuda.conv2d_forward(dx, dw, db, y, spec, workspace=block[:need // 2])   # too small
    assert need in sizes


def test_plan_cache_reuses_graphs(stream):
    cuda.clear_conv_cache()
    x, w, b, gy, spec = _conv_data(CONV_CASES[0], np.float32)
    _run_conv_ops(x, w, b, gy, spec)
    stats = cuda.conv_cache_stats()
    assert stats["graphs_built"] == 3 and stats["entries"] == 3      # fprop, dgrad, wgrad
    measured = stats["plans_measured"]
    for algo in ("fastest", "min_workspace", "fastest"):
        _run_conv_ops(x, w, b, gy, ConvSpec(stride=spec.stride, padding=spec.padding,
                                            algo=algo, key="another_layer"))
    stats = cuda.conv_cache_stats()
    assert stats["graphs_built"] == 3 and stats["plans_measured"] == measured
    # Each new (layer settings, shapes) pair looks its problem up once; the third loop repeats
    # the first one's settings and is served by the per-call table without a look-up.
    assert stats["hits"] == 6
    _run_conv_ops(*_conv_data(CONV_CASES[1], np.float32))
    assert cuda.conv_cache_stats()["graphs_built"] == 6
    cuda.configure("fp32")        # another math mode is another graph
    _run_conv_ops(x, w, b, gy, spec)
    assert cuda.conv_cache_stats()["graphs_built"] == 9


def test_deterministic_mode_gives_identical_bits(stream):
    cuda.configure("tf32", deterministic=True)
    case = (32, 16, 24, 24, 32, 3, 3, (2, 2), (1, 1), (1, 1), 1)
    x, w, b, gy, spec = _conv_data(case, np.float32)
    first = _run_conv_ops(x, w, b, gy, spec)
    for _ in range(2):
        again = _run_conv_ops(x, w, b, gy, spec)
        for a, b_ in zip(first, again):
            assert np.array_equal(a, b_)
    assert all(e.problem.deterministic for e in cuda.conv_cache_entries()
               if e.problem.x[0] == x.shape)


# A kernel that spins for `cycles` before writing: work queued behind it on the same stream
# sees its result only if it really runs on that stream.
_slow_fill = cp.ElementwiseKernel(
    "T v, int64 cycles", "T out",
    "long long t0 = clock64(); while (clock64() - t0 < cycles) {} out = v;",
    "minidnn_test_slow_fill")


def _conv_after_slow_fill(x, w, spec):
    dx_src = cp.asarray(x)
    dx = cp.zeros_like(dx_src)
    dw = cp.asarray(w)
    _slow_fill(dx_src, 20_000_000, dx)           # ~10 ms on the current stream
    y = cp.empty((x.shape[0], w.shape[0]) + _conv_geometry(x.shape, w.shape, spec.stride,
                                                           spec.padding, spec.dilation), x.dtype)
    cuda.conv2d_forward(dx, dw, None, y, spec)
    return y


def test_convolution_runs_on_the_current_stream():
    x, w, _, _, spec = _conv_data(CONV_CASES[0], np.float32)
    _run_conv_ops(*_conv_data(CONV_CASES[0], np.float32))     # graphs built, plans measured
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        y = _conv_after_slow_fill(x, w, spec)
        assert cuda.load_cudnn().get_stream(cuda._handle()) == s.ptr
    s.synchronize()
    assert rel_err(cp.asnumpy(y), ref_conv(x, w, spec.stride, spec.padding, spec.dilation, 1)) \
        < TF32_RTOL


def test_legacy_default_stream_is_fenced_not_used():
    x, w, _, _, spec = _conv_data(CONV_CASES[0], np.float32)
    assert cp.cuda.get_current_stream().ptr == 0
    y = _conv_after_slow_fill(x, w, spec)
    assert cuda.load_cudnn().get_stream(cuda._handle()) not in (0, None)
    got = cp.asnumpy(y)                          # on the legacy stream: ordered after the conv
    assert rel_err(got, ref_conv(x, w, spec.stride, spec.padding, spec.dilation, 1)) < TF32_RTOL


# ---- matrix products (Linear) --------------------------------------------------------------------------
def test_math_mode_reaches_cupy_matmul(stream):
    from cupy._core import _routines_linalg as linalg
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((512, 1024)), rng.standard_normal((1024, 256))
    want = a @ b
    da, db = cp.asarray(a, np.float32), cp.asarray(b, np.float32)
    errs = {}
    for mode in ("fp32", "tf32"):
        cuda.configure(mode)
        errs[mode] = rel_err(cp.asnumpy(da @ db), want)
    assert errs["fp32"] < FP32_RTOL
    assert errs["tf32"] < TF32_RTOL and errs["tf32"] > 10 * errs["fp32"], errs
    assert linalg.get_compute_type(np.float32) == getattr(linalg, "COMPUTE_TYPE_TF32", 7)
    assert cuda.math_mode() == {"math": "tf32", "deterministic": False}


# ---- pooling and LRN ------------------------------------------------------------------------------------
POOL_CASES = [
    PoolSpec(kernel=(2, 2), stride=(2, 2)),
    PoolSpec(kernel=(3, 3), stride=(2, 2)),                                    # AlexNet overlap
    PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True),
    PoolSpec(kernel=(3, 2), stride=(1, 2), padding=(1, 0), count_include_pad=False),
    PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True,
             count_include_pad=False),
    PoolSpec(kernel=(2, 2), stride=(2, 2), ceil_mode=True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", POOL_CASES, ids=str)
def test_pooling(spec, dtype, stream):
    rng = np.random.default_rng(4)
    n, c, h, w = 2, 3, 9, 8
    # Small integers make ties common: the first maximum must win, as on the CPU.
    x = rng.integers(-3, 4, (n, c, h, w)).astype(dtype)
    oh, ow = _pool_windows(x.shape, spec, spec.ceil_mode)
    gy = rng.standard_normal((n, c, oh, ow)).astype(dtype)
    dx, dgy = cp.asarray(x), cp.asarray(gy)
    y, arg = cp.empty((n, c, oh, ow), dtype), cp.empty((n, c, oh, ow), np.uint8)
    gx = cp.full(x.shape, np.nan, dtype)
    cuda.maxpool2d_forward(dx, y, arg, spec)
    cuda.maxpool2d_backward(dgy, arg, gx, spec)
    want_y, want_arg = ref_maxpool(x, spec)
    np.testing.assert_array_equal(cp.asnumpy(y), want_y)
    np.testing.assert_array_equal(cp.asnumpy(arg), want_arg)
    assert rel_err(cp.asnumpy(gx), ref_maxpool_backward(gy, want_arg, x.shape, spec)) < 1e-6
    # cpu.py twin: identical forward, same routing
    cy, carg, cgx = np.empty_like(want_y), np.empty_like(want_arg), np.empty_like(x)
    cpu.maxpool2d_forward(x, cy, carg, spec)
    cpu.maxpool2d_backward(gy, carg, cgx, spec)
    np.testing.assert_array_equal(cp.asnumpy(arg), carg)
    assert rel_err(cp.asnumpy(gx), cgx) < 1e-6

    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    dx = cp.asarray(x)
    cuda.avgpool2d_forward(dx, y, spec)
    gx[...] = np.nan
    cuda.avgpool2d_backward(dgy, gx, spec)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    assert rel_err(cp.asnumpy(y), ref_avgpool(x, spec)) < tol
    assert rel_err(cp.asnumpy(gx), ref_avgpool_backward(gy, x.shape, spec)) < tol
    cy, cgx = np.empty(y.shape, dtype), np.empty_like(x)
    cpu.avgpool2d_forward(x, cy, spec)
    cpu.avgpool2d_backward(gy, cgx, spec)
    assert rel_err(cp.asnumpy(y), cy) < tol and rel_err(cp.asnumpy(gx), cgx) < tol


def test_maxpool_backward_is_deterministic(stream):
    spec = PoolSpec(kernel=(3, 3), stride=(1, 1), padding=(1, 1))      # heavy overlap
    rng = np.random.default_rng(5)
    x = cp.asarray(rng.standard_normal((8, 16, 32, 32)).astype(np.float32))
    y, arg = cp.empty_like(x), cp.empty(x.shape, np.uint8)
    gy = cp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    cuda.maxpool2d_forward(x, y, arg, spec)
    outs = []
    for _ in range(3):
        gx = cp.empty_like(x)
        cuda.maxpool2d_backward(gy, arg, gx, spec)
        outs.append(cp.asnumpy(gx))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", [LRNSpec(), LRNSpec(size=4, alpha=0.2, beta=0.6, k=1.0),
                                  LRNSpec(size=3, alpha=1e-3, beta=0.75, k=1.0)], ids=str)
def test_lrn(spec, dtype, stream):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 7, 5, 6)).astype(dtype)
    gy = rng.standard_normal(x.shape).astype(dtype)
    dx, dgy = cp.asarray(x), cp.asarray(gy)
    y, scale, gx = cp.empty_like(dx), cp.empty_like(dx), cp.empty_like(dx)
    cuda.lrn_forward(dx, y, scale, spec)
    cuda.lrn_backward(dx, None, scale, dgy, gx, spec)
    want_y, want_s = ref_lrn(x, spec)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert rel_err(cp.asnumpy(y), want_y) < tol
    assert rel_err(cp.asnumpy(scale), want_s) < tol
    assert rel_err(cp.asnumpy(gx), ref_lrn_backward(x, gy, spec)) < tol
    cy, cs, cgx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    cpu.lrn_forward(x, cy, cs, spec)
    cpu.lrn_backward(x, cy, cs, gy, cgx, spec)
    assert rel_err(cp.asnumpy(y), cy) < tol and rel_err(cp.asnumpy(gx), cgx) < tol


def test_every_cpu_op_has_a_gpu_twin():
    public = {n for n in dir(cpu) if not n.startswith("_") and callable(getattr(cpu, n))
              and getattr(getattr(cpu, n), "__module__", "") == cpu.__name__}
    assert public <= set(dir(cuda))
    assert cuda.FALLBACK_OPS == ()       # every op is native


def test_direct_and_public_execute_agree(stream):
    """The direct runner (private frontend entry point) and the public execute give the same
    bits with the same plan."""
    x, w, b, gy, spec = _conv_data(CONV_CASES[2], np.float32)
    _run_conv_ops(x, w, b, gy, spec)
    dx, dw = cp.asarray(x), cp.asarray(w)
    entry = next(e for e in cuda.conv_cache_entries() if e.problem.op == "fprop"
                 and e.problem.x[0] == x.shape and e.problem.math == "tf32")
    plan = entry.plan_for("fastest")
    outs = []
    for direct in (True, False):
        y = cp.full(gy.shape, np.nan, np.float32)
        ws = cp.empty(max(plan.workspace_bytes, 1), np.uint8)
        entry.graph.runner(plan.index, direct=direct)(dx.data.ptr, dw.data.ptr, y.data.ptr,
                                                      ws.data.ptr)
        outs.append(cp.asnumpy(y))
    assert np.array_equal(outs[0], outs[1])
    assert rel_err(outs[0], ref_conv(x, w, spec.stride, spec.padding, spec.dilation, 1)) \
        < TF32_RTOL


def test_convolution_falls_back_to_a_leaner_plan_when_the_workspace_does_not_fit(stream):
    """Under a budget that holds the operands but not the fastest plan's workspace, the
    convolution runs a plan with less workspace, gives the same result, and says so."""
    from minidnn.backend import Device
    from minidnn.kernels import cuda
    from minidnn.memory.arena import Arena
    spec = ConvSpec(padding=(1, 1), key="fallback-test")
    rng = cp.random.default_rng(3)
    x = rng.standard_normal((32, 64, 56, 56), dtype=cp.float32)
    w = rng.standard_normal((128, 64, 3, 3), dtype=cp.float32)
    want = cp.empty((32, 128, 56, 56), cp.float32)
    cuda.conv2d_forward(x, w, None, want, spec)        # measures the plans without a budget
    fastest = min((p for p in cuda.conv_plans("fprop", x.shape, w.shape, spec)
                   if np.isfinite(p[2])), key=lambda p: p[2])
    if fastest[1] == 0:
        pytest.skip("the fastest plan needs no workspace on this GPU")
    stream.synchronize()
    operands = x.nbytes + w.nbytes + want.nbytes
    arena = Arena(Device("gpu"), operands + 8 * 2**20)   # 8 MiB beside the operands
    try:
        with arena.route_cupy():
            x2, w2 = x.copy(), w.copy()
            y2 = cp.empty_like(want)
            cuda.conv2d_forward(x2, w2, None, y2, spec)
            stream.synchronize()
            assert ("fallback-test", "fprop") in cuda.workspace_fallbacks
            assert rel_err(y2.get(), want.get()) < 2e-3
            del x2, w2, y2
    finally:
        arena.close()
