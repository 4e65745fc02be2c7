"""bf16 copies of float32 weights, for the GPU's bf16 convolutions and matrix products.

Under mixed precision (bf16 feature maps) the weights stay float32, the master copy that SGD
updates; cuDNN's and cuBLAS's bf16 plans take bf16 operands, so each product reads a copy of
its weight rounded to bf16 (nearest even). `weights_in` makes one per call; within
`shared_weight_copies` (the executor's scope for the passes of one batch, between which the
weights hold still) each weight's copy is made at its first use and read by every later call.
dyn counts the copies (planner/costs.weight_copy_bytes).
"""
from __future__ import annotations

import contextlib

import cupy as cp
import numpy as np

from .cuda_pointwise import float_to_bf16
from .mapformat import layout_of, shaped


def empty_as(a, dtype):
    """A new array of a's shape and layout (C order or channels last) in `dtype`."""
    return shaped(cp.empty(a.size * dtype.itemsize, dtype=np.uint8), a.shape, dtype,
                  layout_of(a))


# While a batch's passes run (shared_weight_copies), the bf16 copies of the weights made so
# far, by (address, shape, strides): None outside, when each call makes its own. _lasting:
# the context the shared copies are made in (they outlive the call that makes them).
_copies: dict | None = None
_lasting = contextlib.nullcontext


@contextlib.contextmanager
def shared_weight_copies(lasting=None):
    """Within the body (the passes of one batch, which leave the weights as they are) each
    weight's bf16 copy is made at its first use and read by every later call; the copies are
    dropped when the body ends. Outside, each call makes and drops its own.

    lasting: a context (the allocator's `lasting`) to make the shared copies in: they outlive
    the call that makes them."""
    global _copies, _lasting
    outer = _copies, _lasting
    _copies, _lasting = {}, lasting or contextlib.nullcontext
    try:
        yield
    finally:
        _copies, _lasting = outer


def weights_in(w, dtype):
    """float32 `w` as a bf16 product reads it: a copy in `dtype` (bf16), rounded to nearest
    even, in w's layout."""
    key = (w.data.ptr, w.shape, w.strides)
    w16 = None if _copies is None else _copies.get(key)
    if w16 is None:
        with _lasting():      # outside shared_weight_copies: nullcontext
            w16 = empty_as(w, dtype)
        float_to_bf16(w, w16)
        if _copies is not None:
            _copies[key] = w16
    return w16
