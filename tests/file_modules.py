"""Load a Python file by its path as a module: the benchmark scripts and the tests' helper files.

The tests are not a package and pytest runs with ``--import-mode=importlib``, so a test file
reaches a helper file (``tests/train/_tiny.py``, ``benchmarks/run.py``, ...) by its path:
``_tiny = load_module(HERE / "_tiny.py", "_tiny")``. tests/conftest.py makes this module
importable as ``from file_modules import load_module``. Not a test module.

The scripts that tests run in a subprocess (``tests/train/_train_script.py``, ...) and the
helper files also run as scripts (``python tests/conformance/_matrix.py``) run without
tests/conftest.py and so load their files themselves.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(
    path: Path, name: str, *, register: bool = False, reuse: bool = False
) -> ModuleType:
    """Execute the file at ``path`` as a new module called ``name`` and return it.

    ``register`` puts the module in ``sys.modules[name]`` before its code runs: a file that
    defines dataclasses needs it, as ``dataclasses`` looks the class's module up in
    ``sys.modules`` while the file executes. The module stays there afterwards. Without it
    the module is not in ``sys.modules`` and each call executes the file afresh.

    ``reuse`` returns ``sys.modules[name]`` where a module of that name is already there (a
    file loaded once and shared; with ``register`` the first call puts it there), and loads
    the file only where none is.
    """
    if reuse and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
