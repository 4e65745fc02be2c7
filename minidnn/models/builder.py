"""NetBuilder: writes a chain of image layers and tracks the spatial size as it goes.

Every built-in model is one function `define(b, num_classes)` that calls the builder
(`b.conv(...)`, `b.relu(...)`, `b.maxpool(...)`, ...). Run on a real builder it makes the
Network; run on a dry builder (no layers, geometry only) it tells whether an image size is
big enough, so a model can say the smallest image it accepts instead of failing deep inside
shape inference.

Images are square: `image_size` is both the height and the width.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..kernels import out_size


class ImageTooSmall(Exception):
    """Raised inside a builder when a window no longer fits; `build` turns it into ConfigError."""

    def __init__(self, layer: str, size: int):
        super().__init__(f"{layer} gets {size}x{size} inputs, too small for its window")
        self.layer, self.size = layer, size


class NetBuilder:
    """Appends layers to a Network (or, with dry=True, only follows the geometry).

    Attributes: size (current height = width), channels (current channel count).
    """

    def __init__(self, name: str, image_size: int, num_classes: int, in_channels: int = 3,
                 dry: bool = False):
        self.name = name
        self.size = int(image_size)
        self.channels = int(in_channels)
        self.num_classes = int(num_classes)
        self.dry = dry
        self.net = None
        if not dry:
            from ..network import Network
            self.net = Network((in_channels, self.size, self.size), num_classes=num_classes,
                               name=name)

    def _window(self, name: str, kernel: int, stride: int, padding: int, dilation: int = 1,
                ceil_mode: bool = False) -> None:
        span = dilation * (kernel - 1) + 1
        if self.size + 2 * padding < span:
            raise ImageTooSmall(name, self.size)
        out = out_size(self.size, kernel, stride, padding, dilation, ceil_mode)
        if out < 1:
            raise ImageTooSmall(name, self.size)
        self.size = out

    # ---- layers ------------------------------------------------------------------------------
    def conv(self, name: str, out_channels: int, kernel: int, stride: int = 1, padding: int = 0,
             groups: int = 1, **kwargs) -> None:
        """Conv2d with a square kernel; kwargs go to Conv2d (bias, init, algo, dilation)."""
        self._window(name, kernel, stride, padding, kwargs.get("dilation", 1))
        self.channels = out_channels
        if not self.dry:
            from ..layers import Conv2d
            self.net.add(Conv2d(out_channels, kernel, stride=stride, padding=padding,
                                groups=groups, **kwargs), name=name)

    def relu(self, name: str) -> None:
        if not self.dry:
            from ..layers import ReLU
            self.net.add(ReLU(), name=name)

    def lrn(self, name: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
            k: float = 2.0) -> None:
        if not self.dry:
            from ..layers import LRN
            self.net.add(LRN(size=size, alpha=alpha, beta=beta, k=k), name=name)

    def maxpool(self, name: str, kernel: int, stride: int | None = None, padding: int = 0,
                ceil_mode: bool = False) -> None:
        stride = kernel if stride is None else stride
        self._window(name, kernel, stride, padding, 1, ceil_mode)
        if not self.dry:
            from ..layers import MaxPool2d
            self.net.add(MaxPool2d(kernel, stride=stride, padding=padding, ceil_mode=ceil_mode),
                         name=name)

    def avgpool(self, name: str, kernel: int, stride: int | None = None, padding: int = 0,
                ceil_mode: bool = False) -> None:
        stride = kernel if stride is None else stride
        self._window(name, kernel, stride, padding, 1, ceil_mode)
        if not self.dry:
            from ..layers import AvgPool2d
            self.net.add(AvgPool2d(kernel, stride=stride, padding=padding, ceil_mode=ceil_mode),
                         name=name)

    def dropout(self, name: str, p: float = 0.5) -> None:
        if not self.dry:
            from ..layers import Dropout
            self.net.add(Dropout(p), name=name)

    def flatten(self, name: str = "flatten") -> None:
        self.channels = self.channels * self.size * self.size
        self.size = 1
        if not self.dry:
            from ..layers import Flatten
            self.net.add(Flatten(), name=name)

    def linear(self, name: str, out_features: int, init: str = "uniform_fan_in") -> None:
        """Fully connected, initialised like PyTorch's nn.Linear: U(-1/sqrt(fan_in), ...).

        He-normal (right for the convolutions) makes the outputs of the 4096-wide layers of
        AlexNet, OverFeat and VGG so large, without batch normalisation, that SGD at the usual
        learning rates diverges in the first steps.
        """
        self.channels = out_features
        if not self.dry:
            from ..layers import Linear
            self.net.add(Linear(out_features, init=init), name=name)

    def classifier(self, hidden: tuple, num_classes: int, dropout: float = 0.5,
                   first: int = 6) -> None:
        """The paper networks' head: flatten, then for each width in `hidden` a fully connected
        layer fc{first}, fc{first+1}, ... with ReLU and dropout, then the class layer."""
        self.flatten("flatten")
        for k, width in enumerate(hidden):
            n = first + k
            self.linear(f"fc{n}", width)
            self.relu(f"relu{n}")
            self.dropout(f"drop{n}", dropout)
        self.linear(f"fc{first + len(hidden)}", num_classes)

    def finish(self):
        """Add the softmax cross-entropy loss, infer shapes at batch 1, return the Network."""
        if self.dry:
            return None
        self.net.add_loss()
        self.net.infer_shapes(1)
        return self.net


def min_image_size(define, num_classes: int = 10, limit: int = 4096) -> int:
    """The smallest square image `define(builder, num_classes)` accepts (geometry only)."""
    for size in range(1, limit + 1):
        try:
            define(NetBuilder("probe", size, num_classes, dry=True), num_classes)
            return size
        except ImageTooSmall:
            continue
    raise ConfigError(f"no image size up to {limit} fits this network")
