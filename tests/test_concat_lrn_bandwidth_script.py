"""scripts/concat_lrn_bandwidth.py times GPU kernels; without a GPU it says so in one line."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_without_a_gpu_the_script_says_so_in_one_line():
    try:
        import cupy  # noqa: F401
        pytest.skip("a GPU may be here: the script would measure")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, "scripts/concat_lrn_bandwidth.py", "--batch", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0], err
