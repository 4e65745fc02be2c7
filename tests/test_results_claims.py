"""Claims in benchmarks/RESULTS.md and the README that a CPU can check: a row of the dry-run
table is what `scripts/bench_memory.py --dry` prints at this commit."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_memory():
    spec = importlib.util.spec_from_file_location(
        "bench_memory", os.path.join(ROOT, "scripts", "bench_memory.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_vgg16_b256_all_row_of_the_dry_table_is_what_the_command_prints(capsys):
    bench = bench_memory()
    bench.dry(bench.parse_configs("vgg16:224:256"), ["all"], lookahead=1, budget=None)
    printed = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| vgg16 | 256 |")]
    assert len(printed) == 1
    assert printed[0] == ("| vgg16 | 256 | 224 | 27.86 GiB | 9.47 GiB | all | 9.19 GiB | "
                          "1.35 GiB | -95.2% | 9.07 GiB | 10.22 GiB | - |")
    results = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    assert printed[0] in results.splitlines()


def test_the_readmes_gpu_ratios_come_from_one_call_with_its_commit():
    """The README's GPU table names its commit and the section of RESULTS.md its figures come
    from, every ratio is the quotient of its row's two figures, and the old ratio over
    save_on_cpu, which divided figures of two runs, is gone."""
    import re
    text = open(os.path.join(ROOT, "README.md")).read()
    readme = " ".join(text.split())
    assert "5.9x" not in readme
    at = readme.index("| b256, TF32 | minidnn | PyTorch's best of the same call | ratio |")
    intro = readme[readme.rindex("On H200s", 0, at):at]
    assert "at commit fdc097e" in intro and "each ratio from one call" in intro, intro
    results = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    assert '"The fourth wave on the H200"' in intro and "## The fourth wave on the H200" in results
    table = text[text.index("| b256, TF32 |"):].split("\n\n", 1)[0].splitlines()[2:]
    assert len(table) >= 4
    for row in table:
        ours, theirs, ratio = (c.strip() for c in row.strip("|").split("|")[1:])
        a, b = (float(re.findall(r"([0-9]+) img/s", c)[-1]) for c in (ours, theirs))
        assert abs(a / b - float(ratio.rstrip("x"))) < 0.006, row
        assert re.search(rf"\b{int(a)}\b", results) and re.search(rf"\b{int(b)}\b", results), row


def test_the_readme_sample_output_is_the_main_jobs_and_says_what_varies():
    """The sample's first line is what `minidnn train` prints first (parameters, data), and the
    text after it names the figures that depend on the machine."""
    from minidnn.train import TrainConfig, train
    readme = open(os.path.join(ROOT, "README.md")).read()
    quick = readme.split("## Quickstart", 1)[1].split("## ", 1)[0]
    sample = quick.split("```")[3].strip().splitlines()
    lines = []
    train(TrainConfig(steps=0, eval_every=0, progress=False, device="cpu"), log=lines.append)
    assert sample[0] == lines[0]
    assert sample[-1].startswith(tuple("0123456789")) and "images/s" in sample[-1]
    after = " ".join(quick.split("```")[4].split())
    assert "Which figures vary: images/s and wall time depend on the machine" in after
    assert "losses and accuracies" in after
