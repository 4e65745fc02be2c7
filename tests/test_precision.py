"""Mixed precision on the CPU (precision='bf16'): bf16 feature maps and map gradients,
float32 everything else, with bf16 rounding emulated through ml_dtypes, so the path runs here
and the GPU is checked against it."""
import json

import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.decide import build_executor
from minidnn.errors import ConfigError
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels.mapformat import MapFormat
from minidnn.layers import LRN, Conv2d, Linear, MaxPool2d, ReLU, StepContext
from minidnn.layers import precision as mixed
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import MemoryDecision, recompute_candidates
from minidnn.planner.dyn import FixedDecision
from test_manager import dag_net as branchy     # conv1 -> relu1 -> {conva, convb} -> join ...

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def bf16(a):
    """a rounded to bf16 (nearest even) and widened back to float32."""
    return np.asarray(a, np.float32).astype(BF16).astype(np.float32)


def test_rounding_is_to_nearest_even():
    # 1 + 2**-8 lies halfway between 1 and the next bf16 value: it goes to the even one, 1.
    halfway = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], np.float32)
    np.testing.assert_array_equal(bf16(halfway), [1.0, 1 + 2**-6, -1.0])


def test_plan_stores_maps_and_their_gradients_at_half_the_bytes():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    full, half = LivenessPlan(net, 4), LivenessPlan(net, 4, maps=MapFormat(precision="bf16"))
    assert [s.kind for s in full.storages] == [s.kind for s in half.storages]
    for a, b in zip(full.storages, half.storages):
        dtypes = {half.tensors[t].dtype for t in b.tensors}
        if a.kind in ("feature", "grad") and b.tensors[0] not in ("loss", "grad:loss") \
                or b.tensors[0] == "data":
            assert b.nbytes * 2 == a.nbytes and dtypes == {BF16}, b.tensors
        else:               # labels, the loss, aux buffers (argmax, masks, softmax)
            assert b.nbytes == a.nbytes and BF16 not in dtypes, b.tensors
    assert half.network_wide_bytes(("feature", "grad")) < \
        0.51 * full.network_wide_bytes(("feature", "grad"))
    with pytest.raises(ConfigError, match="precision must be one of"):
        MapFormat(precision="fp16")


