"""NetBuilder: writes image layers into a Network and tracks every map's geometry as it goes.

Every built-in model (the top-level models/ folder) is one function `define(b, num_classes)`
that calls the builder (`b.conv(...)`, `b.relu(...)`, `b.maxpool(...)`, ...). Run on a real
builder it makes the Network; run on a dry builder (no layers, geometry only) it tells whether
an image size is big enough, so a model can say the smallest image it accepts instead of
failing deep inside shape inference.

A chain needs no names of inputs: each layer reads the one before it. A branching network
(ResNet, GoogLeNet) passes `src=` (the name of the map a layer reads; every layer method
returns its own name) and joins branches with `add` and `concat`:

    x = b.relu("relu1")
    short = b.conv("down", 128, 1, stride=2, src=x)
    long = b.conv("conv2", 128, 3, stride=2, padding=1, src=x)
    b.add("join", [long, short])

Images are square: a map's size is both its height and its width.
"""
from __future__ import annotations

from .errors import ConfigError
from .kernels import out_size
from .layers import (LRN, Add, AvgPool2d, BatchNorm2d, Concat, Conv2d, Dropout, Flatten, Linear,
                     MaxPool2d, ReLU)
from .network import DATA, Network


class ImageTooSmall(Exception):
    """Raised inside a builder when a window no longer fits; `build` turns it into ConfigError."""

    def __init__(self, layer: str, size: int):
        super().__init__(f"{layer} gets {size}x{size} inputs, too small for its window")
        self.layer, self.size = layer, size


