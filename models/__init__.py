"""The model registry: the networks of this folder by name, or your own from a .py file.

This folder is the package `minidnn.models` (pyproject.toml maps it there when minidnn is
installed); each family is one short file written against the builder (minidnn/builder.py).

    net = models.build("alexnet", num_classes=10, image_size=64)
    net = models.build("vgg116")                      # native size 224, 1000 classes
    net = models.build("path/to/mynet.py", num_classes=5, image_size=32)
    models.names()        # ['alexnet', 'googlenet', 'mlp', ..., 'resnet152', ..., 'vgg416']

Any `vgg<depth>` resolves through `vgg.stage_depths` (11, 13 or >= 16). A model file
defines `build(num_classes, image_size) -> Network` (it may leave off the loss; it is added;
it may take `in_channels` too, for data that is not 3-channel) and may set `NATIVE_IMAGE_SIZE`.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
from dataclasses import dataclass
from typing import Callable

from minidnn.builder import ImageTooSmall, NetBuilder, min_image_size as _min_size
from minidnn.errors import ConfigError

from . import alexnet, googlenet, overfeat, resnet, small
from . import vgg as _vgg_defs
from .vgg import stage_depths


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model: its definition, native input size and a one-line description."""
    name: str
    define: Callable
    native_image_size: int
    description: str


_BUILTIN = {
    "alexnet": ModelSpec("alexnet", alexnet.define, alexnet.NATIVE_IMAGE_SIZE,
                         "AlexNet (Caffe bvlc_alexnet, as in vDNN), 61M parameters at 227"),
    "overfeat": ModelSpec("overfeat", overfeat.define, overfeat.NATIVE_IMAGE_SIZE,
                          "OverFeat fast (Sermanet et al. 2014), 146M parameters at 231"),
    "googlenet": ModelSpec("googlenet", googlenet.define, googlenet.NATIVE_IMAGE_SIZE,
                           "GoogLeNet (Caffe bvlc_googlenet, as in vDNN), inception modules "
                           "and LRN, 7.0M parameters at 224"),
    **{f"resnet{depth}": ModelSpec(f"resnet{depth}", resnet.define_resnet(depth),
                                   resnet.NATIVE_IMAGE_SIZE,
                                   f"ResNet-{depth} as torchvision builds it "
                                   f"({resnet.CONFIGS[depth][0]} blocks, BatchNorm)")
       for depth in resnet.CONFIGS},
    "mlp": ModelSpec("mlp", small.define_mlp, small.NATIVE_IMAGE_SIZE,
                     "3-layer perceptron (Linear/ReLU only)"),
    "tiny_cnn": ModelSpec("tiny_cnn", small.define_tiny_cnn, small.NATIVE_IMAGE_SIZE,
                          "two conv stages and two fully connected layers"),
}
_LISTED_VGG = (11, 13, 16, 19, 116, 216, 316, 416)
_VGG_NAME = re.compile(r"vgg(\d+)")


def names() -> list[str]:
    """Built-in model names, a family's depths in order (any other vgg<depth> with depth 11,
    13 or >= 16 also builds)."""
    def family_then_depth(name: str):
        family, depth = re.fullmatch(r"(.*?)(\d*)", name).groups()
        return family, int(depth or 0)
    return sorted(_BUILTIN, key=family_then_depth) + [f"vgg{d}" for d in _LISTED_VGG]


def spec(name: str) -> ModelSpec:
    """The ModelSpec of a built-in name; ConfigError listing the names for an unknown one."""
    key = str(name).lower()
    if key in _BUILTIN:
        return _BUILTIN[key]
    m = _VGG_NAME.fullmatch(key)
    if m:
        depth = int(m.group(1))
        counts = stage_depths(depth)  # ConfigError for impossible depths
        return ModelSpec(key, _vgg_defs.define_vgg(depth), _vgg_defs.NATIVE_IMAGE_SIZE,
                         f"VGG-{depth}, {'/'.join(map(str, counts))} conv layers per stage")
    raise ConfigError(f"unknown model {name!r}; built-in models: {', '.join(names())} "
                      f"(or a path to a .py file defining build(num_classes, image_size))")


def is_model_file(name_or_path: str) -> bool:
    """True when the argument names a Python file rather than a built-in model."""
    s = str(name_or_path)
    return s.endswith(".py") or os.sep in s or "/" in s


def native_image_size(name_or_path: str) -> int:
    """The input size the model was designed for (224 for a model file that does not say)."""
    if is_model_file(name_or_path):
        return int(getattr(_load_module(name_or_path), "NATIVE_IMAGE_SIZE", 224))
    return spec(name_or_path).native_image_size


