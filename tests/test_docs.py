"""The docs quote what the code computes now, and say what they mean.

scripts/make_docs.py computes every number README.md and docs/*.md quote that a CPU can make,
and writes each into the page between two markers that name it. Here it computes them again:
a page that quotes a number the code no longer computes fails, naming the command that makes
the pages again. Also: the markers are well formed, every figure says where it came from, the
glossary keeps the memory manager's words as its docstring defines them, every command that
needs a GPU says so, and the tutorial's first command runs after the README's install.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = json.loads((ROOT / "docs" / "numbers.json").read_text())


sys.path.insert(0, str(ROOT / "scripts"))    # the scripts, importable as modules
import make_docs  # noqa: E402


PAGES = {str(p.relative_to(ROOT)): p.read_text() for p in make_docs.PAGES}
STORED = {k: (v["text"], v["what"]) for k, v in NUMBERS["numbers"].items()}


@pytest.fixture(scope="module")
def numbers_now():
    """Every number, computed at this commit (about 20 s of CPU)."""
    return make_docs.all_numbers()


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_quotes_what_the_code_computes_now(page, numbers_now):
    stale = make_docs.stale(PAGES[page], numbers_now)
    assert not stale, (f"{page} quotes numbers the code no longer computes; run "
                       f"`{make_docs.COMMAND}` to make the pages again:\n" + "\n".join(stale))


@pytest.mark.slow
def test_numbers_json_and_the_printout_are_what_make_docs_writes_now(numbers_now):
    drifted = sorted(k for k in set(numbers_now) | set(STORED)
                     if numbers_now.get(k, ("",))[0] != STORED.get(k, ("",))[0])
    assert not drifted, f"run `{make_docs.COMMAND}`: docs/numbers.json differs at {drifted}"
    printed = (ROOT / "docs" / "plan_vgg16_b256_12GiB.txt").read_text()
    assert printed == numbers_now["plan_printout"][0], f"run `{make_docs.COMMAND}`"


def test_every_number_is_quoted_by_a_page():
    quoted = {key for text in PAGES.values() for key, _ in make_docs.quoted(text)}
    unused = set(STORED) - quoted - {"plan_printout"}    # the printout is a file of its own
    assert not unused, f"numbers.json holds numbers no page quotes: {sorted(unused)}"
    assert len(quoted) > 80


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_markers_are_well_formed_and_name_known_numbers(page):
    assert make_docs.unclosed(PAGES[page]) == []
    unknown = [key for key, _ in make_docs.quoted(PAGES[page]) if key not in STORED]
    assert not unknown, f"{page}: markers of numbers make_docs.py does not compute: {unknown}"


def test_a_number_that_moves_is_caught_and_made_again():
    """The check itself: change one quoted number, and one marker's end, in a copy of a page."""
    page = PAGES["docs/memory-virtualization.md"]
    key, text = make_docs.quoted(page)[0]
    moved = dict(STORED, **{key: ("0.00 GiB", STORED[key][1])})
    assert make_docs.stale(page, STORED) == []
    [problem] = make_docs.stale(page, moved)
    assert key in problem and repr(text) in problem
    assert make_docs.stale(make_docs.render(page, moved), moved) == []
    assert make_docs.render(page, STORED) == page
    broken = page.replace("<!--/n-->", "", 1)
    assert make_docs.unclosed(broken)


def test_every_figure_says_where_it_came_from():
    figures = 0
    for name, text in PAGES.items():
        lines = text.splitlines()
        for k, line in enumerate(lines):
            if not line.startswith("!["):
                continue
            figures += 1
            path = re.search(r"\((figures/[^)]+)\)", line).group(1)
            assert (ROOT / "docs" / path).is_file(), path
            caption = " ".join(lines[k + 1:k + 6])
            made = re.search(r"make_docs.py` at commit ([0-9a-f]+\+?)", caption)
            if made:   # made by make_docs.py: at the commit it says it drew them
                assert made.group(1) == NUMBERS["figures_commit"], \
                    f"{name}: {path}: run `{make_docs.COMMAND}`"
            else:
                assert "measured" in caption.lower() and \
                    re.search(r"commit [0-9a-f]{7}", caption), \
                    f"{name}: no command and commit under {path}"
    assert figures >= 7


