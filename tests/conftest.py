"""Shared fixtures. GPU tests are marked `gpu` and skipped where CuPy sees no CUDA device."""
import pytest

from minidnn.backend import gpu_available


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
