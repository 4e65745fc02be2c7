#!/usr/bin/env python3
"""A Python environment that holds minidnn, its 'gpu' extra and nothing else (no PyTorch).

    python3 scripts/gpu_extra_env.py /tmp/gpu_env --wheels .whl     # prints the env's python

For a machine that reaches no package index (the GPU machines): the distributions that
`pip install ".[gpu]"` would download are taken from those this Python has installed.
Starting from pyproject.toml's dependencies and its 'gpu' extra, each requirement's installed
distribution is linked, file by file from its RECORD, into a new virtual environment made
without system site-packages, and so are its own requirements, recursively. A requirement
that is not installed must come as a wheel in --wheels (the cuDNN frontend). Then pip installs the
extra's requirements into the environment with `--no-index`: its resolver fails if the
closure misses anything, so a successful install shows that the extra brings everything
minidnn needs, while whatever PyTorch installed beside it stays outside. minidnn's own files
are copied in as setup.py lays them out. Exits 1 with the reason on any failure.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

try:
    from packaging.requirements import Requirement
except ImportError:   # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement


def fail(message: str) -> None:
    print(f"gpu_extra_env: FAILED: {message}")
    sys.exit(1)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_names(folder: Path) -> set[str]:
    """Canonical project names of the wheels in `folder` (name-version-...whl)."""
    return {canonical(w.name.split("-")[0]) for w in folder.glob("*.whl")}


def closure(requirements: list[str], wheels: set[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions that `requirements` need, recursively (markers evaluated
    for this Python, no extras of the dependencies). Requirements met by a wheel in `wheels`
    are left to pip; any other missing one fails."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonical(req.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            if name in wheels:
                continue
            fail(f"{req} is neither installed here nor a wheel in --wheels")
        if dist.version not in req.specifier:
            fail(f"installed {req.name} {dist.version} does not satisfy {req}")
        found[name] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return found


def link_distribution(dist: metadata.Distribution, site: Path) -> int:
    """Symlink every file of `dist` that lies in its site-packages into `site`; returns the
    number linked. Files outside site-packages (console scripts in bin/) are left out."""
    count = 0
    for entry in dist.files or []:
        rel = Path(str(entry))
        if rel.parts and rel.parts[0] == "..":
            continue
        source = Path(dist.locate_file(entry)).resolve()
        if not source.exists():
            continue
        target = site / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(source)
            count += 1
    return count


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("env", help="folder of the new environment (must not exist)")
    p.add_argument("--wheels", default=".whl", help="wheels of requirements not installed here")
    args = p.parse_args(argv)
    env, wheels_dir = Path(args.env), Path(args.wheels).resolve()
    if env.exists():
        fail(f"{env} exists already")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["gpu"]
    dists = closure(requirements + ["pip"], wheel_names(wheels_dir))

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    for name in sorted(dists):
        n = link_distribution(dists[name], site)
        print(f"linked {name} {dists[name].version} ({n} files)")
    if any(canonical(n) == "torch" for n in dists):
        fail("the gpu extra's closure includes torch")

    # pip's resolver checks the closure: every requirement installed, or a wheel in --wheels.
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--find-links",
                           str(wheels_dir), *requirements], capture_output=True, text=True,
                          cwd=str(env))
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")
    if done.returncode:
        fail(f"pip install --no-index of the gpu extra: {done.stderr.strip()[-600:]}")
    # minidnn itself, laid out as setup.py installs it (models/ becomes minidnn.models).
    shutil.copytree(ROOT / "minidnn", site / "minidnn",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "models", site / "minidnn" / "models",
                    ignore=shutil.ignore_patterns("__pycache__"))
    print(f"python: {python}")


if __name__ == "__main__":
    main()
