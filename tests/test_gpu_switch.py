"""MINIDNN_REQUIRE_GPU=1: a GPU check that cannot run its GPU tests fails instead of skipping."""
import os
import subprocess
import sys

import pytest

from minidnn.backend import gpu_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


def pytest_run(require: str | None, *args):
    env = dict(os.environ)
    env.pop("MINIDNN_REQUIRE_GPU", None)
    if require is not None:
        env["MINIDNN_REQUIRE_GPU"] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_switch_turns_skips_into_a_failure():
    quiet = pytest_run(None, "tests/test_memory_gpu.py", "tests/test_layers_gpu.py")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "skipped" in quiet.stdout
    for value in ("1",):
        strict = pytest_run(value, "tests/test_memory_gpu.py", "tests/test_layers_gpu.py")
        out = strict.stdout + strict.stderr
        assert strict.returncode != 0, out
        assert "MINIDNN_REQUIRE_GPU is set" in out
    off = pytest_run("0", "tests/test_memory_gpu.py", "tests/test_layers_gpu.py")
    assert off.returncode == 0


def test_every_gpu_script_sets_the_switch_and_returns_pytests_status():
    scripts = [f for f in sorted(os.listdir(SCRIPTS)) if f.startswith("gpu_") and
               f.endswith(".sh")]
    assert "gpu_memory_check.sh" in scripts and "gpu_check.sh" in scripts
    for name in scripts:
        text = open(os.path.join(SCRIPTS, name)).read()
        assert "export MINIDNN_REQUIRE_GPU=1" in text, name
        if "pytest" in text:
            assert 'exit "$status"' in text and "status=${PIPESTATUS[0]}" in text, name


def test_the_install_check_hides_torch_and_runs_without_a_gpu_to_a_clear_failure(tmp_path):
    """On this CPU machine the script stops at 'no GPU' with status 1, after hiding torch."""
    script = os.path.join(SCRIPTS, "gpu_install_check.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    if gpu_available():
        pytest.skip("this machine has a GPU: the script runs for real there")
    env = dict(os.environ, WHEELS_DIR=str(tmp_path))  # a checkout's own wheels stay out of it
    done = subprocess.run(["bash", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "torch: does not import" in done.stdout
    assert "gpu_install_check: FAILED: CuPy sees no CUDA device" in done.stdout
