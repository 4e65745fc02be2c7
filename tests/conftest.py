"""Shared fixtures. GPU tests are marked `gpu` and skipped where CuPy sees no CUDA device.

MINIDNN_REQUIRE_GPU=1 (every GPU script in scripts/ sets it) turns each of those skips into a
failure: the run stops at collection when CuPy sees no GPU or fails to import, and a skip
inside a GPU test module (pytest.importorskip("cupy"), a test marked gpu that skips) fails
with the skip's reason. A GPU check can then never pass without running its tests.
"""
import os

import pytest

from minidnn.backend import gpu_available, gpu_unavailable_reason

REQUIRE_GPU = os.environ.get("MINIDNN_REQUIRE_GPU", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    if REQUIRE_GPU:
        raise pytest.UsageError(f"MINIDNN_REQUIRE_GPU is set, but CuPy sees no CUDA device "
                                f"({gpu_unavailable_reason()})")
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _gpu_module(path) -> bool:
    return str(path).endswith("_gpu.py")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A GPU test module skipped as a whole (CuPy does not import) fails when required."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and _gpu_module(getattr(collector, "path", "")):
        report.outcome = "failed"
        report.longrepr = f"MINIDNN_REQUIRE_GPU is set, but {collector.nodeid} was skipped: " \
                          f"{report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A GPU test that skips fails when required (its reason says why it skipped)."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and not hasattr(report, "wasxfail") and \
            ("gpu" in item.keywords or _gpu_module(item.path)):
        report.outcome = "failed"
        report.longrepr = f"MINIDNN_REQUIRE_GPU is set, but the test skipped: {report.longrepr}"


@pytest.fixture
def default_gpu_kernels_after():
    """After the test, the GPU kernels' math mode is the default again: configure() sets the
    kernel module, which outlives the executors of one test."""
    yield
    from minidnn import kernels
    from minidnn.backend import Device
    kernels.for_device(Device("gpu")).configure()


def pytest_runtest_teardown(item, nextitem):
    """After a GPU test, forget the failure pytest keeps for post-mortem debugging
    (sys.last_traceback): its frames hold the failed step's device arrays, and through them
    its whole arena, so every GPU test after a failure would find the device full."""
    if "gpu" in item.keywords:
        import sys
        sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None
