"""The profiler's clock on the GPU (planner/profile.py): a stream held busy while the host
issues the timed calls (kernels/cuda_hold.py), so that a call the host issues more slowly than
the device runs it is timed at the device's rate. Skipped without a CUDA GPU."""
import time

import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda_hold = pytest.importorskip("minidnn.kernels.cuda_hold")

from minidnn.backend import select_device  # noqa: E402
from minidnn.planner.profile import _Clock  # noqa: E402


def test_a_hold_keeps_the_stream_busy_for_its_time_and_returns_at_once():
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cuda_hold.hold(0)              # the first call compiles the kernel
    cp.cuda.Device().synchronize()
    with stream:
        start.record()
        t0 = time.perf_counter()
        cuda_hold.hold(5e-3)
        issued = time.perf_counter() - t0
        end.record()
    end.synchronize()
    held = cp.cuda.get_elapsed_time(start, end) / 1e3
    assert 5e-3 <= held < 7e-3
    assert issued < 2e-3


def test_a_call_the_host_issues_slowly_is_timed_at_the_devices_rate():
    device = select_device("gpu")
    x = cp.ones(1024, cp.float32)

    def slow_to_issue():     # a tiny kernel behind 300 us of host work
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 300e-6:
            pass
        cp.multiply(x, 2, out=x)

    with device.compute:
        device_s, host_s = _Clock(device)(slow_to_issue, repeats=20)
    assert host_s >= 300e-6
    assert device_s < 60e-6      # back to back on the device; issued at the host's rate: 300 us


def test_a_call_the_device_runs_slowly_is_timed_at_its_own_length():
    device = select_device("gpu")
    with device.compute:
        device_s, host_s = _Clock(device)(lambda: cuda_hold.hold(2e-3), repeats=5)
    assert 2e-3 <= device_s < 2.3e-3
    assert host_s < 1e-3