@pytest.mark.parametrize("layer, shape", [
    (Conv2d(5, 3, padding=1), (2, 3, 6, 6)),
    (Linear(7), (3, 11)),
    (MaxPool2d(2), (2, 3, 6, 6)),
    (LRN(3, alpha=0.5, k=1.0), (2, 5, 3, 3)),
    (ReLU(keep="bits"), (2, 3, 4, 4)),
])
def test_a_layer_on_bf16_maps_is_its_float32_self_rounded_once(layer, shape):
    """Through layers/precision.py: bf16 inputs widened, float32 compute (parameters and
    their gradients float32), every bf16 output rounded once to nearest even."""
    rng = np.random.default_rng(0)
    layer.index = 0
    layer.setup([shape], np.float32)
    for p in layer.params.values():
        p.data = rng.standard_normal(p.shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(BF16)
    gy = rng.standard_normal(layer.out_shape).astype(BF16)
    ctx = StepContext(np, kernels=cpu_kernels)

    def run(xs, y, gx, grads):
        aux = {k: np.zeros(s, d) for k, (s, d) in layer.aux_specs().items()}
        mixed.forward(layer, xs, y, aux, ctx)
        for name, p in layer.params.items():
            p.grad = grads[name]
        mixed.backward(layer, [xs[0] if 0 in layer.retain_inputs else None],
                       y if layer.retain_output else None, gy if y.dtype == BF16
                       else gy.astype(np.float32), [gx], aux, ctx)
        return y, gx

    grads16 = {k: np.zeros(p.shape, np.float32) for k, p in layer.params.items()}
    y16, gx16 = run([x], np.zeros(layer.out_shape, BF16), np.zeros(shape, BF16), grads16)
    grads32 = {k: np.zeros(p.shape, np.float32) for k, p in layer.params.items()}
    y32, gx32 = run([x.astype(np.float32)], np.zeros(layer.out_shape, np.float32),
                    np.zeros(shape, np.float32), grads32)
    np.testing.assert_array_equal(y16.astype(np.float32), bf16(y32))
    np.testing.assert_array_equal(gx16.astype(np.float32), bf16(gx32))
    for k in grads16:
        assert grads16[k].dtype == np.float32
        np.testing.assert_array_equal(grads16[k], grads32[k])


def train(precision, policy="none", steps=3, decision=None, relu_bits=False):
    rng = np.random.default_rng(0)
    net = branchy()
    with build_executor(net, 4, device="cpu", seed=0, precision=precision,
                        relu_bits=relu_bits,
                        policy=FixedDecision(decision) if decision else policy) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        losses = []
        for _ in range(steps):
            x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
            losses.append(float(ex.train_step(x, rng.integers(0, 5, 4), opt)))
        dtypes = {p.data.dtype for _, p in ex.net.parameters()} | \
            {p.grad.dtype for _, p in ex.net.parameters()} | \
            {v.dtype for v in opt.velocity.values()}
        stats = ex.memory_stats()
        loss, logits = ex.evaluate(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                                   rng.integers(0, 5, 4))
    return net.state_dict(), losses, dtypes, stats, logits


def test_bf16_training_keeps_float32_state_and_follows_the_float32_run():
    w32, l32, _, s32, _ = train("fp32")
    w16, l16, dtypes, s16, logits = train("bf16")
    assert dtypes == {np.dtype(np.float32)}           # master weights, gradients, momentum
    assert logits.dtype == np.float32
    np.testing.assert_allclose(l16, l32, rtol=2e-2)
    for k in w32:
        assert w16[k].dtype == np.float32
        np.testing.assert_allclose(w16[k], w32[k], atol=2e-2, rtol=2e-2, err_msg=k)
    assert any(not np.array_equal(w16[k], w32[k]) for k in w32)      # it did round
    assert s16["peak_feature_map_bytes"] < 0.6 * s32["peak_feature_map_bytes"]


def test_offload_recompute_and_relu_bits_change_no_bit_in_bf16():
    """The memory manager moves and rebuilds bf16 maps losslessly: half the bytes."""
    kept = train("bf16")
    offloaded = train("bf16", policy="all")
    moved, moved32 = offloaded[3]["offloaded_bytes"], train("fp32", policy="all")[3]["offloaded_bytes"]
    assert moved == offloaded[3]["prefetched_bytes"] and moved < 0.6 * moved32  # byte aux too
    plan = LivenessPlan(branchy(), 4, maps=MapFormat(precision="bf16"))
    recompute = frozenset([s.id for s in recompute_candidates(plan)])
    rebuilt = train("bf16", decision=MemoryDecision(recompute=recompute))
    bits = train("bf16", relu_bits=True)
    for other in (offloaded, rebuilt, bits):
        for k in kept[0]:
            np.testing.assert_array_equal(other[0][k], kept[0][k], err_msg=k)


def test_command_line_trains_in_bf16_and_channels_last_and_checkpoints_float32(capsys,
                                                                                tmp_path):
    from minidnn.cli import main
    ckpt, report = tmp_path / "c.npz", tmp_path / "run.json"
    code = main(["train", "--model", "tiny_cnn", "--image-size", "16", "--steps", "3",
                 "--batch", "4", "--precision", "bf16", "--layout", "nhwc", "--eval-every", "0",
                 "--checkpoint", str(ckpt), "--no-progress", "--device", "cpu",
                 "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(report.read_text())["precision"] == "bf16"   # `minidnn plan` reads it
    with np.load(ckpt) as saved:
        weights = [saved[k] for k in saved.files if k.endswith("conv1.weight")]
    assert weights and weights[0].dtype == np.float32 and weights[0].shape == (16, 3, 3, 3)
    code = main(["train", "--model", "mlp", "--precision", "fp16", "--device", "cpu"])
    assert code == 2 and "invalid choice: 'fp16'" in capsys.readouterr()[1]


def _bits_to_bf16(u):
    """The GPU kernel's rounding (cuda_pointwise.float_to_bf16), on NumPy uint32 patterns."""
    u = u.astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def _rounding_patterns():
    """float32 bit patterns of every kind: random ones, halfway cases, subnormals (those that
    round to a bf16 zero and those that do not), the largest finite values, infinities, NaN
    (quiet, signalling, negative)."""
    rng = np.random.default_rng(0)
    return np.concatenate([
        rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
        (rng.integers(0, 2**16, 5000, dtype=np.uint64) << 16 | 0x8000).astype(np.uint32),
        np.arange(0x7FF0, 0x8010, dtype=np.uint32),
        np.arange(0x7FF0, 0x8010, dtype=np.uint32) | 0x80000000,
        np.array([0, 0x80000000, 1, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                  0x7FC00000, 0x7F800001, 0xFFC00001, 0x7FBFFFFF, 0x3F808000, 0x3F818000],
                 np.uint32)])


def test_the_gpu_rounding_formula_is_ml_dtypes_rounding():
    """float_to_bf16's bit formula, replayed here, against ml_dtypes on random values,
    halfway cases, subnormals, the largest finite values, infinities and NaN."""
    patterns = _rounding_patterns()
    values = patterns.view(np.float32)
    got = _bits_to_bf16(patterns)
    with np.errstate(invalid="ignore"):
        want = values.astype(BF16).view(np.uint16)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(BF16).astype(np.float32)).all()
    # Widening is exact: the pattern in the top half of a float32.
    wide = (want[~nan].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(wide, want[~nan].view(BF16).astype(np.float32))


def test_one_comparison_says_whether_a_float_is_stored_as_a_positive_bf16():
    """The GPU batch norm's ReLU mask on bf16 maps (cuda_batchnorm's relu_passes) compares v
    with 2^-134 (bits 0x8000) instead of rounding v: the same answer as rounding to bf16,
    then comparing with 0, on every kind of pattern."""
    patterns = _rounding_patterns()
    values = patterns.view(np.float32)
    with np.errstate(invalid="ignore"):
        stored_positive = values.astype(BF16).astype(np.float32) > 0
        compared = values > np.array([0x8000], np.uint32).view(np.float32)[0]
    np.testing.assert_array_equal(compared, stored_positive)
    assert (values[compared] > 0).all() and not compared[np.isnan(values)].any()


@pytest.mark.gpu
def test_the_gpu_kernels_rounding_is_the_formulas_bit_for_bit():
    """cuda_pointwise's float_to_bf16 (the hardware's conversion from compute capability
    8.0, the integer formula before) gives _bits_to_bf16's bits on every pattern, NaN's
    included."""
    cp = pytest.importorskip("cupy")
    from minidnn.backend import gpu_available
    if not gpu_available():
        pytest.skip("needs a GPU")
    from minidnn.kernels import cuda_pointwise
    patterns = _rounding_patterns()
    patterns = patterns[:len(patterns) // 4 * 4]            # whole vectors of 4
    src = cp.asarray(patterns.view(np.float32))
    dst = cp.empty(src.shape, BF16)
    cuda_pointwise.float_to_bf16(src, dst)
    np.testing.assert_array_equal(cp.asnumpy(dst).view(np.uint16), _bits_to_bf16(patterns))
    # The tail that fills no whole vector: one value per thread.
    odd = cp.asarray(patterns[:7].view(np.float32))
    out = cp.empty(odd.shape, BF16)
    cuda_pointwise.float_to_bf16(odd, out)
    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint16), _bits_to_bf16(patterns[:7]))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (4, 8, 6, 6)])   # one value, 4 per thread
