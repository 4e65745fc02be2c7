"""Two small networks for tests and quick experiments on a CPU.

mlp:       flatten -> fc1 128 -> relu1 -> fc2 64 -> relu2 -> fc3 num_classes
           (only Linear/ReLU/Flatten, so it runs wherever the core runs)
tiny_cnn:  conv1 16 3x3 pad 1 -> relu1 -> pool1 2x2 -> conv2 32 3x3 pad 1 -> relu2 -> pool2 2x2
           -> fc3 64 -> relu3 -> drop3 -> fc4 num_classes
"""
from __future__ import annotations

NATIVE_IMAGE_SIZE = 32


def define_mlp(b, num_classes: int) -> None:
    b.flatten("flatten")
    b.linear("fc1", 128)
    b.relu("relu1")
    b.linear("fc2", 64)
    b.relu("relu2")
    b.linear("fc3", num_classes)


def define_tiny_cnn(b, num_classes: int) -> None:
    b.conv("conv1", 16, 3, padding=1)
    b.relu("relu1")
    b.maxpool("pool1", 2, stride=2)
    b.conv("conv2", 32, 3, padding=1)
    b.relu("relu2")
    b.maxpool("pool2", 2, stride=2)
    b.flatten("flatten")
    b.linear("fc3", 64)
    b.relu("relu3")
    b.dropout("drop3", 0.5)
    b.linear("fc4", num_classes)
