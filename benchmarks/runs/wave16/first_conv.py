"""The first convolution of a network alone, its input given PROBE_C channels (3 as the
network has them, or padded with zero channels to 4 or 8): a model file for
scripts/layer_times.py, to see what three input channels cost a convolution.

    PROBE_NET=resnet50|vgg16|googlenet|alexnet PROBE_C=3|4|8 \
        python3 scripts/layer_times.py --model benchmarks/runs/wave16/first_conv.py ...
"""
import os

from minidnn.builder import NetBuilder

# name: (image size, output channels, kernel, stride, padding)
STEMS = {"resnet50": (224, 64, 7, 2, 3), "vgg16": (224, 64, 3, 1, 1),
         "googlenet": (224, 64, 7, 2, 3), "alexnet": (227, 96, 11, 4, 0)}
NATIVE_IMAGE_SIZE = STEMS[os.environ.get("PROBE_NET", "resnet50")][0]


def build(num_classes, image_size):
    name = os.environ.get("PROBE_NET", "resnet50")
    _, out, kernel, stride, padding = STEMS[name]
    b = NetBuilder(f"{name}-conv1-c{os.environ.get('PROBE_C', '3')}", image_size, num_classes,
                   in_channels=int(os.environ.get("PROBE_C", "3")))
    b.conv("conv1", out, kernel, stride=stride, padding=padding)
    b.relu("relu1")
    b.global_avgpool("gap")
    b.flatten("flatten")
    b.linear("fc", num_classes)
    return b.finish()
