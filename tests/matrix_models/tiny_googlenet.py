"""A GoogLeNet in miniature for the combination matrix: Caffe's stem (convolution, ReLU,
max-pool, LRN), one inception module of models/googlenet.py (four branches joined by a
Concat), a second LRN and pool, then dropout and the classifier.

    conv1 8 3x3 -> relu -> pool1 -> norm1 (LRN) -> inception_3a (4+4+8+2+4+4 channels, Concat)
        -> norm2 (LRN) -> pool2 -> flatten -> drop -> classifier num_classes
"""
from minidnn.builder import NetBuilder
from minidnn.models.alexnet import LRN_CAFFE
from minidnn.models.googlenet import conv_relu, inception

NATIVE_IMAGE_SIZE = 16


def build(num_classes, image_size):
    b = NetBuilder("tiny_googlenet", image_size, num_classes)
    conv_relu(b, "conv1", 8, 3, padding=1)
    b.maxpool("pool1", 3, stride=2, ceil_mode=True)
    b.lrn("norm1", **LRN_CAFFE)
    inception(b, "inception_3a", 4, 4, 8, 2, 4, 4)
    b.lrn("norm2", **LRN_CAFFE)
    b.maxpool("pool2", 3, stride=2, ceil_mode=True)
    b.flatten("flatten")
    b.dropout("drop", 0.4)
    b.linear("classifier", num_classes)
    return b.finish()
