"""JSON has no NaN, no infinities and no NumPy scalars: `json_safe` makes a value fit."""
from __future__ import annotations

import math


def json_safe(value):
    """`value` with NaN and infinities as None and NumPy scalars as Python numbers, inside
    dicts, lists and tuples too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        return json_safe(value.item())
    return value
