"""The house's floors: a module imports only modules on its own floor or below (DESIGN.md's
layout, top to bottom). A new module needs a floor here; an import that runs back up the
house fails this test with the two modules named."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Bottom to top. A name covers the module and, for a package, every module inside it.
FLOORS = (
    ("errors", "version", "jsonsafe", "import_interrupt"),
    ("backend", "argtypes", "checkpoint", "idx", "augment", "lr_schedule", "data"),
    ("kernels",),
    ("layers", "network", "optim", "builder", "gradcheck", "models"),
    ("memory",),
    ("step_graph", "distributed", "fusion", "gathered", "chunks", "trace"),
    ("spec", "assembly", "executor"),
    ("planner",),
    ("decide",),
    ("planner.command", "commands", "report", "recipe", "curves", "applies", "outputs",
     "stopping", "cpu_check"),
    ("train", "cli", "__main__", ""),
)


def floor_of(module: str) -> int:
    """The floor of a module named relative to the package ('planner.search', '' for the
    package itself): the longest name in FLOORS that covers it."""
    best, depth = None, -1
    for level, names in enumerate(FLOORS):
        for name in names:
            covers = module == name or (name and module.startswith(name + "."))
            if covers and len(name) > depth:
                best, depth = level, len(name)
    assert best is not None, f"minidnn.{module} has no floor in tests/test_layering.py"
    return best


def _module_name(path: pathlib.Path) -> tuple[str, str]:
    """(module, package) relative to minidnn of a file under minidnn/ or models/."""
    top = "minidnn" if path.is_relative_to(ROOT / "minidnn") else "models"
    parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
    if top == "models":
        parts = ["models"] + parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    module = ".".join(parts)
    return module, module if is_package else ".".join(parts[:-1])


def _imports(path: pathlib.Path):
    """The minidnn modules a file imports (relative to the package), function bodies too."""
    _, package = _module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("minidnn"):
                target = node.module[len("minidnn."):] if node.module != "minidnn" else ""
            else:
                continue
            for alias in node.names:     # `from . import x` imports the module x
                sub = f"{target}.{alias.name}" if target else alias.name
                known = (ROOT / "minidnn" / (sub.replace(".", "/") + ".py")).exists() or \
                    (ROOT / "minidnn" / sub.replace(".", "/")).is_dir() or sub == "models"
                yield sub if known else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("minidnn."):
                    yield alias.name[len("minidnn."):]


def test_no_import_runs_back_up_the_house():
    files = sorted((ROOT / "minidnn").rglob("*.py")) + sorted((ROOT / "models").rglob("*.py"))
    upward = []
    for path in files:
        module, _ = _module_name(path)
        for target in _imports(path):
            if target != module and floor_of(target) > floor_of(module):
                upward.append(f"minidnn.{module} (floor {floor_of(module)}) imports "
                              f"minidnn.{target} (floor {floor_of(target)})")
    assert not upward, "imports up the house:\n" + "\n".join(upward)


def test_the_floors_see_an_upward_import():
    """The walk above finds imports: a module of the kernels importing the executor would be
    seen (this guards the test itself)."""
    assert floor_of("kernels.cuda_pool") < floor_of("executor") < floor_of("train")
    path = ROOT / "minidnn" / "planner" / "profile.py"
    assert "executor" in set(_imports(path))
