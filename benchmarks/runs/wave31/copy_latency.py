"""Each pinned copy's time on its stream by size, both directions: replayed from a CUDA graph
(profile.measure_copy_latency at infinite bandwidth: the whole copy's time) and issued one by
one from the host on the copy streams (events around 256 back-to-back copies), beside the
profile's latency (the time of a 4 KB copy less its bytes)."""
import time

import cupy
import numpy as np
from cupy.cuda import runtime

from minidnn.backend import select_device
from minidnn.planner.profile import measure_bandwidth, measure_copy_latency

device = select_device("gpu")
d2h_bw, h2d_bw, both = measure_bandwidth(device)
lat = measure_copy_latency(device, d2h_bw, h2d_bw)
print(f"bandwidth d2h {d2h_bw / 1e9:.1f} GB/s, h2d {h2d_bw / 1e9:.1f}, both {both / 1e9:.1f}")
print(f"profile latency: d2h {lat[0] * 1e6:.2f} us, h2d {lat[1] * 1e6:.2f} us")
print("| bytes | d2h replayed us | h2d replayed us | d2h issued us | h2d issued us "
      "| model d2h us | model h2d us |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for nbytes in (1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20):
    replayed = measure_copy_latency(device, float("inf"), float("inf"), nbytes=nbytes,
                                    repeats=128)
    on_device = cupy.empty(nbytes, dtype=np.uint8)
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(pinned, np.uint8, nbytes).ctypes.data
    issued = []
    for stream, dst, src, kind in ((device.offload, host, on_device.data.ptr, 2),
                                   (device.prefetch, on_device.data.ptr, host, 1)):
        device.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(256):
            runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
        end.record(stream)
        end.synchronize()
        issued.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / 256)
    model = (lat[0] + nbytes / d2h_bw, lat[1] + nbytes / h2d_bw)
    print(f"| {nbytes} | {replayed[0] * 1e6:.2f} | {replayed[1] * 1e6:.2f} | {issued[0]:.2f} "
          f"| {issued[1]:.2f} | {model[0] * 1e6:.2f} | {model[1] * 1e6:.2f} |")
