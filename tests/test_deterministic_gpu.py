"""Deterministic mode on a CUDA GPU (layers/slices.py): the slices go through the same cuDNN
and cuBLAS calls on views of S images, so micro-batches 1, 2 and 4 (and layer chunks) give
the same bits, for a small VGG and a small ResNet with BatchNorm."""
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("default_gpu_kernels_after")]
cupy = pytest.importorskip("cupy")

from minidnn.backend import gpu_available  # noqa: E402
from test_deterministic import differing, resnet_net, train, vgg_net  # noqa: E402

if not gpu_available():  # collected on a machine with CuPy but no GPU: conftest skips them
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def train_on_gpu(make_net, **options) -> dict:
    """The state dict after a few deterministic SGD steps on the GPU in strict fp32 math."""
    return train(make_net, device="gpu", deterministic=True, math="fp32", **options)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_vgg_gives_the_same_bits_for_micro_batches_1_2_4_and_chunks(precision):
    runs = {f"{k} micro-batches": train_on_gpu(vgg_net, micro_batches=k, precision=precision)
            for k in (1, 2, 4)}
    runs["conv1..pool1 in 2 pieces"] = train_on_gpu(
        vgg_net, policy="dyn", micro_batches=2, chunks=(("conv1", "pool1", 2),),
        precision=precision)
    reference = runs.pop("1 micro-batches")
    assert differing(reference, runs) == []


def test_a_resnet_gives_the_same_bits_for_micro_batches_1_2_4():
    runs = {k: train_on_gpu(resnet_net, micro_batches=k, split_batch_statistics=True)
            for k in (1, 2, 4)}
    assert differing(runs[1], runs) == []
    whole = {"one pass": train_on_gpu(resnet_net),
             "chunked": train_on_gpu(resnet_net, policy="dyn",
                                     chunks=(("conv1", "conv2", 2),))}
    assert differing(whole["one pass"], whole) == []
