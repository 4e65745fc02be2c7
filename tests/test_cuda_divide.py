"""The host side of kernels/cuda_divide.py: its constants divide exactly (no GPU needed)."""
import numpy as np

from minidnn.kernels.cuda_divide import divider


def test_divider_constants():
    """n // d == (umulhi(n, mul) + n) >> shift in 32-bit unsigned arithmetic for all n < 2**31:
    checked exactly (Python integers) over many divisors and numerators, edges included."""
    rng = np.random.default_rng(17)
    divisors = (list(range(1, 1025)) + [2**k + e for k in range(1, 31) for e in (-1, 0, 1)]
                + [int(d) for d in rng.integers(1, 2**31, 2000)])
    for d in divisors:
        if d >= 2**31:
            continue
        mul, shift = (int(v) for v in divider(d))
        assert 0 < mul < 2**32 and 0 <= shift <= 31
        top = 2**31 - 1
        ns = {0, 1, d - 1, d, d + 1, top, top - 1, top // d * d, top // d * d - 1}
        ns |= {int(n) for n in rng.integers(0, 2**31, 64)}
        for n in ns:
            if not 0 <= n <= top:
                continue
            t = (n * mul) >> 32
            assert t + n < 2**32
            assert (t + n) >> shift == n // d, (n, d)
