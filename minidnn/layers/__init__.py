"""Layers: one file per layer family. Each declares what its backward needs (see base.py)."""
from .base import Layer, Parameter, StepContext
from .flatten import Flatten
from .linear import Linear
from .loss import SoftmaxCrossEntropy
from .relu import ReLU

__all__ = ["Layer", "Parameter", "StepContext", "Flatten", "Linear", "SoftmaxCrossEntropy", "ReLU"]
