"""A ResNet in miniature for the combination matrix: torchvision's stem (conv, BatchNorm,
ReLU, max-pool) and two basic blocks of models/resnet.py, the second halving the map through
its downsample branch, then a global average pool and the classifier.

    conv1 8 3x3 -> bn1 -> relu -> maxpool -> layer1.0 (8 planes) -> layer2.0 (16, stride 2)
        -> avgpool -> flatten -> fc num_classes
"""
from minidnn.builder import NetBuilder
from minidnn.models.resnet import basic_block

NATIVE_IMAGE_SIZE = 16


def build(num_classes, image_size):
    b = NetBuilder("tiny_resnet", image_size, num_classes)
    b.conv("conv1", 8, 3, padding=1, bias=False)
    b.batchnorm("bn1")
    b.relu("relu")
    b.maxpool("maxpool", 3, stride=2, padding=1)
    basic_block(b, "layer1.0", 8, 1)
    basic_block(b, "layer2.0", 16, 2)
    b.global_avgpool("avgpool")
    b.flatten("flatten")
    b.linear("fc", num_classes)
    return b.finish()
