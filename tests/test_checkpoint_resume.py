"""Resume is bit-identical on a network whose parameters share shapes, so that momentum (or a
parameter) restored into the wrong one of two same-shaped slots cannot pass unseen: a check by
shape alone would accept it."""
import numpy as np

from minidnn.checkpoint import load_checkpoint
from minidnn.train import TrainConfig, train

#: Three hidden layers of 32: fc2 and fc3 weights are both (32, 32); fc1, fc2 and fc3 biases
#: are all (32,).
EQUAL_LAYERS = """
from minidnn import Network
from minidnn.layers import Flatten, Linear, ReLU
NATIVE_IMAGE_SIZE = 8
def build(num_classes, image_size):
    net = Network((3, image_size, image_size), num_classes=num_classes, name='equal_mlp')
    net.add(Flatten())
    for name in ('fc1', 'fc2', 'fc3'):
        net.add(Linear(32), name=name)
        net.add(ReLU())
    net.add(Linear(num_classes), name='fc4')
    return net
"""


def run(model, **overrides):
    cfg = dict(model=model, batch=8, image_size=8, steps=8, device="cpu", lr=0.05,
               momentum=0.9, eval_every=0, eval_batches=1, progress=False, log_every=4)
    cfg.update(overrides)
    return train(TrainConfig(**cfg), log=lambda *a: None)


def test_resume_is_bit_identical_with_parameters_of_equal_shapes(tmp_path):
    model = tmp_path / "equal_mlp.py"
    model.write_text(EQUAL_LAYERS)
    ckpt = str(tmp_path / "run.npz")
    straight = run(str(model))
    run(str(model), steps=4, checkpoint=ckpt)
    saved = load_checkpoint(ckpt)
    shapes = [v.shape for v in saved.momentum.values()]
    assert len(shapes) > len(set(shapes))               # the case under test: equal shapes
    # Momentum differs between same-shaped slots, so a swap would change the next update.
    assert not np.array_equal(saved.momentum["fc2.weight"], saved.momentum["fc3.weight"])
    resumed = run(str(model), checkpoint=ckpt, resume=True)
    assert resumed["loss"] == straight["loss"][4:]
    assert resumed["param_checksum"] == straight["param_checksum"]