def min_image_size(name: str) -> int:
    """The smallest square image a built-in model accepts (1 for model files: not known)."""
    if is_model_file(name):
        return 1
    return _min_size(spec(name).define)


def build(name_or_path: str, num_classes: int = 1000, image_size: int | None = None,
          dtype=None, in_channels: int = 3):
    """A Network for a built-in model name or a model file, shapes inferred at batch 1.

    image_size: height = width of the input images; None means the model's native size.
    in_channels: channels of the input images (1 for grey data such as Fashion-MNIST); a
    model file that builds for other than 3 must accept the keyword `in_channels`.
    dtype: the float type of parameters and feature maps, float32 or float64 (None: the
    definition's own, float32 for the built-in models).
    Raises ConfigError for an unknown name, an image too small for the network (with the
    smallest size that fits), another dtype or a model file that cannot be loaded.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    if dtype is not None:
        import numpy as np
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            dtype = None
        if dtype not in (np.float32, np.float64):
            raise ConfigError(f"dtype must be float32 or float64, got {dtype!r}")
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ConfigError(f"in_channels must be a positive integer, got {in_channels!r}")
    net = _build(name_or_path, num_classes, image_size, in_channels)
    if dtype is not None and dtype != net.dtype:
        net.dtype = dtype
        net.infer_shapes(1)   # the layers' buffers are declared in the network's dtype
    return net


def _build(name_or_path: str, num_classes: int, image_size: int | None, in_channels: int):
    if is_model_file(name_or_path):
        module = _load_module(str(name_or_path))
        if image_size is None:
            image_size = int(getattr(module, "NATIVE_IMAGE_SIZE", 224))
        _check_image_size(image_size)
        return _build_from_file(module, str(name_or_path), num_classes, image_size, in_channels)
    s = spec(name_or_path)
    if image_size is None:
        image_size = s.native_image_size
    _check_image_size(image_size)
    try:
        b = NetBuilder(s.name, image_size, num_classes, in_channels=in_channels)
        s.define(b, num_classes)
    except ImageTooSmall as e:
        raise ConfigError(f"model {s.name!r} needs image_size >= {_min_size(s.define)}; "
                          f"{image_size} is too small ({e})") from None
    return b.finish()


def vgg(depth: int, num_classes: int = 1000, image_size: int | None = None):
    """VGG-<depth> as a Network: vgg(16) is configuration D, vgg(116) ... vgg(416) are vDNN's
    very deep variants (see models/vgg.py for where the extra layers go)."""
    return build(f"vgg{int(depth)}", num_classes=num_classes, image_size=image_size)


def _load_module(path: str):
    if not os.path.isfile(path):
        raise ConfigError(f"--model: model file {path!r} does not exist "
                          f"(built-in models: {', '.join(names())})")
    mod_name = "minidnn_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"model file {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report it as their input, on one line
        raise ConfigError(f"model file {path!r} failed to import: "
                          f"{type(e).__name__}: {e}") from e
    if not callable(getattr(module, "build", None)):
        raise ConfigError(f"model file {path!r} must define build(num_classes, image_size) "
                          f"returning a minidnn Network")
    return module


def _check_image_size(image_size) -> None:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ConfigError(f"image_size must be a positive integer, got {image_size!r}")


def _build_from_file(module, path: str, num_classes: int, image_size: int, in_channels: int):
    from minidnn.errors import MinidnnError
    from minidnn.network import Network
    # Only grey (or other non-RGB) data asks a model file for its channel count, so that
    # files written for RGB with build(num_classes, image_size) keep working.
    extra = {} if in_channels == 3 else {"in_channels": in_channels}
    if extra and "in_channels" not in inspect.signature(module.build).parameters:
        raise ConfigError(f"model file {path!r}: the data has {in_channels} channel(s); its "
                          f"build() must accept in_channels= (it builds for 3)")
    try:
        net = module.build(num_classes, image_size, **extra)
    except MinidnnError:
        raise
    except Exception as e:
        raise ConfigError(f"model file {path!r}: build({num_classes}, {image_size}) failed: "
                          f"{type(e).__name__}: {e}") from e
    if not isinstance(net, Network):
        raise ConfigError(f"model file {path!r}: build() returned {type(net).__name__}, "
                          f"expected a minidnn Network")
    if not net.nodes or net.nodes[-1].layer.kind != "loss":
        net.add_loss()
    net.infer_shapes(1)
    return net


__all__ = ["ModelSpec", "build", "names", "spec", "native_image_size", "min_image_size",
           "is_model_file", "stage_depths", "vgg"]
