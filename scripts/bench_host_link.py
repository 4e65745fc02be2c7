"""Pinned host <-> device copy bandwidth: one GPU alone, then several GPUs copying at once.

Data-parallel ranks offload feature maps at the same moments of their steps, so they share
the host's memory bandwidth (and, on some hosts, a PCIe switch). This measures what each GPU
gets: device -> host, host -> device, and both directions at once, first for GPU 0 alone and
then with all the given GPUs copying together (one thread per GPU, started together).

    python3 scripts/bench_host_link.py                     # GPUs 0 and 1, 1 GiB copies
    python3 scripts/bench_host_link.py --gpus 0,1,2,3 --json runs/host_link.json

The last line gives the figure for the planner: the lower per-GPU bandwidth of the two
directions with all GPUs copying, to pass as `minidnn plan --host-link-gbps X` (and to
training's dyn policy) so that plans for data-parallel runs expect the copies they will get.
"""
from __future__ import annotations

import argparse
import json
import os
import threading

GB = 1e9


def _copier(gpu: int, nbytes: int, repeats: int, direction: str, barrier, out: dict):
    """One thread: `repeats` copies of `nbytes` on GPU `gpu` in `direction` ('d2h', 'h2d' or
    'both': one stream each way at once), timed by events; out[gpu] = GB/s per direction."""
    import cupy
    import numpy as np
    with cupy.cuda.Device(gpu):
        dev = {d: cupy.empty(nbytes, dtype=cupy.uint8) for d in ("d2h", "h2d")}
        host = {d: np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
                for d in ("d2h", "h2d")}
        streams = {d: cupy.cuda.Stream(non_blocking=True) for d in ("d2h", "h2d")}
        dirs = ("d2h", "h2d") if direction == "both" else (direction,)

        def copy(d):
            if d == "d2h":
                dev[d].get(stream=streams[d], out=host[d], blocking=False)
            else:
                dev[d].set(host[d], stream=streams[d])

        for d in dirs:   # warm-up: page tables, DMA engines
            copy(d)
            streams[d].synchronize()
        barrier.wait()
        events = {}
        for d in dirs:
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(streams[d])
            for _ in range(repeats):
                copy(d)
            end.record(streams[d])
            events[d] = (start, end)
        result = {}
        for d, (start, end) in events.items():
            end.synchronize()
            seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3
            result[d] = nbytes * repeats / seconds / GB
        out[gpu] = result


def measure(gpus: list[int], nbytes: int, repeats: int, direction: str) -> dict:
    """{gpu: {direction: GB/s}} with every GPU of `gpus` copying at the same time."""
    out: dict = {}
    barrier = threading.Barrier(len(gpus))
    threads = [threading.Thread(target=_copier, args=(g, nbytes, repeats, direction, barrier,
                                                      out)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != len(gpus):
        raise SystemExit(f"bench_host_link: a copy thread failed (results for {sorted(out)})")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="0,1", help="GPUs to copy with together (default 0,1)")
    p.add_argument("--size-mib", type=int, default=1024, help="bytes per copy, MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    import cupy
    gpus = [int(g) for g in args.gpus.split(",")]
    have = cupy.cuda.runtime.getDeviceCount()
    if max(gpus) >= have:
        raise SystemExit(f"bench_host_link: asked for GPUs {gpus}, this host has {have}")
    nbytes = args.size_mib * 2**20
    rows, figures = [], {}
    for label, group in (("alone", gpus[:1]), (f"{len(gpus)} at once", gpus)):
        for direction in ("d2h", "h2d", "both"):
            res = measure(group, nbytes, args.repeats, direction)
            figures[f"{label} {direction}"] = res
            for d in ("d2h", "h2d"):
                if d in res[group[0]]:
                    per_gpu = [res[g][d] for g in group]
                    rows.append((label, direction, d, min(per_gpu), sum(per_gpu)))
    print(f"pinned copies of {args.size_mib} MiB x {args.repeats}, GPUs {gpus}")
    print("| GPUs copying | mode | direction | GB/s per GPU (least) | GB/s all GPUs |")
    print("| --- | --- | --- | --- | --- |")
    for label, mode, d, least, total in rows:
        print(f"| {label} | {mode} | {d} | {least:.1f} | {total:.1f} |")
    together = f"{len(gpus)} at once"
    link = min(min(figures[f"{together} d2h"][g]["d2h"] for g in gpus),
               min(figures[f"{together} h2d"][g]["h2d"] for g in gpus))
    print(f"\nper-GPU host link with {len(gpus)} GPUs copying: {link:.1f} GB/s "
          f"(minidnn plan --host-link-gbps {link:.0f})")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"gpus": gpus, "bytes": nbytes, "repeats": args.repeats,
                       "gb_per_s": {k: {str(g): v for g, v in r.items()}
                                    for k, r in figures.items()},
                       "host_link_gbps": link}, f, indent=1)


if __name__ == "__main__":
    main()