# ---- the words -----------------------------------------------------------------------------------
def vocabulary() -> dict:
    """{word: definition} of the memory manager's front door (minidnn/memory/__init__.py)."""
    import minidnn.memory
    doc = minidnn.memory.__doc__
    body = doc.split("Vocabulary", 1)[1].split("\n\n", 2)[1]
    entries = re.findall(r"^\* (\w+)\s+(.*?)(?=^\* |\Z)", body, re.S | re.M)
    return {word: " ".join(text.split()) for word, text in entries}


def glossary() -> dict:
    """{word: definition} of docs/glossary.md (each '* **word**: ...' entry)."""
    text = PAGES["docs/glossary.md"]
    entries = re.findall(r"^\* \*\*(.+?)\*\*(.*?)(?=^\S|\Z)", text, re.S | re.M)
    return [(word, " ".join(rest.lstrip(":").split())) for word, rest in entries]


def test_the_glossary_repeats_the_memory_managers_words_word_for_word():
    words = vocabulary()
    assert len(words) >= 9
    defined = dict(glossary())
    for word, definition in words.items():
        assert defined.get(word) == definition, f"docs/glossary.md's {word!r} is not the " \
                                                f"docstring's: {definition!r}"


def test_the_glossary_defines_each_word_once():
    words = [word for word, _ in glossary()]
    assert len(words) == len(set(words))
    named = " ".join(words)
    for word in ("needs", "peak", "least budget", "bound", "step time", "offload", "prefetch",
                 "recompute", "micro-batch", "layer chunk", "prefetch lookahead", "evict",
                 "wait", "compute alone", "feature-map peak", "liveness peak"):
        assert f"{word}" in named, f"docs/glossary.md does not define {word!r}"


def test_the_bound_is_defined_as_the_code_computes_it():
    """The glossary's bound uses both directions at once; on the H200 model that is what
    `minidnn plan` prints for vDNN_all, and the tutorial quotes it, not one direction's."""
    bound = dict(glossary())["bound"]
    assert "both directions at once" in bound and "100 GB/s" in bound
    assert STORED["all_h200_bound"][0] != STORED["all_copy_floor"][0]


# ---- the commands --------------------------------------------------------------------------------
RUNS = re.compile(r"(minidnn train|scripts/bench_\w+\.py|scripts/layer_times\.py)")


def code_blocks(text: str):
    """(the heading above, the block's text) of each fenced block."""
    heading = ""
    for part in re.split(r"(^```[^\n]*\n.*?^```)", text, flags=re.S | re.M):
        if part.startswith("```"):
            yield heading, part
        else:
            found = re.findall(r"^##? (.*)$", part, re.M)
            heading = found[-1] if found else heading


def test_every_command_that_needs_a_gpu_says_so():
    unmarked = []
    for name, text in PAGES.items():
        for heading, block in code_blocks(text):
            on_gpu = "GPU" in heading or re.search(r"^# GPU", block, re.M)
            for line in block.replace("\\\n", " ").splitlines():
                command = line.split("#")[0]
                if not RUNS.search(command) or on_gpu or "# GPU" in line:
                    continue
                if "--device cpu" in command or "--dry" in command or \
                        command.strip() == "python3 -m pip install . && python3 -m minidnn train":
                    continue    # runs on a CPU (the Quickstart's default job anywhere)
                unmarked.append(f"{name}: {line.strip()}")
    assert not unmarked, "commands that need a GPU without '# GPU':\n" + "\n".join(unmarked)


def first_command(page: str) -> list[str]:
    """The first command of a page's first code block, its continuation lines joined."""
    _, block = next(code_blocks(PAGES[page]))
    lines = [ln for ln in block.splitlines()[1:-1] if not ln.startswith("#")]
    command = " ".join(ln.rstrip("\\").strip() for ln in lines[:next(
        k for k, ln in enumerate(lines) if not ln.endswith("\\")) + 1])
    return command.split()


@pytest.mark.slow
def test_the_tutorials_first_command_runs_without_matplotlib():
    """`pip install .` brings no matplotlib: the first command of the tutorial must not need it
    (run here with matplotlib made unimportable)."""
    argv = first_command("docs/memory-virtualization.md")
    assert argv[:3] == ["python3", "-m", "minidnn"] and "--plot" not in argv
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from minidnn.cli import main\n"
            f"sys.exit(main({argv[3:]!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "peak device memory" in done.stdout
