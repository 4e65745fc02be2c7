"""Layers: one file per layer family. Each declares what its backward needs (see base.py)."""
from .base import Buffer, Layer, Parameter, StepContext
from .batchnorm import BatchNorm2d
from .conv import Conv2d
from .dropout import Dropout
from .flatten import Flatten
from .linear import Linear
from .loss import SoftmaxCrossEntropy
from .lrn import LRN
from .merge import Add, BatchJoin, Concat
from .pool import AvgPool2d, MaxPool2d
from .relu import ReLU

__all__ = ["Buffer", "Layer", "Parameter", "StepContext", "Add", "AvgPool2d", "BatchJoin",
           "BatchNorm2d", "Concat", "Conv2d", "Dropout", "Flatten", "LRN", "Linear", "MaxPool2d", "ReLU", "SoftmaxCrossEntropy"]
