"""Division by a number fixed for a kernel launch, as a multiply-high, an add and a shift.

A 32-bit integer division by a run-time value costs a dozen or more instructions on the GPU,
enough to keep a kernel that divides per element below memory speed. When the divisor d is
the same for the whole launch, the host computes (mul, shift) once (`divider(d)`) and the
kernel divides with DIVIDE_SOURCE's `divide(n, mul, shift)`: Granlund and Montgomery's
round-up method, as in PyTorch's IntDivider, exact for 0 <= n < 2**31.
"""
from __future__ import annotations

import functools

import numpy as np

#: Operands of `divide` (dividend and divisor) stay below this.
INDEX_LIMIT = 2**31

#: CUDA source of the device function; paste it into a kernel module's source.
DIVIDE_SOURCE = r"""
// n / d for 0 <= n < 2^31 and 1 <= d < 2^31, with (mul, shift) = divider(d) from the host.
__device__ __forceinline__ unsigned int divide(unsigned int n, unsigned int mul,
                                               unsigned int shift) {
    return (__umulhi(n, mul) + n) >> shift;
}
"""


@functools.lru_cache(maxsize=None)
def divider(d: int) -> tuple:
    """(mul, shift) as uint32 such that n // d == (umulhi(n, mul) + n) >> shift, in 32-bit
    unsigned arithmetic, for every 0 <= n < 2**31 (1 <= d < 2**31)."""
    if not 1 <= d < INDEX_LIMIT:
        raise ValueError(f"divisor {d} is outside [1, 2**31)")
    shift = (d - 1).bit_length()                      # the least s with 2**s >= d
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1   # < 2**32 because 2**shift < 2 * d
    return np.uint32(mul), np.uint32(shift)
