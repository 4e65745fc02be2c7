"""Each run's measured step (the median of its steady steps) beside the step model's
prediction for the same plan (`minidnn plan --report RUN.json`, made here from the cached
profile), one row per run report.

    python3 benchmarks/runs/wave34/step_vs_model.py RUN.json [RUN.json ...]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from model_vs_trace import plan_of_run, steady_median  # noqa: E402


def main(paths: list[str]) -> None:
    print("| run | precision | fused | passes | predicted ms | measured ms | predicted/measured |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for path in paths:
        report = json.loads(Path(path).read_text())
        predicted = plan_of_run(path, report)["timeline"]["step_time_s"]
        measured = steady_median(report)
        print(f"| {Path(path).stem} | {report['precision']} | {report['fuse']} | "
              f"{report['micro_batches']} | {predicted * 1e3:.1f} | {measured * 1e3:.1f} | "
              f"{predicted / measured:.3f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