class NetBuilder:
    """Appends layers to a Network (or, with dry=True, only follows the geometry).

    Attributes: size (height = width of the last map written), channels (its channel count),
    last (its name).
    """

    def __init__(self, name: str, image_size: int, num_classes: int, in_channels: int = 3,
                 dry: bool = False):
        self.name = name
        self.num_classes = int(num_classes)
        self.dry = dry
        self.net = None
        self._geometry = {DATA: (int(in_channels), int(image_size))}   # map -> (channels, size)
        self.last = DATA
        if not dry:
            self.net = Network((in_channels, int(image_size), int(image_size)),
                               num_classes=num_classes, name=name)

    @property
    def channels(self) -> int:
        return self._geometry[self.last][0]

    @property
    def size(self) -> int:
        return self._geometry[self.last][1]

    def geometry(self, name: str) -> tuple[int, int]:
        """(channels, size) of the map `name`."""
        return self._geometry[name]

    def _add(self, name: str, make_layer, srcs: list[str], channels: int, size: int) -> str:
        """Record the new map's geometry and, unless dry, add the layer reading `srcs`."""
        if not self.dry:
            self.net.add(make_layer(), inputs=list(srcs), name=name)
        self._geometry[name] = (int(channels), int(size))
        self.last = name
        return name

    def _src(self, src: str | None) -> str:
        return self.last if src is None else src

    def _window(self, name: str, src: str, kernel: int, stride: int, padding: int,
                dilation: int = 1, ceil_mode: bool = False) -> int:
        """The output size of a window over `src`; ImageTooSmall when it does not fit."""
        size = self._geometry[src][1]
        span = dilation * (kernel - 1) + 1
        if size + 2 * padding < span:
            raise ImageTooSmall(name, size)
        out = out_size(size, kernel, stride, padding, dilation, ceil_mode)
        if out < 1:
            raise ImageTooSmall(name, size)
        return out

    # ---- layers ------------------------------------------------------------------------------
    def conv(self, name: str, out_channels: int, kernel: int, stride: int = 1, padding: int = 0,
             groups: int = 1, src: str | None = None, **kwargs) -> str:
        """Conv2d with a square kernel; kwargs go to Conv2d (bias, init, algo, dilation)."""
        src = self._src(src)
        size = self._window(name, src, kernel, stride, padding, kwargs.get("dilation", 1))
        return self._add(name, lambda: Conv2d(out_channels, kernel, stride=stride,
                                              padding=padding, groups=groups, **kwargs),
                         [src], out_channels, size)

    def batchnorm(self, name: str, src: str | None = None, **kwargs) -> str:
        """BatchNorm2d over the channels of `src`; kwargs go to BatchNorm2d (eps, momentum)."""
        src = self._src(src)
        return self._add(name, lambda: BatchNorm2d(**kwargs), [src], *self._geometry[src])

    def relu(self, name: str, src: str | None = None) -> str:
        src = self._src(src)
        return self._add(name, ReLU, [src], *self._geometry[src])

    def lrn(self, name: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
            k: float = 2.0, src: str | None = None) -> str:
        src = self._src(src)
        return self._add(name, lambda: LRN(size=size, alpha=alpha, beta=beta, k=k), [src],
                         *self._geometry[src])

    def maxpool(self, name: str, kernel: int, stride: int | None = None, padding: int = 0,
                ceil_mode: bool = False, src: str | None = None) -> str:
        return self._pool(MaxPool2d, name, kernel, stride, padding, ceil_mode, src)

    def avgpool(self, name: str, kernel: int, stride: int | None = None, padding: int = 0,
                ceil_mode: bool = False, src: str | None = None) -> str:
        return self._pool(AvgPool2d, name, kernel, stride, padding, ceil_mode, src)

    def _pool(self, cls, name, kernel, stride, padding, ceil_mode, src) -> str:
        """A pooling layer of class `cls` (stride defaults to the kernel, as PyTorch's)."""
        src = self._src(src)
        stride = kernel if stride is None else stride
        size = self._window(name, src, kernel, stride, padding, 1, ceil_mode)
        return self._add(name, lambda: cls(kernel, stride=stride, padding=padding,
                                           ceil_mode=ceil_mode),
                         [src], self._geometry[src][0], size)

    def global_avgpool(self, name: str, src: str | None = None) -> str:
        """Average over the whole map (PyTorch's AdaptiveAvgPool2d(1)): (N, C, S, S) -> (N, C, 1, 1)."""
        src = self._src(src)
        return self.avgpool(name, self._geometry[src][1], src=src)

    def dropout(self, name: str, p: float = 0.5, src: str | None = None) -> str:
        src = self._src(src)
        return self._add(name, lambda: Dropout(p), [src], *self._geometry[src])

    def flatten(self, name: str = "flatten", src: str | None = None) -> str:
        src = self._src(src)
        channels, size = self._geometry[src]
        return self._add(name, Flatten, [src], channels * size * size, 1)

    def linear(self, name: str, out_features: int, init: str = "uniform_fan_in",
               src: str | None = None) -> str:
        """Fully connected, initialised like PyTorch's nn.Linear: U(-1/sqrt(fan_in), ...).

        He-normal (right for the convolutions) makes the outputs of the 4096-wide layers of
        AlexNet, OverFeat and VGG so large, without batch normalisation, that SGD at the usual
        learning rates diverges in the first steps.
        """
        src = self._src(src)
        return self._add(name, lambda: Linear(out_features, init=init), [src], out_features, 1)

    def add(self, name: str, srcs: list[str]) -> str:
        """The elementwise sum of maps of one shape (a residual join)."""
        shapes = {self._geometry[s] for s in srcs}
        if len(shapes) != 1:
            raise ConfigError(f"model {self.name!r}: {name} adds maps of different shapes "
                              f"{[self._geometry[s] for s in srcs]}")
        return self._add(name, Add, srcs, *self._geometry[srcs[0]])

    def concat(self, name: str, srcs: list[str]) -> str:
        """The maps of `srcs` stacked along the channels (an inception module's output)."""
        sizes = {self._geometry[s][1] for s in srcs}
        if len(sizes) != 1:
            raise ConfigError(f"model {self.name!r}: {name} concatenates maps of different "
                              f"sizes {[self._geometry[s] for s in srcs]}")
        return self._add(name, Concat, srcs, sum(self._geometry[s][0] for s in srcs),
                         sizes.pop())

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
