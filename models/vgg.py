"""VGG (Simonyan & Zisserman 2015) and the very deep variants vDNN trained (VGG-116 ... VGG-416).

Every VGG is five stages of 3x3 convolutions (padding 1, each followed by a ReLU) with
64, 128, 256, 512, 512 channels, a 2x2 stride-2 max-pool closing each stage, and the
classifier fc6 4096 -> relu -> dropout, fc7 4096 -> relu -> dropout, fc8. The depth counts
the conv layers plus the three fully connected ones:

    depth 11  (configuration A): 1, 1, 2, 2, 2 convs per stage
    depth 13  (configuration B): 2, 2, 2, 2, 2
    depth 16  (configuration D): 2, 2, 3, 3, 3   -> 138,357,544 parameters at 224, 1000 classes
    depth > 16: configuration D plus (depth - 16) extra 3x3 conv layers, spread evenly over
        the five stages: each stage gets (depth - 16) // 5 more, and the remainder r adds one
        more to each of the last r stages. So VGG-19 is 2, 2, 4, 4, 4 (configuration E),
        VGG-116 is 22, 22, 23, 23, 23 and VGG-416 is 82, 82, 83, 83, 83.

vDNN built VGG-116 ... VGG-416 by adding 3x3 conv layers to VGG-16; the even spread above is
minidnn's rule for where they go. An extra conv keeps its stage's channel count, so it adds
C*C*9 + C parameters (C = 64 ... 512) and one more full-size feature map of that stage.
Layer names: conv<stage>_<i>, relu<stage>_<i>, pool<stage>, fc6 ... fc8.
Smallest image: 32x32 (five halvings leave 1x1 maps).
"""
from __future__ import annotations

from minidnn.errors import ConfigError

NATIVE_IMAGE_SIZE = 224
STAGE_CHANNELS = (64, 128, 256, 512, 512)
_BASE = {11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3)}


def stage_depths(depth: int) -> tuple[int, ...]:
    """Conv layers per stage for a VGG of this depth (see the module docstring)."""
    depth = int(depth)
    if depth in _BASE:
        return _BASE[depth]
    if depth < 16:
        raise ConfigError(f"VGG depth must be 11, 13 or at least 16 (conv layers + 3 fully "
                          f"connected), got {depth}")
    extra = depth - 16
    per_stage, remainder = divmod(extra, 5)
    return tuple(base + per_stage + (1 if stage >= 5 - remainder else 0)
                 for stage, base in enumerate(_BASE[16]))


def define_vgg(depth: int):
    """A model definition `define(builder, num_classes)` for VGG of this depth."""
    counts = stage_depths(depth)

    def define(b, num_classes: int) -> None:
        for stage, (n, channels) in enumerate(zip(counts, STAGE_CHANNELS), start=1):
            for i in range(1, n + 1):
                b.conv(f"conv{stage}_{i}", channels, 3, padding=1)
                b.relu(f"relu{stage}_{i}")
            b.maxpool(f"pool{stage}", 2, stride=2)
        b.classifier((4096, 4096), num_classes)

    define.__doc__ = f"VGG-{depth}: {counts} conv layers per stage."
    return define
