"""The packages of gmts form layers: each imports only the layers below it (docs/architecture.md).

Every import is checked, the lazy ones inside functions too. There is no exceptions list: a
new upward import fails here, naming the file and the import. The sizes that keep a part
readable are checked here too: no function over :data:`MAX_FUNCTION_LINES` lines, and the
trainer's loop under :data:`MAX_TRAINER_LINES` (issue 36).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gmts"

LAYERS: list[tuple[str, ...]] = [
    ("_registry", "_cache", "_progress", "configuration", "provenance"),  # generic utilities
    ("core",),  # torch only: the method
    ("rewards",),
    ("data",),
    ("sampling",),
    ("embedded",),
    ("models",),
    ("scale",),
    ("eval",),
    ("train",),
    ("analysis",),
    ("integrations",),
    ("demo",),
    ("cli",),
    ("__init__", "__main__"),  # the package's own entry points
]
LEVEL = {package: level for level, names in enumerate(LAYERS) for package in names}

MAX_FUNCTION_LINES = 80  # from the ``def`` line to the last, decorators left out
MAX_TRAINER_LINES = 300  # train/trainer.py is the loop only: a second job goes to its own module


def _package_of(path: Path) -> str:
    relative = path.relative_to(SRC)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, gmts package) of every ``gmts.<package>`` import in the file, lazy ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "gmts":  # from gmts import core, ...
                modules = [f"gmts.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "gmts" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_every_package_has_a_layer():
    packages = {_package_of(p) for p in SRC.rglob("*.py")}
    assert packages <= set(LEVEL), f"packages without a layer: {sorted(packages - set(LEVEL))}"


def test_imports_only_go_down():
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        package = _package_of(path)
        for line, target in _imports(path):
            if target == package:
                continue
            if target not in LEVEL:
                upward.append(f"{path.relative_to(SRC)}:{line} imports unknown gmts.{target}")
            elif LEVEL[target] >= LEVEL[package]:
                upward.append(
                    f"{path.relative_to(SRC)}:{line}: {package} (layer {LEVEL[package]}) imports "
                    f"gmts.{target} (layer {LEVEL[target]})"
                )
    assert not upward, "imports that do not go down a layer:\n" + "\n".join(upward)


def test_no_two_packages_import_each_other():
    """Implied by the layers; kept explicit because a cycle is the failure that matters."""
    edges: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        package = _package_of(path)
        edges.setdefault(package, set()).update(t for _, t in _imports(path) if t != package)
    cycles = sorted(
        f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, ())
    )
    assert not cycles, cycles


def test_the_checker_sees_lazy_and_from_imports(tmp_path):
    """The parser finds an import hidden in a function and a ``from gmts import x``."""
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from gmts.train.trainer import Trainer\n\nfrom gmts import core\n"
    )
    assert sorted(t for _, t in _imports(source)) == ["core", "train"]


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The gmts modules ``path`` imports at module level (lazy imports in functions left out:
    they run after every module has loaded, so they cannot close a cycle at import time).
    ``from gmts.core import distributed`` imports the submodule, not the package's body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "") > "gmts.":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gmts."))
    return found


def _module_name(path: Path) -> str:
    parts = ("gmts", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_modules():
    """No module-level import cycle between two modules (one that works only by import order,
    such as an import at the bottom of a file, is still a cycle)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    edges = {
        name: {m for m in _module_imports(path, set(modules)) if m in modules and m != name}
        for name, path in modules.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    assert not cycles, "module import cycles:\n" + "\n".join(cycles)


def _long_functions(path: Path, limit: int) -> list[tuple[int, str, int]]:
    """(line, name, lines) of every function or method in ``path`` longer than ``limit`` lines,
    counted from its ``def`` line to its last (its decorators left out)."""
    return [
        (node.lineno, node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_is_over_the_limit():
    """A function longer than a screen gets split into named steps, each with one job."""
    long = [
        f"{path.relative_to(SRC)}:{line} {name}: {lines} lines"
        for path in sorted(SRC.rglob("*.py"))
        for line, name, lines in _long_functions(path, MAX_FUNCTION_LINES)
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_trainer_is_the_loop_only():
    lines = len((SRC / "train" / "trainer.py").read_text().splitlines())
    assert lines < MAX_TRAINER_LINES, (
        f"train/trainer.py has {lines} lines (the limit: under {MAX_TRAINER_LINES}); move a part "
        "that is a second job into its own module"
    )


def test_the_length_checker_counts_from_def_to_the_last_line(tmp_path):
    """Decorators do not count; the ``def`` line and the last line do; methods are seen."""
    source = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    source.write_text(f"@decorator\ndef f():\n{body}\n\nclass C:\n    def g(self):\n        pass\n")
    assert _long_functions(source, 3) == [(2, "f", 4)]
    assert _long_functions(source, 4) == []
    assert [name for _, name, _ in _long_functions(source, 1)] == ["f", "g"]
