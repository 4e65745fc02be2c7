"""GoogLeNet as vDNN trained it: Caffe's bvlc_googlenet (Szegedy et al. 2015), without the two
auxiliary classifiers (a network here has one loss).

    conv1/7x7_s2 64 7x7 stride 2 pad 3 -> relu -> pool1 3x3 stride 2 -> norm1 (LRN)
    conv2/3x3_reduce 64 1x1 -> relu -> conv2/3x3 192 3x3 pad 1 -> relu -> norm2 (LRN)
        -> pool2 3x3 stride 2
    inception 3a, 3b -> pool3 3x3 stride 2 -> inception 4a .. 4e -> pool4 3x3 stride 2
        -> inception 5a, 5b -> pool5 average over the whole map (7x7 at 224)
        -> dropout 0.4 -> classifier num_classes

An inception module runs four branches on one input and concatenates them along the
channels: 1x1; 3x3_reduce 1x1 -> 3x3 (pad 1); 5x5_reduce 1x1 -> 5x5 (pad 2); a 3x3 max-pool
(stride 1, pad 1) -> pool_proj 1x1. Every convolution is followed by a ReLU. Pooling rounds
up as Caffe's does (ceil_mode); LRN uses Caffe's values (size 5, alpha 1e-4, beta 0.75, k 1).
Layer names are Caffe's with '.' for '/': inception_3a.3x3_reduce, inception_3a.output, ...
Smallest image: 47x47 (pool4 then still sees a 3x3 map).
"""
from __future__ import annotations

from .alexnet import LRN_CAFFE

NATIVE_IMAGE_SIZE = 224
# module -> channels of (1x1, 3x3_reduce, 3x3, 5x5_reduce, 5x5, pool_proj), Caffe's table.
INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
}


def conv_relu(b, name: str, channels: int, kernel: int, src: str | None = None,
              **kwargs) -> str:
    b.conv(name, channels, kernel, src=src, **kwargs)
    return b.relu(f"{name}.relu")


def inception(b, name: str, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> str:
    """An inception module on the last map, with the channels of INCEPTION's columns."""
    x = b.last
    one = conv_relu(b, f"{name}.1x1", c1, 1, src=x)
    conv_relu(b, f"{name}.3x3_reduce", c3r, 1, src=x)
    three = conv_relu(b, f"{name}.3x3", c3, 3, padding=1)
    conv_relu(b, f"{name}.5x5_reduce", c5r, 1, src=x)
    five = conv_relu(b, f"{name}.5x5", c5, 5, padding=2)
    b.maxpool(f"{name}.pool", 3, stride=1, padding=1, src=x)
    proj = conv_relu(b, f"{name}.pool_proj", cp, 1)
    return b.concat(f"{name}.output", [one, three, five, proj])


def define(b, num_classes: int) -> None:
    conv_relu(b, "conv1.7x7_s2", 64, 7, stride=2, padding=3)
    b.maxpool("pool1.3x3_s2", 3, stride=2, ceil_mode=True)
    b.lrn("pool1.norm1", **LRN_CAFFE)
    conv_relu(b, "conv2.3x3_reduce", 64, 1)
    conv_relu(b, "conv2.3x3", 192, 3, padding=1)
    b.lrn("conv2.norm2", **LRN_CAFFE)
    b.maxpool("pool2.3x3_s2", 3, stride=2, ceil_mode=True)
    for module in ("3a", "3b"):
        inception(b, f"inception_{module}", *INCEPTION[module])
    b.maxpool("pool3.3x3_s2", 3, stride=2, ceil_mode=True)
    for module in ("4a", "4b", "4c", "4d", "4e"):
        inception(b, f"inception_{module}", *INCEPTION[module])
    b.maxpool("pool4.3x3_s2", 3, stride=2, ceil_mode=True)
    for module in ("5a", "5b"):
        inception(b, f"inception_{module}", *INCEPTION[module])
    b.global_avgpool("pool5.7x7_s1")
    b.dropout("pool5.drop_7x7_s1", 0.4)
    b.flatten("flatten")
    b.linear("loss3.classifier", num_classes)
