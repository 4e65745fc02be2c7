"""pyproject.toml is the one packaging file: it lists every package (the top-level models/
folder as minidnn.models) and reads the version from minidnn/version.py."""
import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")   # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setuptools_table():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_installed():
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "minidnn").rglob("__init__.py")}
    table = _setuptools_table()
    assert set(table["packages"]) == found | {"minidnn.models"}
    assert table["package-dir"] == {"minidnn.models": "models"}
    assert (ROOT / "models" / "__init__.py").is_file()


def test_the_version_is_written_once():
    import minidnn
    from minidnn.version import __version__
    assert _setuptools_table()["dynamic"]["version"] == {"attr": "minidnn.version.__version__"}
    assert minidnn.__version__ == __version__
    assert not (ROOT / "setup.py").exists()
