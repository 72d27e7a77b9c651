"""The source files a stage runs, for Snakemake's rerun decisions.

Snakemake tracks a rule's shell command but not the Python modules that command imports
(../shared/docs/snakemake-notes.md, "Reruns"). The workflow therefore lists, as inputs of each rule, the
files of the ``speedrun`` package that the stage's module imports, directly or through other ``speedrun``
modules. An edit to the model code then reruns training and what follows it, and never the data stages.

The closure is computed statically (``ast``), so nothing is imported and torch is never loaded.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "speedrun"
PACKAGE_DIR = Path(__file__).resolve().parents[1]        # src/speedrun


def _module_file(module: str) -> Path | None:
    """The file of a ``speedrun`` module (``speedrun.a.b``), or None when it is not in the package."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _imported_modules(path: Path, module: str) -> frozenset[str]:
    """Every ``speedrun`` module that the file ``path`` (module ``module``) imports, at any depth of its code.
    Cached: the stages share most of their modules, and each file is parsed once per planning (it was 200
    parses for the 10 stages, 3.2 s of a 4-variant x 10-seed plan's 5.4 s, benchmarks/plan_fineweb.py)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from speedrun.model import gpt` imports a submodule.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(m for m in found if m == PACKAGE or m.startswith(PACKAGE + "."))


@functools.cache
def module_files(module: str) -> tuple[str, ...]:
    """Sorted paths of the package files that ``module`` runs: itself and every ``speedrun`` module it imports.

    Package ``__init__.py`` files of every imported module's parents are included (Python runs them).
    Paths are relative to the current directory when the package lies below it, else absolute.

    Raises:
        ValueError: ``module`` is not a module of the ``speedrun`` package.
    """
    start = _module_file(module)
    if start is None:
        raise ValueError(f"{module!r} is not a module of the {PACKAGE} package (looked in {PACKAGE_DIR})")
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # the parents' __init__ run first
            parent = ".".join(parts[:depth])
            path = _module_file(parent)
            if path is None or parent in seen:
                continue
            seen[parent] = path
            todo.extend(_imported_modules(path, parent) - seen.keys())
    return tuple(sorted(_display(p) for p in seen.values()))


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
