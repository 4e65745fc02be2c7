"""Data-parallel speed on two GPUs: minidnn `--ranks 2` against one GPU and against PyTorch's
DistributedDataParallel, in one call.

    python3 scripts/bench_ddp.py runs/ddp.json                 # VGG-16, 256 images per GPU
    python3 scripts/bench_ddp.py runs/ddp.json --steps 20 --model vgg16 --per-gpu 128

Runs, each in its own process (so no two share a GPU's allocator):
  1. minidnn, one GPU, batch B (synthetic data, TF32)
  2. minidnn --ranks 2, global batch 2B
  3. and 4. the same two with --policy dyn --memory-budget 12GiB (per GPU)
  5. PyTorch DistributedDataParallel, 2 processes (torch.multiprocessing spawn, NCCL), B per
     GPU, channels_last, TF32, cuDNN benchmark mode, the same network (minidnn's definition
     translated by bench_vs_pytorch.torch_model, same initial weights).
minidnn's images/s are its report's steady state (`images_per_s`, first steps left out);
PyTorch's are timed the same way over the steps after its warm-up. Prints a markdown table
with the ratios the targets name (2 GPUs / 1 GPU, minidnn / DDP) and writes all results as
JSON to the given path. PyTorch is imported only by run 5's processes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))


# ---- minidnn runs -------------------------------------------------------------------------------
def minidnn_run(label, args, ranks, budget, folder) -> dict:
    report = os.path.join(folder, f"{label}.json")
    batch = args.per_gpu * ranks
    cmd = [sys.executable, "-m", "minidnn", "train", "--model", args.model, "--data",
           "synthetic", "--batch", str(batch), "--steps", str(args.steps), "--device", "gpu",
           "--eval-every", "0", "--no-progress", "--log-every", str(args.steps),
           "--report", report]
    if ranks > 1:
        cmd += ["--ranks", str(ranks)]
    if budget:
        cmd += ["--policy", "dyn", "--memory-budget", budget]
        if ranks > 1 and args.host_link_gbps:
            cmd += ["--host-link-gbps", str(args.host_link_gbps)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
    result = {"label": label, "framework": "minidnn", "gpus": ranks, "batch": batch,
              "policy": "dyn" if budget else "none", "memory_budget": budget,
              "command": " ".join(cmd[1:]), "wall_s": round(time.time() - t0, 1)}
    if proc.returncode != 0 or not os.path.exists(report):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        result["error"] = " | ".join(tail)
        return result
    with open(report) as f:
        rep = json.load(f)
    result.update(images_per_s=rep["images_per_s"],
                  peak_device_bytes=rep["peak_device_bytes"],
                  ranks_agree=rep.get("ranks_agree"), collective=rep.get("collective"),
                  loss_first=rep["loss"][0], loss_last=rep["loss"][-1])
    return result


# ---- PyTorch DistributedDataParallel ----------------------------------------------------------
def _ddp_worker(rank, world, port, args, out):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from bench_vs_pytorch import torch_training
    from minidnn import models
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    image = models.native_image_size(args.model)
    model, _, x, labels = torch_training(args.model, args.per_gpu, image, "tf32", 0.01, 0.9)
    model = model.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"images_per_s": args.per_gpu * world / dt, "ms_per_iter": dt * 1e3,
                       "peak_device_bytes": int(torch.cuda.max_memory_allocated()),
                       "loss_last": float(losses[-1])}, f)
    dist.destroy_process_group()


def ddp_child(args) -> None:
    import torch.multiprocessing as mp
    from minidnn.distributed.rendezvous import free_port
    mp.spawn(_ddp_worker, args=(2, free_port(), args, args.ddp_child), nprocs=2, join=True)


def ddp_run(args, folder) -> dict:
    out = os.path.join(folder, "ddp.json")
    cmd = [sys.executable, os.path.abspath(__file__), "unused", "--ddp-child", out,
           "--model", args.model, "--per-gpu", str(args.per_gpu), "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
    result = {"label": "pytorch-ddp", "framework": "pytorch DDP (channels_last, TF32)",
              "gpus": 2, "batch": 2 * args.per_gpu, "policy": "-", "memory_budget": None,
              "wall_s": round(time.time() - t0, 1)}
    if proc.returncode != 0 or not os.path.exists(out):
        result["error"] = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        return result
    with open(out) as f:
        result.update(json.load(f))
    return result


# ---- the table -----------------------------------------------------------------------------------
def ratio(a, b) -> str:
    if not a or not b:
        return "-"
    return f"{a['images_per_s'] / b['images_per_s']:.2f}x"


def table(results: dict) -> list[str]:
    lines = ["| run | GPUs | global batch | img/s | vs minidnn 1 GPU (same policy) | "
             "vs PyTorch DDP |", "| --- | --- | --- | --- | --- | --- |"]
    ok = {k: r for k, r in results.items() if "error" not in r}
    base = {"none": ok.get("minidnn-1gpu"), "dyn": ok.get("minidnn-1gpu-dyn")}
    for key, r in results.items():
        name = f"{r['framework']}" + (f" --policy dyn --memory-budget {r['memory_budget']}"
                                      if r.get("memory_budget") else "")
        if "error" in r:
            lines.append(f"| {name} | {r['gpus']} | {r['batch']} | failed: {r['error'][:80]} "
                         f"| | |")
            continue
        same = base.get(r["policy"]) if r["framework"] == "minidnn" else ok.get("minidnn-1gpu")
        lines.append(f"| {name} | {r['gpus']} | {r['batch']} | {r['images_per_s']:.0f} | "
                     f"{ratio(r, same) if key not in ('minidnn-1gpu', 'minidnn-1gpu-dyn') else '1.00x'}"
                     f" | {ratio(r, ok.get('pytorch-ddp')) if r['gpus'] == 2 else '-'} |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="where to write the results (JSON)")
    p.add_argument("--model", default="vgg16")
    p.add_argument("--per-gpu", type=int, default=256, help="images per GPU (default 256)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="PyTorch steps before timing")
    p.add_argument("--budget", default="12GiB", help="per-GPU budget of the dyn runs")
    p.add_argument("--host-link-gbps", type=float, default=None,
                   help="per-GPU host link of the two-rank dyn run's plan (bench_host_link.py)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--only", default=None,
                   help="comma-separated labels to run (minidnn-1gpu, minidnn-2gpu, "
                        "minidnn-1gpu-dyn, minidnn-2gpu-dyn, pytorch-ddp)")
    p.add_argument("--ddp-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ddp_child:
        ddp_child(args)
        return
    runs = [("minidnn-1gpu", 1, None), ("minidnn-2gpu", 2, None),
            ("minidnn-1gpu-dyn", 1, args.budget), ("minidnn-2gpu-dyn", 2, args.budget)]
    only = set(args.only.split(",")) if args.only else None
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as folder:
        for label, ranks, budget in runs:
            if only and label not in only:
                continue
            results[label] = minidnn_run(label, args, ranks, budget, folder)
            print(f"{label}: " + json.dumps(results[label]), flush=True)
        if not only or "pytorch-ddp" in only:
            results["pytorch-ddp"] = ddp_run(args, folder)
            print("pytorch-ddp: " + json.dumps(results["pytorch-ddp"]), flush=True)
    lines = table(results)
    print()
    print(f"{args.model}, {args.per_gpu} images per GPU, {args.steps} steps, synthetic data, "
          f"TF32")
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"model": args.model, "per_gpu": args.per_gpu, "steps": args.steps,
                   "results": results, "table": lines}, f, indent=1)


if __name__ == "__main__":
    main()
