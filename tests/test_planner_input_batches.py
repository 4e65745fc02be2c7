"""The input batches a caller holds on the device (dyn's `input_batches`) are counted at their
own bytes: float32 images and int64 labels, whatever the maps' precision. Counted at the bf16
data map's bytes, ResNet-50 bf16 in 6 GiB on the H200 ran 147 MiB short of its plan, in
backward of layer2.0.conv1, with the two float32 batches the benchmark made."""
import pytest

from minidnn import models
from minidnn.backend import select_device
from minidnn.data import SyntheticImages
from minidnn.planner.profile import untimed_profile
from minidnn.planner.step_model import PlanOptions, StepModel
from minidnn.spec import StepSpec


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_the_model_counts_the_batches_a_caller_makes(precision, micro_batches):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    batch = 8
    spec = StepSpec(batch=batch, micro_batches=micro_batches, precision=precision,
                    memory_budget=2**30)
    model = StepModel(net, spec, untimed_profile(net, batch // micro_batches, "cpu"),
                      PlanOptions(input_batches=2))
    made = SyntheticImages(10, net.input_shape, seed=0).device_batches(
        batch, select_device("cpu"), count=2)
    assert model.input_bytes == sum(x.nbytes + y.nbytes for x, y in made)
