"""The tutorial (docs/memory-virtualization.md) quotes what the code computes now.

scripts/make_docs.py writes every CPU-reproducible number of the tutorial into docs/numbers.json;
here the tutorial must quote each one, the fast ones (dry runs of the memory manager, the
step-time model, the shipped profile's tables) must still come out the same, every figure must
say where it came from, and the plan printout quoted must be the one make_docs.py wrote.
"""
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = (ROOT / "docs" / "memory-virtualization.md").read_text()
NUMBERS = json.loads((ROOT / "docs" / "numbers.json").read_text())


def make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "scripts" / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", sorted(NUMBERS["numbers"]))
def test_the_tutorial_quotes_every_number(key):
    assert NUMBERS["numbers"][key]["text"] in TUTORIAL, \
        f"{key} ({NUMBERS['numbers'][key]['what']}) is not quoted in the tutorial"


def test_the_fast_numbers_are_what_the_code_computes_now():
    now = make_docs().fast_numbers()
    stored = NUMBERS["numbers"]
    drifted = {k: (stored[k]["text"], text) for k, (text, _) in now.items()
               if k not in stored or stored[k]["text"] != text}
    assert not drifted, f"run {NUMBERS['command']}: (in numbers.json, now) {drifted}"


def test_every_figure_says_where_it_came_from():
    lines = TUTORIAL.splitlines()
    figures = [k for k, line in enumerate(lines) if line.startswith("![")]
    assert len(figures) >= 4
    for k in figures:
        path = re.search(r"\((figures/[^)]+)\)", lines[k]).group(1)
        assert (ROOT / "docs" / path).is_file(), path
        caption = " ".join(lines[k + 1:k + 6])
        made = re.search(r"make_docs.py` at commit ([0-9a-f]+\+?)", caption)
        if made:   # made by make_docs.py: at the commit of the numbers
            assert made.group(1) == NUMBERS["commit"], f"{path}: run {NUMBERS['command']}"
        else:
            assert "measured" in caption.lower() and re.search(r"commit [0-9a-f]{7}", caption), \
                f"no command and commit under {path}"


def test_the_plan_quoted_is_the_one_make_docs_wrote():
    printed = (ROOT / "docs" / "plan_vgg16_b256_12GiB.txt").read_text()
    block = TUTORIAL.split("$ minidnn plan --model vgg16 --batch 256 --memory-budget 12GiB", 1)
    assert len(block) == 2, "the worked plan is not quoted"
    quoted = [ln for ln in block[1].split("```", 1)[0].splitlines()[1:] if ln.strip()
              and ln.strip() != "..." and not ln.startswith("    --")]
    assert len(quoted) > 10
    for line in quoted:
        assert line in printed, f"not in the plan make_docs.py wrote: {line!r}"
