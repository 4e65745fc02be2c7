"""The GPU's float32 math mode, as the kernels, the planner, reports and the command line
name it. The CPU always computes strict FP32 with deterministic sums."""
from __future__ import annotations

#: What `--math` accepts: TF32 tensor-core math for float32 convolutions and matrix products,
#: or strict FP32.
MATH_MODES = ("tf32", "fp32")


def kernel_settings(kernels) -> dict:
    """{'math': ..., 'deterministic': ...} of a kernel module: a GPU module's own setting
    (its `math_mode()`), the CPU's strict FP32 for the NumPy one, which has none."""
    mode = getattr(kernels, "math_mode", None)
    if callable(mode):
        return dict(mode())
    return {"math": "fp32", "deterministic": True}


def describe(kernels, on_gpu: bool) -> str:
    """How a device does float32 math, as a run report says it: 'fp32' on the CPU; on a GPU
    the kernels' setting ('tf32' or 'fp32'), with ' deterministic' when only deterministic
    algorithms run."""
    if not on_gpu:
        return "fp32"
    state = kernel_settings(kernels)
    return str(state.get("math", "unknown")) + (" deterministic"
                                                if state.get("deterministic") else "")


def parse(text) -> tuple:
    """(math, deterministic) of a report's `math_mode` ('fp32 deterministic' -> ('fp32',
    True)); math is None when the text names no mode of MATH_MODES."""
    words = str(text or "").split()
    math = words[0] if words and words[0] in MATH_MODES else None
    return math, "deterministic" in words[1:]
