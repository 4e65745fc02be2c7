"""ResNet (He et al. 2016) exactly as torchvision builds it, so weights load both ways.

    conv1 64 7x7 stride 2 pad 3 -> bn1 -> relu -> maxpool 3x3 stride 2 pad 1
    layer1 .. layer4: residual blocks with 64, 128, 256, 512 planes; the first block of
        layer2 .. layer4 halves the map (stride 2)
    avgpool over the whole map -> flatten -> fc num_classes

A basic block (ResNet-18, -34) is conv1 3x3 -> bn1 -> relu -> conv2 3x3 -> bn2, added to its
input, then a ReLU. A bottleneck block (ResNet-50, -101, -152) is conv1 1x1 -> bn1 -> relu ->
conv2 3x3 (the stride is here, as in torchvision's "v1.5") -> bn2 -> relu -> conv3 1x1 with
4 x planes channels -> bn3, added to its input, then a ReLU. Where a block changes the shape,
its input goes through downsample.0 (1x1 conv with the block's stride) and downsample.1 (BN)
first. Convolutions have no bias (BN follows each). Blocks per layer:

    resnet18  2, 2, 2, 2 basic        11,689,512 parameters (1000 classes)
    resnet34  3, 4, 6, 3 basic        21,797,672
    resnet50  3, 4, 6, 3 bottleneck   25,557,032
    resnet101 3, 4, 23, 3 bottleneck  44,549,160
    resnet152 3, 8, 36, 3 bottleneck  60,192,808

Parameter names are torchvision's: conv1.weight, bn1.weight, bn1.running_mean, ...,
layer1.0.conv1.weight, layer2.0.downsample.0.weight, layer2.0.downsample.1.bias, fc.weight.
Every window is padded, so any image size builds; BatchNorm in training needs more than one
value per channel, which a batch of 2 gives even at 1x1 maps.
"""
from __future__ import annotations

NATIVE_IMAGE_SIZE = 224
# depth -> (block kind, blocks per layer)
CONFIGS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
           50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
           152: ("bottleneck", (3, 8, 36, 3))}
EXPANSION = {"basic": 1, "bottleneck": 4}


def basic_block(b, name: str, planes: int, stride: int) -> str:
    x = b.last
    b.conv(f"{name}.conv1", planes, 3, stride=stride, padding=1, bias=False, src=x)
    b.batchnorm(f"{name}.bn1")
    b.relu(f"{name}.relu1")
    b.conv(f"{name}.conv2", planes, 3, padding=1, bias=False)
    out = b.batchnorm(f"{name}.bn2")
    return _join(b, name, x, out, planes, stride)


def bottleneck_block(b, name: str, planes: int, stride: int) -> str:
    x = b.last
    b.conv(f"{name}.conv1", planes, 1, bias=False, src=x)
    b.batchnorm(f"{name}.bn1")
    b.relu(f"{name}.relu1")
    b.conv(f"{name}.conv2", planes, 3, stride=stride, padding=1, bias=False)
    b.batchnorm(f"{name}.bn2")
    b.relu(f"{name}.relu2")
    b.conv(f"{name}.conv3", planes * 4, 1, bias=False)
    out = b.batchnorm(f"{name}.bn3")
    return _join(b, name, x, out, planes * 4, stride)


def _join(b, name: str, x: str, out: str, channels: int, stride: int) -> str:
    """out + x (x through downsample when the shapes differ), then a ReLU."""
    shortcut = x
    if stride != 1 or b.geometry(x)[0] != channels:
        b.conv(f"{name}.downsample.0", channels, 1, stride=stride, bias=False, src=x)
        shortcut = b.batchnorm(f"{name}.downsample.1")
    b.add(f"{name}.add", [out, shortcut])
    return b.relu(f"{name}.relu")


def define_resnet(depth: int):
    """A model definition `define(builder, num_classes)` for ResNet of this depth."""
    kind, blocks = CONFIGS[depth]
    block = basic_block if kind == "basic" else bottleneck_block

    def define(b, num_classes: int) -> None:
        b.conv("conv1", 64, 7, stride=2, padding=3, bias=False)
        b.batchnorm("bn1")
        b.relu("relu")
        b.maxpool("maxpool", 3, stride=2, padding=1)
        for layer, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
            for i in range(count):
                stride = 2 if i == 0 and layer > 1 else 1
                block(b, f"layer{layer}.{i}", planes, stride)
        b.global_avgpool("avgpool")
        b.flatten("flatten")
        b.linear("fc", num_classes)

    define.__doc__ = f"ResNet-{depth}: {kind} blocks, {blocks} per layer."
    return define
