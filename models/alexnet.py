"""AlexNet as vDNN trained it: Caffe's bvlc_alexnet (Krizhevsky et al. 2012, one-tower form).

    conv1  96 11x11 stride 4      -> relu1 -> norm1 (LRN) -> pool1 3x3 stride 2
    conv2 256  5x5  pad 2, 2 groups -> relu2 -> norm2 (LRN) -> pool2 3x3 stride 2
    conv3 384  3x3  pad 1           -> relu3
    conv4 384  3x3  pad 1, 2 groups -> relu4
    conv5 256  3x3  pad 1, 2 groups -> relu5 -> pool5 3x3 stride 2
    fc6 4096 -> relu6 -> drop6 ; fc7 4096 -> relu7 -> drop7 ; fc8 num_classes

The groups are the two GPUs of the original network. LRN uses Caffe's values (size 5,
alpha 1e-4, beta 0.75, k 1). Pooling rounds up like Caffe's (ceil_mode), which at 227x227
gives the same 55 -> 27 -> 13 -> 6 maps as rounding down, and at reduced sizes keeps
border pixels. 60,965,224 parameters at 227x227 with 1000 classes.
Initialisation (all models here): convolutions He-normal with zero bias, fully connected
layers PyTorch's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (see NetBuilder.linear).
Smallest image: 55x55 (pool5 then sees 3x3 maps).
"""
from __future__ import annotations

NATIVE_IMAGE_SIZE = 227
LRN_CAFFE = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)


def define(b, num_classes: int) -> None:
    b.conv("conv1", 96, 11, stride=4)
    b.relu("relu1")
    b.lrn("norm1", **LRN_CAFFE)
    b.maxpool("pool1", 3, stride=2, ceil_mode=True)
    b.conv("conv2", 256, 5, padding=2, groups=2)
    b.relu("relu2")
    b.lrn("norm2", **LRN_CAFFE)
    b.maxpool("pool2", 3, stride=2, ceil_mode=True)
    b.conv("conv3", 384, 3, padding=1)
    b.relu("relu3")
    b.conv("conv4", 384, 3, padding=1, groups=2)
    b.relu("relu4")
    b.conv("conv5", 256, 3, padding=1, groups=2)
    b.relu("relu5")
    b.maxpool("pool5", 3, stride=2, ceil_mode=True)
    b.classifier((4096, 4096), num_classes)
