"""2-D convolution with stride, padding, dilation and groups; weight (O, C/groups, KH, KW) as in
PyTorch. Backward reads only the input (for the weight gradient); the kernels do the work."""
from __future__ import annotations

from ..errors import ConfigError
from ..kernels import ConvSpec, out_size
from .base import Layer
from .precision import round_to_bf16, widened_bf16
from .slices import row_slices, sum_in_slices

CONV_ALGOS = ("fastest", "min_workspace")
# A plan setting names how a convolution layer picks its cuDNN plans, in one string (the
# planner's decisions and profiles are keyed by it): 'fastest', 'min_workspace', or
# 'fastest<=BYTES', the fastest plans whose workspace is at most BYTES.
LIMIT_PREFIX = "fastest<="


def plan_setting(algo: str, workspace_limit: int | None = None) -> str:
    """The setting string of (algo, workspace_limit)."""
    return algo if workspace_limit is None else f"{LIMIT_PREFIX}{int(workspace_limit)}"


def parse_plan_setting(setting: str) -> tuple:
    """(algo, workspace_limit) of a setting string; ConfigError if it is none."""
    if setting in CONV_ALGOS:
        return setting, None
    if isinstance(setting, str) and setting.startswith(LIMIT_PREFIX):
        digits = setting[len(LIMIT_PREFIX):]
        if digits.isdigit():
            return "fastest", int(digits)
    raise ConfigError(f"convolution plan setting must be one of {', '.join(CONV_ALGOS)} or "
                      f"'{LIMIT_PREFIX}BYTES'; got {setting!r}")


def describe_plan_setting(setting: str) -> str:
    """'fastest', 'memory-optimal' or '<= 1.50 GiB' (the fastest plans within it), for tables."""
    from ..errors import fmt_bytes
    algo, limit = parse_plan_setting(setting)
    if limit is not None:
        return f"<= {fmt_bytes(limit)}"
    return "memory-optimal" if algo == "min_workspace" else algo
#: The initializers Parameter.initial_value (base.py) knows, checked when a layer is made so that
#: a misspelt name fails there rather than at the first init_params.
INITIALIZERS = ("he_normal", "uniform_fan_in", "normal_0.01", "zeros", "ones")


def check_init(init, owner: str) -> str:
    """`init` if it names one of INITIALIZERS; ConfigError otherwise."""
    if init not in INITIALIZERS:
        raise ConfigError(f"{owner}: init must be one of {', '.join(INITIALIZERS)}; "
                          f"got {init!r}")
    return init


def as_pair(value, what: str, owner: str, minimum: int) -> tuple:
    """An int or a pair of ints -> (h, w), each at least `minimum`; ConfigError otherwise."""
    try:
        pair = (value, value) if isinstance(value, int) else tuple(value)
        ok = len(pair) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
    except TypeError:
        ok = False
    if not ok or min(pair) < minimum:
        raise ConfigError(f"{owner}: {what} must be an int or a pair of ints >= {minimum}, "
                          f"got {value!r}")
    return tuple(int(v) for v in pair)


