"""Uniform random numbers on the GPU from a counter: draw i of key k is a hash of (k, i).

Dropout seeds a generator per (seed, step, layer) so that a resumed run, and a batch split
into micro-batches, draw the same masks. CuPy's generator (cuRAND XORWOW) keeps a state for
every thread it may run (12.4 MiB on an H200) and sets all of them up whenever one is made:
on the H200 that set-up took 0.6 ms per dropout layer and step (1.15 of OverFeat's 24.6 ms
step). A counter-based generator needs neither state nor set-up: each number is a function of
its key and its index alone.

The function is splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", 2014: the output function of Java's SplittableRandom): the i-th output of the
sequence started at `key` is mix(key + (i + 1) * golden), and a float in [0, 1) is its top 24
bits times 2**-24, exact in float32. `draws(key, n)` in NumPy gives the same bits (tests).
"""
from __future__ import annotations

import cupy as cp
import numpy as np

GOLDEN = 0x9E3779B97F4A7C15   # 2**64 / golden ratio, splitmix64's increment

_SOURCE = r"""
__device__ __forceinline__ float draw(unsigned long long key, unsigned long long i) {
    unsigned long long z = key + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 5.9604644775390625e-08f;   // 2**-24
}

extern "C" __global__ void uniform_float(float* out, unsigned long long key,
                                         unsigned long long first, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride)
        out[i] = draw(key, first + i);
}

// The same draws, the key read from device memory when the kernel runs (a replayed step).
extern "C" __global__ void uniform_float_at(float* out, const unsigned long long* key,
                                            unsigned long long first, unsigned long long n) {
    const unsigned long long k = *key;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride)
        out[i] = draw(k, first + i);
}
"""

_module = cp.RawModule(code=_SOURCE)
_THREADS = 256
_BLOCKS = 4096        # enough to fill the GPU; each thread strides over the rest


def fold_key(key) -> int:
    """A 64-bit key from a sequence of non-negative ints (seed, step, layer), folded the way
    NumPy's SeedSequence folds its entropy."""
    return int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0])


class CounterUniform:
    """The generator of one key: `random(shape, dtype=float32, out=None)` as CuPy's
    Generator.random for float32, and `skip(count)` (the interface layers/draws.py uses):
    successive calls continue the sequence. Allocates nothing but the output when none is
    given.

    key: the 64-bit key, or a `KeySlot`, whose key the kernel reads from device memory when it
    runs (so that a step captured once as a CUDA graph draws each replay's own numbers)."""

    def __init__(self, key):
        self.key = key if isinstance(key, KeySlot) else int(key) & (2**64 - 1)
        self.first = 0    # the index of the next draw (skip moves it on)

    def skip(self, count: int) -> None:
        """Start the next draw `count` draws later, as if they had been made
        (layers/draws.skip_draws): a counter needs no work to skip."""
        self.first += int(count)

    def random(self, shape, dtype=np.float32, out=None):
        if np.dtype(dtype) != np.float32:
            raise TypeError(f"CounterUniform draws float32, not {np.dtype(dtype)}")
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if out is None:
            out = cp.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"CounterUniform.random: out must be contiguous float32 of shape "
                             f"{shape}, got {out.dtype} {out.shape}")
        n = out.size
        if n:
            blocks = min(_BLOCKS, -(-n // _THREADS))
            if isinstance(self.key, KeySlot):
                kernel, key = _module.get_function("uniform_float_at"), self.key.array
            else:
                kernel, key = _module.get_function("uniform_float"), np.uint64(self.key)
            kernel((blocks,), (_THREADS,), (out, key, np.uint64(self.first), np.uint64(n)))
        self.first += n
        return out


class KeySlot:
    """One key in device memory: `array` is a (1,) uint64 view into a StepKeys table."""

    def __init__(self, array):
        self.array = array


class StepKeys:
    """The keys of one step's draws in device memory, one slot per layer that draws.

    A step replayed as a CUDA graph (minidnn/step_graph.py) launches the same kernels with the
    same arguments every time, so its draws cannot take their key as an argument: they read it
    from a slot here (`slot(layer_index)`), and before each replay `fill(seed, step)` writes
    that step's keys, fold_key((seed, step, layer)), as a plain step would pass them. So a
    replayed step draws the same numbers as a plain one.
    """

    ROWS = 8   # host rows in turn: a row is written again only after its copy has run

    def __init__(self, layer_indices):
        self._index = {int(i): n for n, i in enumerate(sorted(set(layer_indices)))}
        n = max(len(self._index), 1)
        self._pinned = cp.cuda.alloc_pinned_memory(8 * n * self.ROWS)
        self._rows = np.frombuffer(self._pinned, np.uint64, n * self.ROWS).reshape(self.ROWS, n)
        self._copied = [None] * self.ROWS     # the event after each row's last copy
        self._turn = 0
        self._keys = cp.zeros(n, dtype=np.uint64)

    def slot(self, layer_index: int) -> KeySlot:
        n = self._index[int(layer_index)]
        return KeySlot(self._keys[n:n + 1])

    def fill(self, seed: int, step: int) -> None:
        """Write the keys of `step` on the current stream: an asynchronous copy from pinned
        memory, ordered after the replay before it, which reads the slots."""
        row, self._turn = self._turn, (self._turn + 1) % self.ROWS
        if self._copied[row] is not None:
            self._copied[row].synchronize()   # the host must not overwrite a copy in flight
        for index, n in self._index.items():
            self._rows[row, n] = fold_key([seed, step, index])
        stream = cp.cuda.get_current_stream()
        self._keys.set(self._rows[row], stream=stream)
        self._copied[row] = stream.record()


def counter_generator(key) -> CounterUniform:
    """The generator for a key sequence (seed, step, layer index)."""
    return CounterUniform(fold_key(key))


def draws(key: int, n: int) -> np.ndarray:
    """The first n numbers of CounterUniform(key), computed in NumPy (the reference)."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(int(key) & (2**64 - 1)) + i * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
