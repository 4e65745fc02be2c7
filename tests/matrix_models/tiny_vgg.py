"""A VGG in miniature for the combination matrix: two stages of 3x3 convolutions and ReLUs
closed by a 2x2 max-pool, then VGG's classifier (linear, ReLU, dropout) at a small width.

    conv1_1 8 -> relu -> conv1_2 8 -> relu -> pool1 -> conv2_1 16 -> relu -> conv2_2 16
        -> relu -> pool2 -> fc6 32 -> relu -> drop6 -> fc7 num_classes
"""
from minidnn.builder import NetBuilder

NATIVE_IMAGE_SIZE = 16


def build(num_classes, image_size):
    b = NetBuilder("tiny_vgg", image_size, num_classes)
    for stage, width in ((1, 8), (2, 16)):
        for i in (1, 2):
            b.conv(f"conv{stage}_{i}", width, 3, padding=1)
            b.relu(f"relu{stage}_{i}")
        b.maxpool(f"pool{stage}", 2, stride=2)
    b.flatten("flatten")
    b.linear("fc6", 32)
    b.relu("relu6")
    b.dropout("drop6", 0.5)
    b.linear("fc7", num_classes)
    return b.finish()