class Conv2d(Layer):
    kind = "conv"
    recomputable = True
    grad_over_input = True
    retain_inputs = (0,)
    kernel_ops = ("conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter")

    def __init__(self, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, init: str = "he_normal",
                 algo: str = "fastest", name: str | None = None):
        super().__init__(name)
        owner = f"Conv2d {name!r}" if name else "Conv2d"
        if not isinstance(out_channels, int) or out_channels <= 0:
            raise ConfigError(f"{owner}: out_channels must be a positive int, got {out_channels!r}")
        if not isinstance(groups, int) or groups <= 0:
            raise ConfigError(f"{owner}: groups must be a positive int, got {groups!r}")
        if out_channels % groups:
            raise ConfigError(f"{owner}: out_channels={out_channels} must be divisible by "
                              f"groups={groups}")
        self.out_channels = out_channels
        self.kernel_size = as_pair(kernel_size, "kernel_size", owner, 1)
        self.stride = as_pair(stride, "stride", owner, 1)
        self.padding = as_pair(padding, "padding", owner, 0)
        self.dilation = as_pair(dilation, "dilation", owner, 1)
        self.groups = groups
        self.bias = bool(bias)
        self.init = check_init(init, owner)
        self.algo = algo
        self.workspace_limit = None

    @property
    def algo(self) -> str:
        return self._algo

    @algo.setter
    def algo(self, value: str) -> None:
        if value not in CONV_ALGOS:
            raise ConfigError(f"Conv2d {self.name!r}: algo must be one of {', '.join(CONV_ALGOS)}; "
                              f"got {value!r}")
        self._algo = value

    @property
    def workspace_limit(self) -> int | None:
        """With algo 'fastest': run the fastest plans whose workspace is at most this many
        bytes (None: any)."""
        return self._workspace_limit

    @workspace_limit.setter
    def workspace_limit(self, value) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ConfigError(f"Conv2d {self.name!r}: workspace_limit must be None or an int "
                              f">= 0 (bytes); got {value!r}")
        self._workspace_limit = value

    @property
    def plan_setting(self) -> str:
        """algo and workspace_limit as one setting string (see plan_setting())."""
        return plan_setting(self.algo, self.workspace_limit)

    @plan_setting.setter
    def plan_setting(self, setting: str) -> None:
        self.algo, self.workspace_limit = parse_plan_setting(setting)

    @property
    def spec(self) -> ConvSpec:
        """The kernels' description of this convolution (follows later changes of `algo` and
        `workspace_limit`)."""
        return self._spec(self.algo, self.workspace_limit)

    def spec_for(self, ctx) -> ConvSpec:
        """The spec of this call: the plan setting the step's decision gives this layer
        (ctx.conv_plans), or the layer's own."""
        setting = ctx.conv_plans.get(self.name) if ctx is not None else None
        if setting is None:
            return self.spec
        return self._spec(*parse_plan_setting(setting))

    def _spec(self, algo: str, workspace_limit: int | None) -> ConvSpec:
        return ConvSpec(stride=self.stride, padding=self.padding, dilation=self.dilation,
                        groups=self.groups, algo=algo, key=self.name or "",
                        workspace_limit=workspace_limit)

    def infer(self, in_shapes):
        s = in_shapes[0]
        if len(s) != 4:
            raise self.shape_error("(N, C, H, W)", s)
        n, c, h, w = s
        g = self.groups
        if c % g:
            raise self.shape_error(f"channels divisible by groups={g}", s)
        oh, ow = (out_size(size, k, st, p, d) for size, k, st, p, d in
                  zip((h, w), self.kernel_size, self.stride, self.padding, self.dilation))
        if oh < 1 or ow < 1:
            span = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))
            raise self.shape_error(f"a padded size (H + 2*{self.padding[0]}, W + 2*"
                                   f"{self.padding[1]}) of at least the dilated kernel {span}", s)
        kh, kw = self.kernel_size
        fan_in = c // g * kh * kw
        self.in_channels = c
        self.add_param("weight", (self.out_channels, c // g, kh, kw), self.init, fan_in=fan_in)
        if self.bias:
            self.add_param("bias", (self.out_channels,),
                           "zeros" if self.init == "he_normal" else self.init, fan_in=fan_in)
        return (n, self.out_channels, oh, ow)

    def forward(self, xs, y, aux, ctx):
        """x (N, C, H, W) -> y (N, O, OH, OW); without the bias when the ReLU after this
        layer adds it (ctx.bias_deferred), with the bias and that ReLU when this layer
        applies both (ctx.relu_in_conv; minidnn/fusion.py)."""
        relu = self.name in ctx.relu_in_conv
        bias = self.params["bias"] if relu else self._own_bias(ctx)
        b = None if bias is None else bias.data
        x, w, spec = xs[0], self.params["weight"].data, self.spec_for(ctx)
        # bf16 maps, computed widened (the CPU): the convolution is rounded before its bias
        # is added, as the GPU's bf16 plans round it (layers/precision.py), so that the bias
        # added here or by the ReLU after (minidnn/fusion.py) gives the same bits.
        late_bias = b if b is not None and widened_bf16(ctx, y) else None
        b = None if late_bias is not None else b
        if ctx.batch_slice is None:
            ctx.kernels.conv2d_forward(x, w, b, y, spec, workspace=ctx.workspace, relu=relu)
        else:
            for part in row_slices(x.shape[0], ctx.batch_slice):   # deterministic: by slice
                ctx.kernels.conv2d_forward(x[part], w, b, y[part], spec,
                                           workspace=ctx.workspace, relu=relu)
        if late_bias is not None:
            round_to_bf16(ctx.kernels, y)
            y += late_bias.reshape(1, -1, 1, 1)     # float32, as the fused ReLU adds it

    def backward(self, xs, y, gy, gxs, aux, ctx):
        spec = self.spec_for(ctx)
        w = self.params["weight"]
        # One after the other on one stream, so the two convolutions share one workspace. The
        # weight gradient first: gxs[0] may be x's own buffer (grad_over_input).
        bias = self._own_bias(ctx)            # its gradient too: the ReLU's, when it adds it
        gb = None if bias is None else bias.grad
        x, gx, k, ws = xs[0], gxs[0], ctx.kernels, ctx.workspace
        if ctx.batch_slice is None:
            k.conv2d_backward_filter(x, gy, w.grad, gb, spec, workspace=ws)
            if gx is not None:
                k.conv2d_backward_data(gy, w.data, gx, spec, workspace=ws)
            return
        # Deterministic (layers/slices.py): every slice's gradients, then every slice's gx.
        def filter_gradients(part, out):
            k.conv2d_backward_filter(x[part], gy[part], out[0], out[1], spec, workspace=ws)

        sum_in_slices(ctx, x.shape[0], [w.grad, gb], filter_gradients)
        if gx is not None:
            for part in row_slices(x.shape[0], ctx.batch_slice):
                k.conv2d_backward_data(gy[part], w.data, gx[part], spec, workspace=ws)

    def _own_bias(self, ctx):
        """The bias Parameter this layer adds itself: None without a bias, or when the ReLU
        after it adds it (ctx.bias_deferred; minidnn/fusion.py)."""
        if not self.bias or self.name in ctx.bias_deferred:
            return None
        return self.params["bias"]

    def flops(self):
        n, o, oh, ow = self.out_shape
        kh, kw = self.kernel_size
        return 2 * n * o * oh * ow * (self.in_channels // self.groups) * kh * kw

    def describe(self):
        kh, kw = self.kernel_size
        text = f"{getattr(self, 'in_channels', '?')} -> {self.out_channels}, {kh}x{kw}"
        for label, value, default in (("s", self.stride, (1, 1)), ("p", self.padding, (0, 0)),
                                      ("d", self.dilation, (1, 1))):
            if value != default:
                text += f" {label}{value[0] if value[0] == value[1] else value}"
        if self.groups != 1:
            text += f" g{self.groups}"
        return text
