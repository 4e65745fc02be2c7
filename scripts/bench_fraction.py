#!/usr/bin/env python3
"""A network's speed in a fraction of its own unconstrained peak memory, on one GPU.

For each network: `minidnn train` without a budget (policy none), which reports the peak of
a steady step (steady_peak_device_bytes); then `--policy dyn` with a memory budget of
--fraction times that peak. Each run in its own process, synthetic data, TF32. Prints a
markdown table (speed under the budget as a share of the unconstrained speed, with what dyn
decided) and writes everything as JSON.

    python3 scripts/bench_fraction.py runs/half.json --models resnet50,googlenet
    python3 scripts/bench_fraction.py runs/half.json --models vgg16 --batch 128 --fraction 0.25
    python3 scripts/bench_fraction.py /tmp/f.json --models tiny_cnn --batch 8 --device cpu

Without --split-batch-statistics, dyn keeps a network with BatchNorm in one pass per step
(offload and recomputation only), so that its statistics stay the whole batch's.
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

from minidnn.errors import fmt_bytes  # noqa: E402


def train(model: str, batch: int, steps: int, folder: str, timeout: int,
          budget: int | None = None, device: str = "gpu", split_statistics: bool = False,
          relu_bits: bool = False) -> dict:
    """One `minidnn train` run; its report, with the command and wall time (or an error)."""
    report = os.path.join(folder, f"{model}-{'dyn' if budget else 'none'}.json")
    cmd = [sys.executable, "-m", "minidnn", "train", "--model", model, "--data", "synthetic",
           "--batch", str(batch), "--steps", str(steps), "--device", device,
           "--eval-every", "0", "--no-progress", "--log-every", str(steps), "--report", report]
    if budget:
        cmd += ["--policy", "dyn", "--memory-budget", f"{budget // 2**20}MiB"]
        if split_statistics:
            cmd.append("--split-batch-statistics")
        if relu_bits:
            cmd.append("--relu-bits")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"command": " ".join(cmd[1:]), "error": f"timed out after {timeout} s"}
    out = {"command": " ".join(cmd[1:]), "wall_s": round(time.time() - t0, 1)}
    if proc.returncode or not os.path.exists(report):
        out["error"] = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        return out
    with open(report) as f:
        rep = json.load(f)
    memory = rep.get("memory", {})
    out.update(images_per_s=rep["images_per_s"],
               steady_peak_device_bytes=rep["steady_peak_device_bytes"],
               memory_budget_bytes=rep.get("memory_budget_bytes"),
               micro_batches=rep.get("micro_batches"),
               offloaded_bytes=rep.get("offloaded_bytes"),
               on_demand_fetches=memory.get("on_demand_fetches"),
               recompute_storages=memory.get("recompute_storages"),
               recompute_bytes=memory.get("recompute_bytes"),
               unplanned_blocks=memory.get("unplanned_blocks"),
               step_graphs=rep.get("step_graphs"))
    return out


def _last(error: str) -> str:
    """The last line of a failed run's output (minidnn's one-line error)."""
    return error.split(" | ")[-1][:160]


def row(model: str, batch: int, free: dict, capped: dict) -> str:
    if "error" in free:
        return f"| {model} | {batch} | failed: {_last(free['error'])} | | | | |"
    cells = [model, str(batch), f"{free['images_per_s']:.0f}",
             fmt_bytes(free["steady_peak_device_bytes"])]
    if "error" in capped:
        return "| " + " | ".join(cells + [f"failed: {_last(capped['error'])}", "", ""]) + " |"
    share = capped["images_per_s"] / free["images_per_s"]
    graphs = capped.get("step_graphs") or {}
    decided = (f"{capped['micro_batches']} micro-batch(es), "
               + ("ReLU bit masks, " if "--relu-bits" in capped["command"] else "") +
               f"{fmt_bytes(capped['offloaded_bytes'] or 0)} offloaded a step, "
               f"{capped.get('recompute_storages') or 0} maps "
               f"({fmt_bytes(capped.get('recompute_bytes') or 0)}) recomputed, "
               f"{graphs.get('replayed_steps', 0)} steps replayed")
    return "| " + " | ".join(cells + [
        f"{capped['images_per_s']:.0f} in {fmt_bytes(capped['memory_budget_bytes'])} "
        f"(peak {fmt_bytes(capped['steady_peak_device_bytes'])})", f"{share:.1%}",
        decided]) + " |"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="where to write the results")
    p.add_argument("--models", default="resnet50,googlenet")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--split-batch-statistics", action="store_true",
                   help="let dyn split the batch of a network with BatchNorm (its statistics "
                        "are then those of each micro-batch)")
    p.add_argument("--relu-bits", action="store_true",
                   help="dyn's runs keep ReLU bit masks where they free a map (train "
                        "--relu-bits; the same bits, less memory)")
    args = p.parse_args(argv)
    if not 0 < args.fraction < 1:
        p.error(f"--fraction must be between 0 and 1, got {args.fraction}")
    results, lines = {}, [
        f"| network | batch | unconstrained img/s | its peak | dyn in {args.fraction:g} of it, "
        f"img/s | share of the unconstrained speed | dyn's decision |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            free = train(model, args.batch, args.steps, folder, args.timeout,
                         device=args.device)
            capped = {"error": "no unconstrained peak"}
            if "error" not in free:
                budget = int(args.fraction * free["steady_peak_device_bytes"])
                capped = train(model, args.batch, args.steps, folder, args.timeout, budget,
                               args.device, args.split_batch_statistics, args.relu_bits)
            results[model] = {"none": free, "dyn": capped}
            lines.append(row(model, args.batch, free, capped))
            print(f"{model}: {json.dumps(results[model])}", flush=True)
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"batch": args.batch, "fraction": args.fraction, "steps": args.steps,
                   "results": results, "table": lines}, f, indent=1)


if __name__ == "__main__":
    main()
