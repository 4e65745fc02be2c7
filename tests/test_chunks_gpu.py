"""Layer chunks on the GPU (minidnn/chunks.py): a chunked step against the unchunked one and
against the CPU, with row-slice views in cuDNN and the raw kernels, the join's copies and
dropout per piece. Skipped without a CUDA GPU."""
from dataclasses import replace

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

from minidnn.executor import Executor  # noqa: E402
from minidnn.memory.policy import NO_DECISION  # noqa: E402

from test_chunks import BATCH, RUNS, batch, make_net  # noqa: E402


@pytest.fixture(autouse=True)
def default_kernels_after():
    """The math mode is a setting of the kernel module: give later tests the default back."""
    yield
    from minidnn import kernels
    from minidnn.backend import Device
    kernels.for_device(Device("gpu")).configure()


def gpu_step(kind, chunks=(), layout="nhwc", device="gpu"):
    """loss, outputs, weight gradients and input gradient of one float32 step."""
    net = make_net(kind, np.float32)
    net.init_params(0)
    decision = replace(NO_DECISION, chunks=chunks, layout=layout if device == "gpu" else "nchw")
    x, y = batch(np.float32)
    gpu = dict(deterministic=True, math="fp32") if device == "gpu" else {}
    with Executor(net, BATCH, device=device, seed=3, decision=decision, input_grad=True,
                  **gpu) as ex:
        loss = ex.forward(x, y, keep_outputs=True)
        out = {"loss": float(loss), "outputs": cp.asnumpy(ex.outputs()) if device == "gpu"
               else ex.outputs()}
        ex.backward()
        out["grads"] = ex.gradients()
        out["input"] = np.asarray(cp.asnumpy(ex.input_gradient()) if device == "gpu"
                                  else ex.input_gradient())
    return out


def assert_close(a, b, rtol=1e-4, atol=1e-5):
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    np.testing.assert_allclose(a["outputs"], b["outputs"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(a["input"], b["input"], rtol=rtol, atol=atol)
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        np.testing.assert_allclose(a["grads"][name], b["grads"][name], rtol=rtol, atol=atol,
                                   err_msg=name)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("kind", ["pool", "dropout", "vgg", "skip"])
def test_a_chunked_gpu_step_matches_the_unchunked_one_and_the_cpu(kind, layout):
    chunked = gpu_step(kind, RUNS[kind], layout)
    assert_close(chunked, gpu_step(kind, (), layout))
    if kind != "dropout":    # the GPU draws its masks from its own generator (cuda_random.py)
        assert_close(chunked, gpu_step(kind, RUNS[kind], device="cpu"))


def test_a_chunked_gpu_step_repeats_bit_for_bit():
    a, b = gpu_step("vgg", RUNS["vgg"]), gpu_step("vgg", RUNS["vgg"])
    assert a["loss"] == b["loss"]
    np.testing.assert_array_equal(a["input"], b["input"])
    for name in a["grads"]:
        np.testing.assert_array_equal(a["grads"][name], b["grads"][name])