def test_gpu_conversions_match_ml_dtypes(layout, shape):
    cp = pytest.importorskip("cupy")
    from minidnn.backend import Device
    from minidnn.kernels import for_device, mapformat
    kernels = for_device(Device("gpu"))
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 38, shape)).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, 0.0, -0.0]
    src = mapformat.empty(cp, x.shape, np.float32, layout)
    src[...] = cp.asarray(x)
    low = mapformat.empty(cp, x.shape, BF16, layout)
    kernels.float_to_bf16(src, low)
    back = mapformat.empty(cp, x.shape, np.float32, layout)
    kernels.bf16_to_float(low, back)
    np.testing.assert_array_equal(cp.asnumpy(back), x.astype(BF16).astype(np.float32))


def test_an_executor_refuses_a_decision_with_an_unknown_format():
    from minidnn import Executor
    from minidnn.memory.policy import MemoryDecision
    for bad in (dict(precision="fp16"), dict(layout="chwn")):
        with pytest.raises(ConfigError, match="must be one of"):
            Executor(models.build("mlp", num_classes=4, image_size=8), 2, device="cpu",
                     decision=MemoryDecision(prefetch_lookahead=1, **bad))


def test_dyn_plans_bf16_maps_at_half_the_bytes():
    """The planner's step model sizes the decision's maps: under bf16 the least budget a
    plan fits in drops, and a budget too small for float32 maps is planned for bf16 ones."""
    from minidnn.decide import decide
    from minidnn.planner import analytic_profile
    from minidnn.planner.dyn import DynPolicy
    from minidnn.planner.search import InfeasibleBudgetError, Planner
    net = models.build("tiny_cnn", num_classes=10, image_size=64)
    prof = analytic_profile(net, 64, "h200")
    # No input batches held by the caller: they are float32 images whatever the maps.
    least = {p: Planner(net, 64, prof, budget=2**34, maps=MapFormat(precision=p),
                        input_batches=0).minimum_budget()
             for p in ("fp32", "bf16")}
    assert least["bf16"] < 0.7 * least["fp32"]
    budget = (least["bf16"] + least["fp32"]) // 2
    decision = decide(net, 64, policy=DynPolicy(profile=prof), memory_budget=budget, precision="bf16")
    assert decision.precision == "bf16" and decision.layout == "nchw"
    with pytest.raises(InfeasibleBudgetError):     # in one pass, no layer chunks (dyn would
        decide(net, 64, policy=DynPolicy(profile=prof), memory_budget=budget, precision="fp32",   # split the batch)
               micro_batches=1, chunks=())


def test_dyn_counts_the_bf16_weight_copies_on_the_gpu():
    """The GPU's bf16 products read bf16 copies of the conv and linear weights, kept through
    a batch's passes: a GPU profile's step model counts them (2 bytes per weight value), a
    CPU profile's (no copies there) and a float32 step's do not."""
    from dataclasses import replace
    from minidnn.planner import analytic_profile
    from minidnn.planner.costs import weight_copy_bytes
    from minidnn.planner.step_model import StepModel
    net = models.build("tiny_cnn", num_classes=10, image_size=64)
    prof = analytic_profile(net, 16, "h200")
    weights = sum(p.data.size if p.data is not None else int(np.prod(p.shape))
                  for name, p in net.parameters() if name.endswith("weight"))
    assert weight_copy_bytes(net) == 2 * weights
    extra = {}
    for precision, gpu in (("fp32", True), ("bf16", True), ("bf16", False)):
        p = prof if gpu else replace(prof, temporaries_in_arena=False)
        m = StepModel(net, 16, p, maps=MapFormat(precision=precision))
        extra[precision, gpu] = m.weight_copy_bytes
    assert extra == {("fp32", True): 0, ("bf16", True): 2 * weights, ("bf16", False): 0}
