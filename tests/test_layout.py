"""The package's layout is its architecture: imports go downward only (src/speedrun/__init__.py).

Layers, top to bottom: the stage modules (src/speedrun/*.py: one per stage, arguments and `main`), `workflow`
(what the Snakefile calls), `training` (one run), the libraries (`data`, `model`, `optim`, `kernels`,
`analysis`, which may import one another), `support`, then `errors` and the package root. Imports are read
statically (speedrun.workflow.sources), every `speedrun` import at any depth of a module's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speedrun.workflow.sources import PACKAGE_DIR, _imported_modules, module_files

LIBRARIES = ("data", "model", "optim", "kernels", "analysis")
ROOT_MODULES = ("speedrun", "speedrun.errors")
ENTRY = ("speedrun.cli", "speedrun.__main__")          # dispatch to the stages (by name, lazily)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        name = ".".join(("speedrun",) + (parts[:-1] if parts[-1] == "__init__" else parts))
        found[name] = path
    return found


MODULES = _modules()
STAGES = sorted(m for m in MODULES if m.count(".") == 1 and not MODULES[m].name == "__init__.py"
                and m not in ROOT_MODULES + ENTRY)


def _layer(module: str) -> int:
    """0 errors and the root, 1 support, 2 the libraries, 3 training, 4 workflow, 5 the stages, 6 the CLI,
    7 ``python -m speedrun``."""
    if module in ROOT_MODULES:
        return 0
    if module in ENTRY:
        return 6 + ENTRY.index(module)
    part = module.split(".")[1]
    if part in LIBRARIES:
        return 2
    return {"support": 1, "training": 3, "workflow": 4}.get(part, 5)


def _library(module: str) -> bool:
    return _layer(module) == 2


def test_the_stage_modules_are_the_pipelines_stages():
    assert STAGES == sorted(f"speedrun.{s}" for s in ("bos_index", "bundle", "compare", "corpus", "download",
                                                        "parse", "report", "run_script", "stats", "tokenize", "train"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_downward_only(module):
    imported = {m for m in _imported_modules(MODULES[module], module) if m in MODULES} - {module}
    upward = sorted(m for m in imported if _layer(m) > _layer(module)
                    or (_layer(m) == _layer(module) and not _library(module)
                        and m.split(".")[:2] != module.split(".")[:2]))
    assert not upward, f"{module} imports {upward}, which are not below it"


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_runs_no_other_stage(stage):
    """An edit of a stage module reruns only the stages that run it (their rule inputs: module_files)."""
    others = {f"src/speedrun/{s.split('.')[1]}.py" for s in STAGES if s != stage}
    runs = {Path(p).as_posix().split("/src/speedrun/")[-1] for p in module_files(stage)}
    assert not {f"src/speedrun/{r}" for r in runs} & others, stage


def test_the_snakefiles_planning_imports_no_torch():
    """The Snakefile imports speedrun.workflow.planning while every job is planned: torch (seconds to import)
    must stay out of it (through the training settings and the data check it uses)."""
    import subprocess
    import sys

    code = "import sys, speedrun.workflow.planning, speedrun.workflow.sources; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(PACKAGE_DIR.parent), "PATH": ""})
    assert done.stdout.strip() == "False"
