"""OverFeat "fast" (Sermanet et al. 2014, table 1), for 231x231 inputs.

    conv1   96 11x11 stride 4 -> relu1 -> pool1 2x2 stride 2
    conv2  256  5x5           -> relu2 -> pool2 2x2 stride 2
    conv3  512  3x3 pad 1     -> relu3
    conv4 1024  3x3 pad 1     -> relu4
    conv5 1024  3x3 pad 1     -> relu5 -> pool5 2x2 stride 2
    fc6 3072 -> relu6 -> drop6 ; fc7 4096 -> relu7 -> drop7 ; fc8 num_classes

Maps at 231x231: 56 -> 28 -> 24 -> 12 -> 12 -> 6, so fc6 reads 1024*6*6 = 36,864 values.
145,920,872 parameters with 1000 classes (the paper's table: 145M).
Smallest image: 71x71 (pool5 then sees 2x2 maps).
"""
from __future__ import annotations

NATIVE_IMAGE_SIZE = 231


def define(b, num_classes: int) -> None:
    b.conv("conv1", 96, 11, stride=4)
    b.relu("relu1")
    b.maxpool("pool1", 2, stride=2)
    b.conv("conv2", 256, 5)
    b.relu("relu2")
    b.maxpool("pool2", 2, stride=2)
    b.conv("conv3", 512, 3, padding=1)
    b.relu("relu3")
    b.conv("conv4", 1024, 3, padding=1)
    b.relu("relu4")
    b.conv("conv5", 1024, 3, padding=1)
    b.relu("relu5")
    b.maxpool("pool5", 2, stride=2)
    b.classifier((3072, 4096), num_classes)
